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


def test_ingest_names_the_bad_row_or_file_before_sending(
    server: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Files the server never sees: exit 2 with ``error:`` naming the file and, for a CSV
    value, its row (as refusals number them) and line; nothing is applied."""
    from gnnserve.cli import main

    version = httpx.post(f"{server}/v1/predict", json={"nodes": [0]}).json()["graph_version"]
    lines = [f"add_edge,{u},3" for u in range(80)]
    lines[73] = "add_edge,x7,3"
    stream = to_stream(pa.table({"op": ["add_edge"] * 100, "src": list(range(100))}))
    files = {
        "src.csv": ("op,src,dst\n" + "\n".join(lines), "row 73 (line 75): src 'x7' is not an"),
        "half.csv": ("op,src,dst\nadd_edge,1.5,3\n", "row 0 (line 2): src '1.5'"),
        "text.csv": ("op,node,f0\nupsert_features,3,1\nadd_node,,abc\n", "row 1 (line 3): f0"),
        "cut.arrow": (stream[: len(stream) // 2], "not a complete Arrow IPC"),
        "updates.txt": ("op,src,dst\nadd_edge,1,2\n", "nor a .csv file"),
    }
    for name, (content, message) in files.items():
        path = tmp_path / name
        path.write_bytes(content if isinstance(content, bytes) else content.encode())
        assert main(["ingest", str(path), "--url", server, "--quiet"]) == 2, name
        err = capsys.readouterr().err
        assert err.startswith("error:") and name in err and message in err, (name, err)
    again = httpx.post(f"{server}/v1/predict", json={"nodes": [0]}).json()["graph_version"]
    assert again == version


def test_ingest_takes_csv_files_without_edges_or_without_features(
    server: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A CSV of only feature rows (src and dst empty everywhere: pyarrow types them null) and
    one of edges whose feature cells are all empty are applied; a row whose features hold a
    nan is refused by the server, named by its row."""
    from gnnserve.cli import main

    header, width = ",".join(f"f{i}" for i in range(16)), ",".join(["0.25"] * 16)
    features = tmp_path / "features.csv"
    features.write_text(
        f"op,src,dst,node,{header}\nupsert_features,,,3,{width}\nadd_node,,,,{width}\n"
    )
    edges = tmp_path / "edges.csv"  # 6.0: a whole number written as a float is an id
    edges.write_text(f"op,src,dst,{header}\nadd_edge,4,5{',' * 16}\nadd_edge,6.0,5{',' * 16}\n")
    for path in (features, edges):
        assert main(["ingest", str(path), "--url", server, "--quiet"]) == 0, capsys.readouterr()
    assert {4, 6} <= set(_in(server, 5))
    nan = tmp_path / "nan.csv"
    nan.write_text(
        f"op,node,{header}\nupsert_features,3,{width}\nupsert_features,3,nan,{width[5:]}\n"
    )
    assert main(["ingest", str(nan), "--url", server, "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "row 1: " in err and "(update_rejected)" in err and "is nan" in err, err
