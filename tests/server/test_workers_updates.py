"""`serve --workers 2 --update-log`: one log for both workers. A write through one worker is
read through the other at the version it returned (``min_version``), and the answers equal
full-graph inference on the updated graph; a kill -9 of a worker loses no acknowledged batch
while the other keeps serving; a second server on the log is refused while they run."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import psutil
import pytest
import torch

from gnnserve.cli import main
from gnnserve.demo import start_server, stop_server, wait_ready
from gnnserve.dynamic.wal import replay
from gnnserve.features import open_feature_store
from gnnserve.graph import open_graph_store
from gnnserve.models.checkpoint import load_checkpoint
from gnnserve.ports import free_port
from tests.embeddings.reference import layer_outputs
from tests.server.test_workers import _workers

ASKED = [0, 7, 100, 1999]
MODEL = "sage"


@pytest.fixture(scope="module")
def shared_log(
    small_store: Path, small_ckpt: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, psutil.Process, Path]]:
    """`serve --workers 2 --update-log LOG --fanouts=-1,-1`: (URL, supervisor, LOG)."""
    log = tmp_path_factory.mktemp("shared") / "u.log"
    port = free_port()
    flags = ["--workers", "2", "--update-log", str(log), "--fsync", "never", "--fanouts=-1,-1"]
    flags += ["--name", MODEL]
    proc = start_server(small_store, small_ckpt, port, *flags)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, proc, timeout_s=180)
        yield url, psutil.Process(proc.pid), log
    finally:
        assert stop_server(proc, timeout_s=60) == 0


def _post(url: str, path: str, body: dict[str, object]) -> httpx.Response:
    return httpx.post(f"{url}{path}", json=body, timeout=60)


def _reference(store: Path, ckpt: Path, added: list[tuple[int, int]]) -> np.ndarray:
    """Full-graph class probabilities with the edges ``added`` (src, dst) to the store's."""
    graph = open_graph_store(store)
    indptr, indices = graph.csr()
    dst = np.repeat(np.arange(graph.num_nodes), np.diff(indptr))
    src = np.concatenate([np.asarray(indices, np.int64), [s for s, _ in added]])
    dst = np.concatenate([dst, [d for _, d in added]])
    x = open_feature_store(store).get(np.arange(graph.num_nodes))
    model = load_checkpoint(ckpt).model.eval()
    logits = layer_outputs(model, x, torch.from_numpy(np.stack([src, dst]).astype(np.int64)))
    return torch.softmax(logits[-1], 1).numpy()


def test_a_write_through_one_worker_is_read_through_each_at_its_version(
    shared_log: tuple[str, psutil.Process, Path], small_store: Path, small_ckpt: Path
) -> None:
    url, supervisor, _ = shared_log
    workers = _workers(supervisor)
    (_, first), (_, second) = workers[0], workers[1]
    added = [(1500, 7), (1501, 7), (42, 100), (43, 1999)]
    r = _post(first, "/v1/graph/updates", {"ops": [
        {"op": "add_edge", "src": s, "dst": d} for s, d in added]})  # fmt: skip
    assert r.status_code == 200, r.text
    seq, version = r.json()["seq"], r.json()["graph_version"]
    want = _reference(small_store, small_ckpt, added)[ASKED]
    for base in (second, first):
        for min_version in (seq, version):
            body = {"nodes": ASKED, "output": "probs", "min_version": min_version}
            answer = _post(base, "/v1/predict", body).json()
            assert answer["graph_version"] == version  # no later write in this test
            np.testing.assert_allclose(answer["predictions"], want, atol=1e-5)
        oip = {"inputs": [{"name": "node_ids", "datatype": "INT64", "shape": [len(ASKED)],
               "data": ASKED}], "outputs": [{"name": "probs"}],
               "parameters": {"min_version": seq}}  # fmt: skip
        answer = _post(base, f"/v2/models/{MODEL}/infer", oip).json()
        np.testing.assert_allclose(np.reshape(answer["outputs"][0]["data"], want.shape), want,
                                   atol=1e-5)  # fmt: skip
        got = httpx.get(f"{base}/v1/graph/neighbors/7", params={"min_version": str(seq)}).json()
        assert {1500, 1501} <= set(got["in_neighbors"])
    ahead = _post(second, "/v1/predict", {"nodes": [1], "min_version": seq + 1000})
    assert ahead.status_code == 400 and ahead.json()["error"]["field"] == "min_version"
    foreign = _post(second, "/v1/predict", {"nodes": [1], "min_version": "0000abcd.1"})
    assert foreign.status_code == 400 and "not a version of this store" in foreign.text


def test_a_killed_worker_loses_no_acknowledged_batch(
    shared_log: tuple[str, psutil.Process, Path],
) -> None:
    """Writes through the shared port while worker 1 is killed: every acknowledged edge is in
    the log once and read by both workers (the restarted one too) at the last acknowledged
    version; the writes to the live worker all succeed."""
    url, supervisor, log = shared_log
    workers = _workers(supervisor)
    victim, _ = workers[1]
    acked: list[tuple[int, int, int]] = []  # (src, dst, seq)
    stop = threading.Event()

    def write(base: str, k: int, strict: bool) -> None:
        with httpx.Client(timeout=60) as client:
            for i in range(200):
                if stop.is_set():
                    return
                src, dst = 300 + k, 1000 + i
                body = {"ops": [{"op": "add_edge", "src": src, "dst": dst}]}
                try:
                    r = client.post(f"{base}/v1/graph/updates", json=body)
                except httpx.HTTPError:
                    assert not strict, "the live worker failed a write"
                    continue
                if r.status_code == 200:
                    acked.append((src, dst, r.json()["seq"]))
                else:
                    assert not strict, r.text

    live = threading.Thread(target=write, args=(workers[0][1], 0, True))
    either = threading.Thread(target=write, args=(url, 1, False))
    live.start()
    either.start()
    time.sleep(0.3)
    os.kill(victim.pid, signal.SIGKILL)
    live.join(120)
    either.join(120)
    stop.set()
    deadline = time.monotonic() + 120  # the supervisor starts worker 1 again
    while not (1 in (w := _workers(supervisor)) and w[1][0].pid != victim.pid
               and httpx.get(f"{url}/v2/health/ready").status_code == 200):  # fmt: skip
        assert time.monotonic() < deadline, "worker 1 was not replaced"
        time.sleep(0.2)
    last = max(seq for _, _, seq in acked)
    logged = {seq for seq, _ in replay(log, truncate=False)}
    assert {seq for _, _, seq in acked} <= logged and len(acked) >= 200
    for _, base in _workers(supervisor).values():
        for dst in sorted({d for _, d, _ in acked})[::25]:
            got = httpx.get(f"{base}/v1/graph/neighbors/{dst}",
                            params={"min_version": str(last)}).json()  # fmt: skip
            want = {s for s, d, _ in acked if d == dst}
            assert want <= set(got["in_neighbors"]), (dst, got)


def test_a_second_server_on_the_log_is_refused(
    shared_log: tuple[str, psutil.Process, Path],
    small_store: Path,
    small_ckpt: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    _, _, log = shared_log
    argv = ["serve", "--store", str(small_store), "--model", str(small_ckpt)]
    assert main([*argv, "--update-log", str(log), "--port", str(free_port())]) == 2
    assert "in use by another process" in capsys.readouterr().err
