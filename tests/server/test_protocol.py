"""What reaches a real `gnnserve serve` process below the API: unparsable HTTP, a client gone
mid-body, path ids that only look like numbers, an oversized OIP outputs list."""

from __future__ import annotations

import socket
from pathlib import Path

import httpx
import pytest

from gnnserve.demo import start_server, stop_server, wait_ready
from gnnserve.ports import free_port
from tests.server.errors import error_of

pytestmark = pytest.mark.slow


def _exchange(port: int, raw: bytes) -> bytes:
    """Send ``raw`` on a new connection; everything the server answers until it closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(raw)
        sock.shutdown(socket.SHUT_WR)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def test_protocol_errors_disconnects_and_path_ids(
    small_store: Path, small_ckpt: Path, tmp_path: Path
) -> None:
    port = free_port()
    out, err = tmp_path / "stdout", tmp_path / "stderr"
    with out.open("wb") as stdout, err.open("wb") as stderr:
        proc = start_server(small_store, small_ckpt, port, stdout=stdout, stderr=stderr)
        base = f"http://127.0.0.1:{port}"
        try:
            wait_ready(base, proc)
            # 1. unparsable request line: uvicorn's 400, as JSON
            answer = _exchange(port, b"GARBAGE \x01\x02 nonsense\r\n\r\n")
            head, _, body = answer.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 400"), answer[:200]
            assert b"content-type: application/json" in head.lower(), head
            assert httpx.Response(400, content=body).json()["error"]["kind"] == "bad_request"
            # 2. a client gone mid-body: counted as a disconnect, no traceback, no 500
            with socket.create_connection(("127.0.0.1", port)) as sock:
                sock.sendall(
                    b"POST /v1/predict HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
                    b"Content-Length: 1000\r\n\r\n" + b'{"nodes": [1, 2'
                )
            # 3. node ids in the path: plain decimal digits only
            for text in ("1_000", "+1", "%201", "1%20", "\u0661", "0x1", "99999999999999999999"):
                r = httpx.get(f"{base}/v1/graph/neighbors/{text}", timeout=30)
                assert r.status_code == 400, (text, r.text)
                assert error_of(r)["field"] == "node", r.text
            r = httpx.get(f"{base}/v1/graph/neighbors/0001", timeout=30)
            assert r.status_code == 200 and r.json()["node"] == 1, r.text
            # 4. an OIP outputs list longer than the output kinds: refused by its length
            ids = {"name": "node_ids", "shape": [1], "datatype": "INT64", "data": [1]}
            body_json = {"inputs": [ids], "outputs": [{"name": "label"}] * 200_000}
            r = httpx.post(f"{base}/v2/models/default/infer", json=body_json, timeout=120)
            assert r.status_code == 400 and error_of(r)["field"] == "outputs", r.text
            assert "at most 3 items" in error_of(r)["message"], r.text
            assert httpx.post(f"{base}/v1/predict", json={"nodes": [1]}).status_code == 200
        finally:
            assert stop_server(proc) == 0
    summary = [line for line in out.read_text().splitlines() if "stopped;" in line]
    assert summary == [
        "gnnserve: stopped; answered 10 of 11 requests received (200: 2, 400: 8); "
        "1 client(s) disconnected before sending the whole request"
    ], out.read_text()
    assert "Traceback" not in err.read_text(), err.read_text()[-3000:]
