"""Graph updates over HTTP against real server processes: durability across kill -9, errors."""

from __future__ import annotations

import json
import re
import signal
import threading
from pathlib import Path

import httpx
import numpy as np
import pytest

from gnnserve.demo import start_server, stop_server, wait_ready
from gnnserve.graph import open_graph_store
from gnnserve.ports import free_port


def _start(store: Path, ckpt: Path, log: Path):  # type: ignore[no-untyped-def]
    port = free_port()
    proc = start_server(store, ckpt, port, "--update-log", str(log), "--fanouts=-1,-1")
    base = f"http://127.0.0.1:{port}"
    wait_ready(base, proc)
    return proc, base


def _fresh_edges(store: Path, count: int) -> list[tuple[int, int]]:
    graph = open_graph_store(store)
    rng = np.random.default_rng(7)
    out: set[tuple[int, int]] = set()
    while len(out) < count:
        u, v = (int(x) for x in rng.integers(0, graph.num_nodes, 2))
        if u != v and u not in graph.neighbors(v):
            out.add((u, v))
    return sorted(out)


@pytest.mark.slow
def test_acknowledged_updates_survive_kill_9_exactly_once(
    small_store, small_ckpt, tmp_path
) -> None:
    log = tmp_path / "updates.log"
    edges = _fresh_edges(small_store, 1000)
    batches = [edges[i : i + 5] for i in range(0, len(edges), 5)]
    proc, base = _start(small_store, small_ckpt, log)
    acked: list[int] = []
    enough = threading.Event()

    def client() -> None:
        with httpx.Client(timeout=10) as c:
            for i, batch in enumerate(batches):
                ops = [{"op": "add_edge", "src": u, "dst": v} for u, v in batch]
                try:
                    r = c.post(f"{base}/v1/graph/updates", json={"ops": ops})
                except httpx.HTTPError:
                    return  # the server died mid-request: this batch was never acknowledged
                assert r.status_code == 200, r.text
                assert r.json()["seq"] == i + 1
                acked.append(i)
                if len(acked) == 40:
                    enough.set()

    thread = threading.Thread(target=client)
    thread.start()
    assert enough.wait(60)
    proc.send_signal(signal.SIGKILL)  # no shutdown, no flush: mid-stream
    proc.wait(10)
    thread.join(30)
    assert len(acked) >= 40

    proc, base = _start(small_store, small_ckpt, log)
    # one client for the ~400 reads below: a client per call spent ~20 ms of CPU on each
    # call's TLS context (8 s of this test)
    try:
        with httpx.Client(base_url=base, timeout=10) as c:
            version = c.post("/v1/predict", json={"nodes": [0]}).json()["graph_version"]
            seq = int(version.rsplit(".", 1)[1])
            assert len(acked) <= seq <= len(acked) + 1  # plus at most the one in flight
            for i in acked:
                for u, v in batches[i]:
                    got = c.get(f"/v1/graph/neighbors/{v}").json()["in_neighbors"]
                    assert got.count(u) == 1, (u, v, got)
            for i in range(seq, len(batches)):  # never logged: absent
                u, v = batches[i][0]
                assert u not in c.get(f"/v1/graph/neighbors/{v}").json()["in_neighbors"]
    finally:
        stop_server(proc)


@pytest.mark.slow
def test_updates_api_versions_and_rejections(small_store, small_ckpt, tmp_path) -> None:
    proc, base = _start(small_store, small_ckpt, tmp_path / "log")
    try:
        before = httpx.post(f"{base}/v1/predict", json={"nodes": [5], "output": "probs"}).json()
        r = httpx.post(
            f"{base}/v1/graph/updates",
            json={
                "ops": [
                    {"op": "add_node", "features": [3.0] * 16},
                    {"op": "add_edge", "src": 2000, "dst": 5},
                ]
            },
        )
        assert r.status_code == 200, r.text
        assert r.json()["new_nodes"] == [2000] and r.json()["seq"] == 1
        after = httpx.post(f"{base}/v1/predict", json={"nodes": [5], "output": "probs"}).json()
        assert after["graph_version"] == r.json()["graph_version"] != before["graph_version"]
        assert after["predictions"] != before["predictions"]  # node 5 gained a neighbour
        assert httpx.post(f"{base}/v1/predict", json={"nodes": [2000]}).status_code == 200
        bad = httpx.post(
            f"{base}/v1/graph/updates",
            json={
                "ops": [
                    {"op": "add_edge", "src": 1, "dst": 2},
                    {"op": "delete_edge", "src": 3, "dst": 2001},
                    {"op": "add_node", "features": [1.0]},
                ]
            },
        )
        assert bad.status_code == 400
        errors = bad.json()["errors"]
        assert [e["field"] for e in errors] == ["ops[1].dst", "ops[2].features"]
        again = httpx.post(f"{base}/v1/predict", json={"nodes": [5]}).json()
        assert again["graph_version"] == after["graph_version"]  # nothing applied
        assert httpx.post(f"{base}/v1/graph/updates", json={"ops": []}).status_code == 400
        assert httpx.post(f"{base}/v1/graph/updates", json={"op": 1}).status_code == 400
        _check_edge_bodies_are_scanned(base, after["graph_version"])
    finally:
        assert stop_server(proc) == 0


def _batches_by_form(base: str) -> dict[str, float]:
    text = httpx.get(f"{base}/metrics?local=1").text
    pattern = re.compile(r'^gnnserve_update_batches_total\{form="(\w+)"\} (\S+)$', re.M)
    return {form: float(n) for form, n in pattern.findall(text)}


def _check_edge_bodies_are_scanned(base: str, version: str) -> None:
    """An edge-only body is read without JSON parsing (counted as edges_scanned); one the store
    refuses is answered as the op-by-op check answers it, and changes nothing."""
    before = _batches_by_form(base)
    ops = [{"op": "add_edge", "src": 7, "dst": 9}, {"op": "delete_edge", "src": 7, "dst": 9}]
    r = httpx.post(f"{base}/v1/graph/updates", content=json.dumps({"ops": ops}),
                   headers={"content-type": "application/json"})  # fmt: skip
    assert r.status_code == 200 and r.json()["seq"] == int(version.rsplit(".", 1)[1]) + 1
    bad = [{"op": "add_edge", "src": 1, "dst": 10**9}, {"op": "delete_edge", "src": 3, "dst": 4}]
    refused = httpx.post(f"{base}/v1/graph/updates", json={"ops": bad})
    assert refused.status_code == 400
    assert [e["message"] for e in refused.json()["errors"]] == [
        "ops[0].dst: node 1000000000 does not exist (nodes: 2001)",
        "ops[1]: edge 3 -> 4 does not exist",
    ]
    after = _batches_by_form(base)
    assert after.get("edges_scanned", 0) == before.get("edges_scanned", 0) + 1
    assert after.get("json", 0) == before.get("json", 0)  # the refused one counts nowhere
    seq = httpx.post(f"{base}/v1/predict", json={"nodes": [5]}).json()["graph_version"]
    assert seq == r.json()["graph_version"]  # nothing of the refused batch was applied


def test_read_only_store_answers_409(live_server: str) -> None:
    r = httpx.post(
        f"{live_server}/v1/graph/updates", json={"ops": [{"op": "add_edge", "src": 1, "dst": 2}]}
    )
    assert r.status_code == 409 and r.json()["error"]["kind"] == "read_only_store"
