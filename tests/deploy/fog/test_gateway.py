"""Sensor gateways: `serve --deploy fog --fog-gateways DIR` spawns no device groups and writes
the gateways' plan; external ``gnnserve fog upload`` processes feed each round (the same framing
and codec), and the answers equal plain full-graph inference on what they sent. Bad gateway
input exits 2, an unreachable fog 1."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch

from gnnserve.cli import main
from gnnserve.deploy.fog.service import FogService, NodeSpec
from gnnserve.errors import InvalidInputError
from gnnserve.graph import open_graph_store
from gnnserve.graph.base import GraphStore
from gnnserve.models.checkpoint import load_checkpoint
from tests.deploy.fog.test_service import _model, _readings
from tests.deploy.fog.test_service import graph as graph  # noqa: F401 - the module fixture
from tests.deploy.servers import metric, predict, served
from tests.embeddings.reference import layer_outputs

# the servers join the session's Ray instance (tests/deploy/servers.py)
pytestmark = pytest.mark.usefixtures("ray_instance")

GNNSERVE = str(Path(sys.executable).with_name("gnnserve"))
NODES = [NodeSpec("a", None, "wifi"), NodeSpec("b", None, "wifi")]


def _command(group: dict, readings: np.ndarray, round_id: int, tmp: Path) -> list[str]:  # type: ignore[type-arg]
    """The plan's command for ``group``'s rows of ``readings`` as round ``round_id``."""
    rows = tmp / f"r{round_id}_{group['group']}.npy"
    np.save(rows, readings[np.load(group["vertices"])])
    fill = {"{readings}": str(rows), "{round}": str(round_id), "gnnserve": GNNSERVE}
    return [fill.get(a, a) for a in group["command"]]


def _upload(plan: dict, readings: np.ndarray, round_id: int, tmp: Path) -> list:  # type: ignore[type-arg]
    """One gateway process per group of the written ``plan`` (plan.json), each running the
    plan's command for its rows of round ``round_id``."""
    return [
        subprocess.Popen(_command(group, readings, round_id, tmp), stdout=subprocess.PIPE)
        for group in plan["groups"]
    ]


def _refused(argv: list[str]) -> str:
    """The stderr of a ``gnnserve fog upload`` that must exit 2 (a refused upload)."""
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done
    return done.stderr


def _reference_probs(store: Path, ckpt: Path, x: np.ndarray) -> np.ndarray:
    model = load_checkpoint(ckpt).model.eval()
    graph = open_graph_store(store)
    indptr, indices = graph.csr()
    dst = np.repeat(np.arange(graph.num_nodes), np.diff(indptr))
    edges = torch.from_numpy(np.stack([np.asarray(indices, np.int64), dst]))
    logits = layer_outputs(model, torch.from_numpy(x), edges)[-1]
    return torch.softmax(logits, 1).numpy()


def _probs_once_served(base: str, nodes: list[int], want: np.ndarray) -> np.ndarray:
    """The answers for ``nodes`` once they equal ``want`` (rounds run as uploads complete),
    or the last ones after 60 s."""
    deadline = time.monotonic() + 60
    while True:
        got = np.asarray(predict(base, {"nodes": nodes, "output": "probs"})["predictions"])
        if np.allclose(got, want, atol=1e-5) or time.monotonic() > deadline:
            return got
        time.sleep(0.2)


@pytest.mark.slow
@pytest.mark.distributed
def test_served_rounds_come_from_the_gateways_of_the_written_plan(
    small_store: Path, small_ckpt: Path, tmp_path: Path
) -> None:
    """`serve --deploy fog --fog-gateways DIR`: 503 until a round arrives; then every answer is
    full-graph inference on the readings the gateways (external `gnnserve fog upload`
    processes, run from plan.json) sent, round after round. Between two groups' uploads of
    round 3, a stale round 1 and one group's readings sent to the other's fog are refused
    (exit 2, saying why) and round 3 runs on the readings the plan's groups sent."""
    nodes = tmp_path / "nodes.yaml"
    nodes.write_text("nodes:\n  - {name: a, link: wifi}\n  - {name: b, link: 5g}\n")
    plan_dir = tmp_path / "gateways"
    flags = [
        "--deploy",
        "fog",
        "--nodes",
        str(nodes),
        "--fog-codec",
        "lossless",
        "--timeout-s",
        "2",
        "--fanouts=-1,-1",
    ]
    with served(
        small_store, small_ckpt, *flags, "--fog-gateways", str(plan_dir), join_ray=True
    ) as fog:
        r = httpx.post(f"{fog}/v1/predict", json={"nodes": [1]}, timeout=30)  # 2 s deadline
        assert r.status_code == 503 and r.json()["error"]["field"] == "fog_gateways"
        plan = json.loads((plan_dir / "plan.json").read_text())
        owned = np.sort(np.concatenate([np.load(g["vertices"]) for g in plan["groups"]]))
        np.testing.assert_array_equal(owned, np.arange(owned.size))
        asked = [0, 5, 1999, 5]
        rng = np.random.default_rng(7)
        for round_id in (1, 2):
            readings = rng.standard_normal((owned.size, 16)).astype(np.float32)
            procs = _upload(plan, readings, round_id, tmp_path)
            assert [p.wait(timeout=60) for p in procs] == [0] * len(procs)
            want = _reference_probs(small_store, small_ckpt, readings)[asked]
            np.testing.assert_allclose(_probs_once_served(fog, asked, want), want, atol=1e-5)
        first, second = plan["groups"]
        third = rng.standard_normal((owned.size, 16)).astype(np.float32)
        other = rng.standard_normal((owned.size, 16)).astype(np.float32)
        done = subprocess.run(_command(first, third, 3, tmp_path), timeout=60)
        assert done.returncode == 0
        assert "stale" in _refused(_command(first, other, 1, tmp_path))
        misdirected = _command(second, other, 3, tmp_path)
        misdirected[misdirected.index("--to") + 1] = first["to"]
        assert "does not upload to this fog" in _refused(misdirected)
        assert subprocess.run(_command(second, third, 3, tmp_path), timeout=60).returncode == 0
        want = _reference_probs(small_store, small_ckpt, third)[asked]
        np.testing.assert_allclose(_probs_once_served(fog, asked, want), want, atol=1e-5)
        assert metric(fog, "gnnserve_deploy_fog_rounds") == 3


def test_gateway_rounds_need_gateways_and_a_fixed_placement(graph: GraphStore) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(InvalidInputError, match="fixed placement"):
        FogService(_model(), graph, _readings(1), NODES, "fograph", gateways=True, adaptive=True)


def test_bad_gateway_input_exits_2_and_an_unreachable_fog_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Bad input exits 2 with ``error:`` naming the argument, before anything is sent (the
    port given has no listener: reaching it would exit 1); a fog that cannot be reached, or a
    peer that is no fog receiver, exits 1."""
    good = tmp_path / "r.npy"
    np.save(good, np.zeros((4, 3), np.float32))
    huge = tmp_path / "huge.npy"  # a header claiming 10^12 rows over 48 bytes of data
    with huge.open("wb") as out:
        header = {"descr": "<f4", "fortran_order": False, "shape": (10**12, 3)}
        np.lib.format.write_array_header_1_0(out, header)
        out.write(np.zeros((4, 3), np.float32).tobytes())
    args = ["fog", "upload", "--round", "1", "--readings", str(good)]
    np.save(tmp_path / "nan.npy", np.full((4, 3), np.nan, np.float32))
    cases = [
        ([*args, "--to", "no-port"], "--to"),
        ([*args[:-1], str(tmp_path / "nan.npy"), "--to", "127.0.0.1:1"], "readings"),
        ([*args, "--to", "127.0.0.1:1", "--bits", str(good)], "bits"),  # 2-d widths
        ([*args[:-1], str(huge), "--to", "127.0.0.1:1"], "--readings"),
        ([*args[:-1], str(tmp_path), "--to", "127.0.0.1:1"], "--readings"),  # a directory
        ([*args, "--to", "127.0.0.1:1", "--round", str(2**70)], "--round"),
        ([*args, "--to", "127.0.0.1:1", "--chunks", "1000000000"], "--chunks"),
    ]
    for argv, named in cases:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.startswith("error:") and named in err, (argv, err)
    assert main([*args, "--to", "127.0.0.1:1"]) == 1  # nothing listens there
    server = socket.create_server(("127.0.0.1", 0))  # takes the upload, answers nothing
    threading.Thread(target=lambda: server.accept()[0].recv(1 << 16), daemon=True).start()
    assert main([*args, "--to", f"127.0.0.1:{server.getsockname()[1]}"]) == 1
    assert "did not acknowledge" in capsys.readouterr().err
    server.close()
