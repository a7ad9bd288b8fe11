"""`serve --workers 2`: two real worker processes on one port answer exactly as one process,
hold the store once in the page cache (asserted from /proc/<pid>/smaps), report /metrics and
readiness for both, survive a kill -9 of one, and stop cleanly; refused where they cannot run."""

from __future__ import annotations

import os
import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gnnserve.cli import main
from gnnserve.demo import start_server, stop_server, wait_ready
from gnnserve.ports import free_port
from gnnserve.server.workers import PEERS_ENV, SLOT_ENV, merge_expositions

NODES = list(range(0, 2000, 37))
GRPC_PORT = free_port()


@pytest.fixture(scope="module")
def two_workers(small_store: Path, small_ckpt: Path) -> Iterator[tuple[str, psutil.Process]]:
    """A `serve --workers 2` (model 'sage', fanouts [-1, -1], gRPC on ``GRPC_PORT``): (URL,
    supervisor process)."""
    port = free_port()
    flags = ["--workers", "2", "--name", "sage", "--fanouts=-1,-1", "--max-nodes", "64"]
    flags += ["--grpc-port", str(GRPC_PORT)]
    proc = start_server(small_store, small_ckpt, port, *flags)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, proc, timeout_s=180)
        yield url, psutil.Process(proc.pid)
    finally:
        assert stop_server(proc, timeout_s=60) == 0


def _workers(supervisor: psutil.Process) -> dict[int, tuple[psutil.Process, str]]:
    """slot index -> (worker process, its private URL), read from the workers' environment."""
    out = {}
    for child in supervisor.children():
        try:
            env = child.environ()
        except psutil.Error:  # gone, or a zombie not yet reaped
            continue
        if SLOT_ENV in env:
            index = int(env[SLOT_ENV].split("/")[0])
            port = env[PEERS_ENV].split(",")[index]
            out[index] = (child, f"http://127.0.0.1:{port}")
    return out


def _predict(url: str, **body: object) -> list[object]:
    r = httpx.post(f"{url}/v1/predict", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()["predictions"]  # type: ignore[no-any-return]


def test_each_worker_answers_as_one_process(
    two_workers: tuple[str, psutil.Process], live_server: str
) -> None:
    """Full-neighbourhood and fixed-seed sampled answers of each worker (reached on its own
    port) equal those of the one-process server over the same store and model."""
    url, supervisor = two_workers
    workers = _workers(supervisor)
    assert sorted(workers) == [0, 1]
    for chunk in (NODES[:20], NODES[20:40]):
        want = _predict(live_server, nodes=chunk, output="probs")
        sampled = _predict(live_server, nodes=chunk, fanouts=[3, 2], seed=5, output="probs")
        for _, private in workers.values():
            np.testing.assert_array_equal(_predict(private, nodes=chunk, output="probs"), want)
            got = _predict(private, nodes=chunk, fanouts=[3, 2], seed=5, output="probs")
            np.testing.assert_array_equal(got, sampled)
    assert _predict(url, nodes=[5]) == _predict(live_server, nodes=[5])


def test_metrics_and_readiness_speak_for_every_worker(
    two_workers: tuple[str, psutil.Process],
) -> None:
    url, supervisor = two_workers
    counts = {}
    for index, (_, private) in _workers(supervisor).items():
        before = _count(httpx.get(f"{private}/metrics?local=1").text, None)
        for _ in range(index + 2):  # 2 requests to worker 0, 3 to worker 1
            _predict(private, nodes=[1])
        counts[str(index)] = before + index + 2
    text = httpx.get(f"{url}/metrics").text  # through whichever worker accepts it
    for worker, want in counts.items():
        assert _count(text, worker) == want
    assert httpx.get(f"{url}/v2/health/ready").status_code == 200


def test_grpc_calls_reach_the_workers_on_one_port(
    two_workers: tuple[str, psutil.Process], live_server: str
) -> None:
    """Every worker listens on the gRPC port too: fresh connections are answered, as HTTP
    answers, and the merged metrics count each call once."""
    import tritonclient.grpc as triton

    url, _ = two_workers
    before = _count(httpx.get(f"{url}/metrics").text, None, "grpc_infer")
    for _ in range(6):
        client = triton.InferenceServerClient(url=f"127.0.0.1:{GRPC_PORT}")
        ids = triton.InferInput("node_ids", [3], "INT64")
        ids.set_data_from_numpy(np.array(NODES[:3], dtype=np.int64))
        got = client.infer("sage", [ids]).as_numpy("label")
        assert got.tolist() == _predict(live_server, nodes=NODES[:3])
        client.close()
    assert _count(httpx.get(f"{url}/metrics").text, None, "grpc_infer") == before + 6


def _count(exposition: str, worker: str | None, endpoint: str = "predict") -> float:
    """Requests to ``endpoint`` counted in ``exposition`` (every worker's, or ``worker``'s)."""
    for family in text_string_to_metric_families(exposition):
        if family.name == "gnnserve_requests":
            return sum(
                s.value
                for s in family.samples
                if s.name.endswith("_total")
                and s.labels.get("endpoint") == endpoint
                and (worker is None or s.labels.get("worker") == worker)
            )
    return 0.0


def _store_mappings(pid: int, store: Path) -> dict[str, dict[str, int]]:
    """Rss / Pss (kB) of each file of ``store`` mapped in process ``pid``."""
    out: dict[str, dict[str, int]] = {}
    current = None
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        head = line.split()
        if head and re.fullmatch(r"[0-9a-f]+-[0-9a-f]+", head[0]):  # a mapping (5 or 6 fields)
            path = head[5] if len(head) >= 6 else ""
            current = (
                out.setdefault(path, {"Rss": 0, "Pss": 0}) if path.startswith(str(store)) else None
            )
        elif current is not None and head and head[0].rstrip(":") in ("Rss", "Pss"):
            current[head[0].rstrip(":")] += int(head[1])
    return out


def test_the_store_is_mapped_once_for_both_workers(
    two_workers: tuple[str, psutil.Process], small_store: Path
) -> None:
    """Both workers map the store's files (no private copy); the pages both touched are shared:
    the workers' Pss of those files sums to at most 1.1x the largest Rss of one of them."""
    _, supervisor = two_workers
    workers = _workers(supervisor)
    for _, private in workers.values():
        _predict(private, nodes=NODES[:60], output="probs")  # the same pages, through both
    maps = {i: _store_mappings(proc.pid, small_store.resolve()) for i, (proc, _) in workers.items()}
    features = [f for f in maps[0] if Path(f).name.startswith("features")]
    assert features, sorted(maps[0])
    for name in features:
        rss = [maps[i][name]["Rss"] for i in workers]
        pss = [maps[i][name]["Pss"] for i in workers]
        assert min(rss) > 0, (name, rss)
        assert sum(pss) <= 1.1 * max(rss) + 8, (name, rss, pss)  # + 8 kB: page rounding


def test_a_killed_worker_is_replaced_while_the_other_serves(
    two_workers: tuple[str, psutil.Process],
) -> None:
    url, supervisor = two_workers
    victim, _ = _workers(supervisor)[1]
    os.kill(victim.pid, signal.SIGKILL)
    answered = [httpx.post(f"{url}/v1/predict", json={"nodes": [2]}).status_code for _ in range(10)]
    assert answered == [200] * 10
    deadline = time.monotonic() + 120
    while True:
        workers = _workers(supervisor)
        if 1 in workers and workers[1][0].pid != victim.pid:
            ready = httpx.get(f"{url}/v2/health/ready").status_code == 200
            if ready:
                break
        assert time.monotonic() < deadline, "worker 1 was not replaced"
        time.sleep(0.2)


@pytest.mark.parametrize(
    ("flags", "problem"),
    [
        (["--deploy", "dgs"], "dgs deployment"),
        (["--port", "0"], "share one port"),
    ],
)
def test_workers_are_refused_where_they_cannot_run(
    flags: list[str], problem: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["serve", "--workers", "2", *flags]) == 2
    assert problem in capsys.readouterr().err


def test_merged_metrics_label_each_workers_samples() -> None:
    one = '# HELP x_total n\n# TYPE x_total counter\nx_total{a="1"} 2.0\n'
    two = '# HELP x_total n\n# TYPE x_total counter\nx_total{a="1"} 5.0\n'
    merged = merge_expositions([(1, two), (0, one)]).decode()
    samples = [s for f in text_string_to_metric_families(merged) for s in f.samples]
    assert {(s.labels["worker"], s.value) for s in samples} == {("0", 2.0), ("1", 5.0)}
    assert merged.count("# TYPE x_total counter") == 1
