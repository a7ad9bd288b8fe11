"""Sensor gateways: a fog server with ``gateways=True`` spawns no device groups; external
``gnnserve fog upload`` processes feed each round (the same framing and codec), and the round
equals plain full-graph inference on what they sent. Bad gateway input exits 2, an unreachable
fog 1."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from gnnserve.cli import main
from gnnserve.deploy.fog.service import FogService, NodeSpec
from gnnserve.errors import InvalidInputError
from gnnserve.graph.base import GraphStore
from tests.deploy.fog.test_service import _model, _readings, _reference
from tests.deploy.fog.test_service import graph as graph  # noqa: F401 - the module fixture

GNNSERVE = str(Path(sys.executable).with_name("gnnserve"))
NODES = [NodeSpec("a", None, "wifi"), NodeSpec("b", None, "wifi")]


def _upload(plan: list[dict], readings: np.ndarray, round_id: int, tmp: Path) -> list:  # type: ignore[type-arg]
    """One gateway process per device group of ``plan``, each sending its rows of round
    ``round_id``."""
    procs = []
    for group in plan:
        rows = tmp / f"r{round_id}_{group['fog']}.npy"
        np.save(rows, readings[group["vertices"]])
        argv = [GNNSERVE, "fog", "upload", "--to", group["to"], "--readings", str(rows)]
        argv += ["--round", str(round_id), "--offset", str(group["offset"])]
        if group["bits"] is not None:
            np.save(tmp / f"bits_{group['fog']}.npy", group["bits"])
            argv += ["--bits", str(tmp / f"bits_{group['fog']}.npy")]
        procs.append(subprocess.Popen(argv, stdout=subprocess.PIPE, text=True))
    return procs


@pytest.mark.distributed
def test_gateway_uploads_feed_exact_rounds(graph: GraphStore, ray_instance, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    model = _model()
    with FogService(
        model, graph, _readings(1), NODES, "strawman", gateways=True,
        testbed=False,
    ) as svc:  # fmt: skip
        assert svc.fleet is None and not svc.adaptive
        plan = svc.gateway_plan()
        owned = np.sort(np.concatenate([g["vertices"] for g in plan]))
        np.testing.assert_array_equal(owned, np.arange(graph.num_nodes))
        for round_id in (1, 2):
            readings = _readings(10 + round_id)
            procs = _upload(plan, readings, round_id, tmp_path)
            report = svc.round()
            assert [p.wait(timeout=60) for p in procs] == [0, 0]
            want = _reference(model, graph, readings)
            np.testing.assert_allclose(report.logits, want, atol=1e-5)
        with pytest.raises(InvalidInputError, match="from the gateways"):
            svc.round(readings)
    with pytest.raises(InvalidInputError, match="fixed placement"):
        FogService(model, graph, _readings(1), NODES, "fograph", gateways=True, adaptive=True)


def test_bad_gateway_input_exits_2_and_an_unreachable_fog_1(tmp_path: Path) -> None:
    good = tmp_path / "r.npy"
    np.save(good, np.zeros((4, 3), np.float32))
    args = ["fog", "upload", "--round", "1", "--readings", str(good)]
    assert main([*args, "--to", "no-port"]) == 2
    np.save(tmp_path / "nan.npy", np.full((4, 3), np.nan, np.float32))
    assert main([*args[:-1], str(tmp_path / "nan.npy"), "--to", "127.0.0.1:9"]) == 2
    assert main([*args, "--to", "127.0.0.1:9", "--bits", str(good)]) == 2  # 2-d widths
    assert main([*args, "--to", "127.0.0.1:1"]) == 1  # nothing listens there
