"""Bulk graph updates over HTTP (Arrow IPC streams) and `gnnserve ingest`, on a real server."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pyarrow as pa
import pytest

from gnnserve.demo import start_server, stop_server, wait_ready
from gnnserve.dynamic.bulk import ARROW_STREAM, to_stream
from gnnserve.ports import free_port

ARROW = {"content-type": ARROW_STREAM}


@pytest.fixture(scope="module")
def server(small_store: Path, small_ckpt: Path, tmp_path_factory) -> Iterator[str]:
    log = tmp_path_factory.mktemp("bulk") / "updates.log"
    port = free_port()
    proc = start_server(small_store, small_ckpt, port, "--update-log", str(log))
    base = f"http://127.0.0.1:{port}"
    wait_ready(base, proc)
    yield base
    assert stop_server(proc) == 0


def _in(base: str, v: int) -> list[int]:
    return httpx.get(f"{base}/v1/graph/neighbors/{v}").json()["in_neighbors"]


def test_an_arrow_batch_is_applied_all_at_once(server: str) -> None:
    before = {v: _in(server, v) for v in (10, 11)}
    table = pa.table(
        {
            "op": ["add_node", "add_edge", "add_edge", "upsert_features"],
            "src": [None, 1999, 2000, None],
            "dst": [None, 10, 11, None],
            "node": pa.array([None, None, None, 3], pa.int64()),
            "features": pa.array([[1.0] * 16, None, None, [2.0] * 16], pa.list_(pa.float32(), 16)),
        }
    )
    r = httpx.post(f"{server}/v1/graph/updates", content=to_stream(table), headers=ARROW)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["new_nodes"] == [2000] and body["applied"] == 4
    assert _in(server, 10) == [*before[10], 1999] and _in(server, 11) == [*before[11], 2000]
    predicted = httpx.post(f"{server}/v1/predict", json={"nodes": [2000]}).json()
    assert predicted["graph_version"] == body["graph_version"]


def test_refused_rows_are_listed_and_nothing_is_applied(server: str) -> None:
    version = httpx.post(f"{server}/v1/predict", json={"nodes": [0]}).json()["graph_version"]
    table = pa.table(
        {"op": ["add_edge", "delete_edge", "fly"], "src": [1, 3, 0], "dst": [2, 9**9, 1]}
    )
    r = httpx.post(f"{server}/v1/graph/updates", content=to_stream(table), headers=ARROW)
    assert r.status_code == 400
    assert [e["field"] for e in r.json()["errors"]] == ["ops[1].dst", "ops[2].op"]
    again = httpx.post(f"{server}/v1/predict", json={"nodes": [0]}).json()["graph_version"]
    assert again == version


def test_a_compressed_stream_is_limited_by_what_it_expands_to(server: str) -> None:
    """2M add_edge rows in ~2 KB of zstd (34 MB once decoded) against the default 17.3 MB
    limit: 413 before any row is decoded or applied."""
    rows = 2_000_000
    ids = pa.array(np.zeros(rows, np.int64))
    table = pa.table({"op": pa.array(np.zeros(rows, np.int8)), "src": ids, "dst": ids})
    sink = pa.BufferOutputStream()
    options = pa.ipc.IpcWriteOptions(compression="zstd")
    with pa.ipc.new_stream(sink, table.schema, options=options) as writer:
        writer.write_table(table)
    body = bytes(sink.getvalue())
    version = httpx.post(f"{server}/v1/predict", json={"nodes": [0]}).json()["graph_version"]
    r = httpx.post(f"{server}/v1/graph/updates", content=body, headers=ARROW, timeout=60)
    assert len(body) < 200_000 and r.status_code == 413, (len(body), r.text)
    error = r.json()["error"]
    assert error["kind"] == "payload_too_large" and "2,000,000 rows" in error["message"]
    again = httpx.post(f"{server}/v1/predict", json={"nodes": [0]}).json()["graph_version"]
    assert again == version


def test_a_body_that_is_not_an_arrow_stream_is_a_400(server: str) -> None:
    r = httpx.post(f"{server}/v1/graph/updates", content=b"\x00" * 64, headers=ARROW)
    assert r.status_code == 400 and "Arrow IPC" in r.json()["error"]["message"]


def test_a_read_only_store_refuses_arrow_too(live_server: str) -> None:
    table = pa.table({"op": ["add_edge"], "src": [1], "dst": [2]})
    r = httpx.post(f"{live_server}/v1/graph/updates", content=to_stream(table), headers=ARROW)
    assert r.status_code == 409 and r.json()["error"]["kind"] == "read_only_store"


def test_ingest_sends_batches_and_stops_at_a_refused_one(server: str, tmp_path: Path) -> None:
    rows = [f"add_edge,{u},{50 + u % 7}" for u in range(100, 125)]
    rows[17] = "add_edge,100,99999"  # row 17: the second batch of 10 is refused
    path = tmp_path / "updates.csv"
    path.write_text("op,src,dst\n" + "\n".join(rows) + "\n")
    cmd = [sys.executable, "-m", "gnnserve.cli", "ingest", str(path), "--url", server]
    out = subprocess.run([*cmd, "--batch-rows", "10"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert "row 17: ops[7].dst" in out.stderr and "--skip-rows 10" in out.stderr
    for u in range(100, 110):
        assert u in _in(server, 50 + u % 7)  # batch 1: applied
    assert 110 not in _in(server, 50 + 110 % 7)  # batch 2: nothing of it
    rows[17] = f"add_edge,117,{50 + 117 % 7}"
    path.write_text("op,src,dst\n" + "\n".join(rows) + "\n")
    done = subprocess.run(
        [*cmd, "--batch-rows", "10", "--skip-rows", "10"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "15 rows" in done.stderr
    assert all(u in _in(server, 50 + u % 7) for u in range(110, 125))
    assert _in(server, 50 + 100 % 7).count(100) == 1  # the resumed run did not send batch 1 again
