"""Body size limit, short echoes and off-loop parsing, against real servers on loopback."""

from __future__ import annotations

import json
import select
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import psutil
import pytest

from gnnserve.demo import start_server, stop_server, wait_ready
from gnnserve.deploy.faas.pool import InstanceFailedError
from gnnserve.engine.loader import build_engine
from gnnserve.errors import (
    ECHO_CHARS,
    MAX_MESSAGE_CHARS,
    InvalidInputError,
    OverloadedError,
    WorkerFailedError,
    cut,
    echo,
)
from gnnserve.ports import free_port
from gnnserve.server.app import error_response
from gnnserve.server.limits import (
    BASE_BODY_BYTES,
    PARSE_INLINE_BYTES,
    default_body_limit,
    error_json,
)
from gnnserve.server.schemas import PredictRequest
from tests.engine.test_engine_newnodes import config
from tests.server.conftest import serving
from tests.server.errors import error_of

LIMIT = 16 << 20  # --max-body-bytes of the process server
MAX_NEW = 200_000
_IDS = {
    "name": "node_ids",
    "shape": [1],
    "datatype": "INT64",
    "data": [1],
}  # --max-new-nodes of the process server
SHORT = 800  # bytes: every error body here is at most this long


@pytest.fixture(scope="module")
def process_server(small_store: Path, small_ckpt: Path) -> Iterator[tuple[str, int]]:
    """``gnnserve serve`` in its own process, without precomputed embeddings: (URL, pid)."""
    port = free_port()
    flags = ("--max-body-bytes", str(LIMIT), "--max-new-nodes", str(MAX_NEW))
    proc = start_server(small_store, small_ckpt, port, *flags)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, proc)
        yield url, proc.pid
    finally:
        stop_server(proc)


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def _read_response(sock: socket.socket, timeout_s: float) -> bytes:
    """What the server sends back until it closes or ``timeout_s`` passes."""
    data = b""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        ready, _, _ = select.select([sock], [], [], 0.1)
        if ready:
            try:
                chunk = sock.recv(65536)
            except ConnectionResetError:
                break
            if not chunk:
                break
            data += chunk
            if b"\r\n\r\n" in data and data.endswith(b"}"):
                break
    return data


def _status_and_json(raw: bytes) -> tuple[int, dict]:
    head, _, body = raw.partition(b"\r\n\r\n")
    assert b"content-type: application/json" in head.lower(), raw[:300]
    return int(head.split()[1]), json.loads(body)


def test_declared_oversized_body_is_413_json_before_it_is_sent(process_server) -> None:
    """Content-Length of 200 MB: the 413 comes after 64 KB, without waiting for the rest."""
    url, pid = process_server
    rss = psutil.Process(pid).memory_info().rss
    with socket.create_connection(("127.0.0.1", _port(url))) as sock:
        head = (
            b"POST /v1/predict HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
            b"Content-Length: 200000000\r\n\r\n"
        )
        sock.sendall(head + b'{"nodes": [' + b"1," * 32768)
        raw = _read_response(sock, timeout_s=30)  # answered although the body never ends
    status, body = _status_and_json(raw)
    assert status == 413, raw[:300]
    assert body["error"]["kind"] == "payload_too_large" and str(LIMIT) in body["error"]["message"]
    assert psutil.Process(pid).memory_info().rss - rss < 32 << 20
    assert httpx.post(f"{url}/v1/predict", json={"nodes": [1]}, timeout=30).status_code == 200


def test_chunked_body_is_cut_off_once_past_the_limit(process_server) -> None:
    """No Content-Length: the server stops reading soon after the limit and answers 413."""
    url, pid = process_server
    rss = psutil.Process(pid).memory_info().rss
    chunk = b"%x\r\n" % (1 << 20) + b"1" * (1 << 20) + b"\r\n"
    sent = 0
    with socket.create_connection(("127.0.0.1", _port(url))) as sock:
        sock.sendall(
            b"POST /v1/predict HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n"
        )
        sock.setblocking(False)
        raw = b""
        deadline = time.monotonic() + 30
        while sent < 256 and time.monotonic() < deadline:  # up to 256 MiB
            readable, writable, _ = select.select([sock], [sock], [], 0.5)
            if readable:
                sock.setblocking(True)
                raw = _read_response(sock, timeout_s=5)
                break
            if writable:
                try:
                    sock.send(chunk)
                    sent += 1
                except (BlockingIOError, BrokenPipeError, ConnectionResetError):
                    pass
    status, body = _status_and_json(raw)
    assert status == 413 and body["error"]["kind"] == "payload_too_large"
    assert sent < 48, f"the server read {sent} MiB of a body over a {LIMIT >> 20} MiB limit"
    assert psutil.Process(pid).memory_info().rss - rss < 64 << 20


def _parser_cpu_s(server_pid: int) -> float:
    """CPU seconds the kernel accounted to the server's parser process (0 before it starts)."""
    for child in psutil.Process(server_pid).children():
        if "spawn_main" in " ".join(child.cmdline()):  # not the resource tracker
            times = child.cpu_times()
            return float(times.user + times.system)
    return 0.0


@pytest.mark.slow
def test_small_requests_are_answered_while_a_large_body_is_parsed(process_server) -> None:
    """While a 13 MB legal request (200,000 new nodes) is parsed, predictions go on.

    What the kernel counts, not how long things took: the parser process's CPU time grows by
    at least half of what the same parse costs here (``model_validate_json``: it ran there, not
    on the event loop), and one-node predictions are answered while the large request is in
    flight. (The server has no precomputed embeddings: the large request is answered 409 as
    soon as it is parsed.)
    """
    url, pid = process_server
    row = "[" + ",".join(["0.5"] * 16) + "]"
    features = ",".join([row] * MAX_NEW)
    body = f'{{"new_nodes": {{"features": [{features}], "edges": [[0, 1]]}}}}'.encode()
    assert 10 << 20 < len(body) < LIMIT
    outcome: dict[str, object] = {}

    def large() -> None:
        r = httpx.post(
            f"{url}/v1/predict",
            content=body,
            headers={"content-type": "application/json"},
            timeout=120,
        )
        outcome["status"] = r.status_code

    start = time.process_time()
    PredictRequest.model_validate_json(body)
    parse_cpu_s = time.process_time() - start
    for _ in range(2):  # the first also starts the parser process
        before = _parser_cpu_s(pid)
        thread = threading.Thread(target=large)
        thread.start()
        answered = 0
        while thread.is_alive():
            r = httpx.post(f"{url}/v1/predict", json={"nodes": [1]}, timeout=60)
            assert r.status_code == 200, r.text
            answered += 1
            time.sleep(0.005)
        thread.join()
        assert outcome["status"] == 409  # no_embeddings
    parser_s = _parser_cpu_s(pid) - before
    print(f"parser process: {parser_s:.3f} CPU s (the parse here: {parse_cpu_s:.3f}); {answered}")
    assert parser_s >= 0.5 * parse_cpu_s, (parser_s, parse_cpu_s)
    assert answered >= 2


def test_long_names_and_fields_are_not_echoed_in_full(live_server: str) -> None:
    name = "m" * 1_000_000
    cases = [
        ("/v1/predict", {"nodes": [1], "model": name}, 404, "model"),
        ("/v1/predict", {"nodes": [1], "k" * 100_000: 1}, 400, None),
        ("/v1/predict", {"nodes": [1], "output": name}, 400, "output"),
        (
            "/v2/models/sage/infer",
            {
                "inputs": [_IDS],
                "outputs": [{"name": name}],
            },
            400,
            "outputs",
        ),
        (
            "/v2/models/sage/infer",
            {
                "inputs": [_IDS],
                "parameters": {name: 1},
            },
            400,
            "parameters",
        ),
        (
            "/v2/models/sage/infer",
            {"inputs": [{"name": name, "shape": [1], "datatype": "INT64", "data": [1.5]}]},
            400,
            "inputs.0",
        ),
        (f"/v2/models/{'n' * 8000}/infer", {"inputs": [_IDS]}, 404, "model_name"),
    ]
    for path, body, status, field in cases:
        r = httpx.post(f"{live_server}{path}", json=body, timeout=60)
        assert r.status_code == status, (path, r.text[:300])
        assert len(r.content) < SHORT, (path, r.text[:300])
        if field is not None:
            assert error_of(r)["field"] == field
    r = httpx.get(f"{live_server}/v2/models/{'n' * 8000}", timeout=30)
    assert r.status_code == 404 and len(r.content) < SHORT


_LONG = "x" * 600
_NEW = {"new_nodes": {"features": [[0.5] * 16], "edges": [[0, 1]]}}


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/v1/predict", {"nodes": [1], "output": _LONG}, "output"),
        ("/v1/predict", {**_NEW, "mode": _LONG}, "mode"),
        ("/v1/predict", {**_NEW, "policy": _LONG}, "policy"),
        ("/v1/predict", {**_NEW, "seed": 10**600}, "seed"),
        ("/v2/models/sage/infer", {"inputs": [_IDS], "outputs": [{"name": _LONG}]}, "outputs"),
        (
            "/v2/models/sage/infer",
            {
                "inputs": [
                    {
                        "name": "new_node_features",
                        "shape": [1, 16],
                        "datatype": "FP32",
                        "data": [0.5] * 16,
                    },
                    {
                        "name": "new_node_edges",
                        "shape": [1, 2],
                        "datatype": "INT64",
                        "data": [0, 1],
                    },
                ],
                "parameters": {"gamma": _LONG},
            },
            "gamma",
        ),  # fmt: skip
    ],
)
def test_messages_stay_within_the_bound_and_cut_client_strings(
    pe_server: str, path: str, body: dict[str, object], field: str
) -> None:
    r = httpx.post(f"{pe_server}{path}", json=body, timeout=30)
    assert r.status_code == 400, r.text[:300]
    err = error_of(r)
    assert err["field"] == field
    assert len(err["message"]) <= MAX_MESSAGE_CHARS, len(err["message"])
    longest_run = max((len(run) for run in err["message"].split("'")), default=0)
    assert "x" * (ECHO_CHARS + 1) not in err["message"] and "9" * 65 not in err["message"]
    assert longest_run <= 2 * ECHO_CHARS + 64, err["message"]


def test_error_json_cuts_long_messages_to_the_bound() -> None:
    exc = InvalidInputError("y" * 5000, "z" * 500)
    err = error_json(exc)["error"]
    assert isinstance(err, dict)
    assert len(err["message"]) == MAX_MESSAGE_CHARS and err["message"].endswith("(5000 chars)")
    assert len(err["field"]) == 2 * ECHO_CHARS and err["field"].endswith("(500 chars)")
    assert cut("short", 10) == "short"


def test_retry_hints_become_retry_after_headers() -> None:
    cases = [
        (OverloadedError("busy", retry_after_s=2.3), 429, "3"),
        (OverloadedError("queue full"), 429, "1"),
        (InstanceFailedError("the instance died", "instance"), 503, "1"),
        (WorkerFailedError("a worker died"), 503, "1"),
        (InvalidInputError("bad", "nodes"), 400, None),
    ]
    for exc, status, retry_after in cases:
        response = error_response(exc)
        assert response.status_code == status, exc
        assert response.headers.get("retry-after") == retry_after, exc


def test_echo_and_default_limit() -> None:
    assert echo("abc") == "'abc'"
    long = echo("x" * 10_000)
    assert long.startswith("'xxx") and "10000 chars" in long and len(long) < 100
    assert default_body_limit(1024, 16) == BASE_BODY_BYTES + 32 * 1024 * 16
    # the largest new-node request of a 4,735-wide store (fb100) at full float precision fits
    row = json.dumps([[-1.2345678901234567e-05] * 4735] * 8)
    assert len(row) / 8 * 1024 < default_body_limit(1024, 4735) - BASE_BODY_BYTES


@pytest.fixture(scope="module")
def pe_server(pe_store: Path, small_ckpt: Path) -> Iterator[str]:
    """An in-process server with precomputed embeddings (full-neighbourhood sampling)."""
    with serving(build_engine(config(pe_store, small_ckpt)), "sage") as url:
        yield url


def _post_padded(url: str, path: str, body: object, pad: int) -> httpx.Response:
    raw = json.dumps(body).encode()
    raw = raw[:-1] + b" " * pad + raw[-1:]  # JSON allows the whitespace: same request, longer
    return httpx.post(
        f"{url}{path}", content=raw, headers={"content-type": "application/json"}, timeout=120
    )


def test_bodies_parsed_in_the_parser_process_give_the_same_answers(pe_server) -> None:
    """The same requests, padded past PARSE_INLINE_BYTES (parser process, long lists back as
    arrays) and not (parsed inline), give identical answers and identical errors."""
    rng = np.random.default_rng(5)
    m = 300  # lists of 300 rows and 4,800 values come back as arrays
    features = rng.standard_normal((m, 16)).astype(np.float32).tolist()
    edges = [[i, int(rng.integers(0, 2000))] for i in range(m)]
    predict = {"new_nodes": {"features": features, "edges": edges}, "output": "probs"}
    infer = {
        "inputs": [
            {
                "name": "new_node_features",
                "shape": [m, 16],
                "datatype": "FP32",
                "data": [v for row in features for v in row],
            },
            {
                "name": "new_node_edges",
                "shape": [m, 2],
                "datatype": "INT64",
                "data": [v for e in edges for v in e],
            },
        ],
        "outputs": [{"name": "probs"}],
        "parameters": {"mode": "full"},
    }
    nodes = {"nodes": list(range(300)), "output": "embedding"}
    bad = {"new_nodes": {"features": features[:-1] + [features[-1][:15]], "edges": edges}}
    cases = [
        ("/v1/predict", {**predict, "mode": "full"}),
        ("/v1/predict", nodes),
        ("/v2/models/sage/infer", infer),
        ("/v1/predict", bad),
        ("/v1/predict", {**nodes, "nodes": [*range(299), 2**70]}),
    ]
    statuses = []
    for path, body in cases:
        inline = _post_padded(pe_server, path, body, 0)
        elsewhere = _post_padded(pe_server, path, body, PARSE_INLINE_BYTES)
        assert inline.status_code == elsewhere.status_code, (path, elsewhere.text[:300])
        a, b = inline.json(), elsewhere.json()
        a.pop("timings", None)
        b.pop("timings", None)
        assert a == b, path
        statuses.append(inline.status_code)
    assert statuses == [200, 200, 200, 400, 400]
