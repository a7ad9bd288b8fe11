"""gnnserve faas profile: trains and saves the memory predictor that inference instances load."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from gnnserve.cli import main
from gnnserve.data.blobs import open_blobs
from gnnserve.deploy.faas import profile
from gnnserve.deploy.faas.function import FunctionSpec
from gnnserve.deploy.faas.profile import profile_predictor, query_degrees
from gnnserve.graph.remote import RemoteCSR
from gnnserve.models.memory import MemoryPredictor, request_features
from gnnserve.sampling.ondemand import OnDemandSampler
from tests.conftest import make_checkpoint


def test_profile_saves_a_predictor_for_the_model(small_store: Path, tmp_path: Path) -> None:
    ckpt = make_checkpoint(small_store, tmp_path / "gcn", arch="gcn")
    report = profile_predictor(FunctionSpec(small_store.as_uri(), str(ckpt), (5, 5)), requests=40)
    assert report["train"] == 30 and report["held_out"] == 10
    assert 0 <= report["mean_rel_error"] <= report["max_rel_error"]
    assert report["n_big"] + report["n_small"] == 10 and report["fanouts"] == [5, 5]
    predictor = MemoryPredictor.load(ckpt, fanouts=(5, 5))
    sub = OnDemandSampler(RemoteCSR(open_blobs(str(small_store))), [5, 5]).sample(np.array([1]))
    assert np.isfinite(predictor.predict(request_features(sub.subgraph))).all()


def test_profile_command_prints_the_report(
    small_store: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ckpt = make_checkpoint(small_store, tmp_path / "sage")
    argv = ["faas", "profile", "--remote", str(small_store), "--model", str(ckpt)]
    assert main([*argv, "--fanouts", "4,4", "--requests", "24"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert Path(report["saved"]).exists() and report["held_out"] == 6
    # serving with other fanouts: refused before the store (absent here) is even opened
    serve = ["serve", "--deploy", "faas", "--store", str(tmp_path / "absent"), "--model"]
    assert main([*serve, str(ckpt), "--fanouts", "-1,-1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "profiled with fanouts [4, 4]" in err, err
    shutil.rmtree(ckpt)
    assert main([*argv, "--requests", "24"]) == 2  # missing checkpoint: a clear error, exit 2


def test_query_degrees_are_read_in_chunks_and_equal_the_graph(
    small_store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gnnserve.graph import open_graph_store

    indptr = open_graph_store(small_store).csr()[0]
    remote = RemoteCSR(open_blobs(str(small_store)))
    nodes = np.unique(np.random.default_rng(0).integers(0, indptr.size - 1, 300))
    calls: list[int] = []
    fetch = remote.fetch_degrees
    monkeypatch.setattr(remote, "fetch_degrees", lambda n: calls.append(n.size) or fetch(n))
    monkeypatch.setattr(profile, "DEGREE_CHUNK", 64)
    np.testing.assert_array_equal(query_degrees(remote, nodes), np.diff(indptr)[nodes])
    assert calls and max(calls) <= 64 and sum(calls) == nodes.size
    assert query_degrees(remote, nodes[:0]).size == 0
