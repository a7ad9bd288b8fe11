"""Overload over HTTP: 429 when the queue is full or a deadline cannot be met (shed before the
body is read), 504 without compute for a request whose deadline passed in the pipeline."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from unittest.mock import ANY

import httpx
import uvicorn

from gnnserve.config import ServeConfig
from gnnserve.engine.delay import ServiceModel
from gnnserve.engine.engine import Engine
from gnnserve.engine.loader import build_engine
from gnnserve.ports import free_port
from gnnserve.server.app import create_app
from tests.engine.test_engine import _Gate
from tests.server.conftest import serving


def test_full_queue_answers_429_and_keeps_accepted_requests(
    small_store: Path, small_ckpt: Path
) -> None:
    config = ServeConfig.load(
        None,
        **{
            "store.path": str(small_store),
            "model_path": str(small_ckpt),
            "admission.max_queue_requests": 2,
            "server.grpc_port": 0,
        },
    )
    engine = build_engine(config)
    gate = _Gate(engine.runner)
    engine.runner = gate  # type: ignore[assignment]
    port = free_port()
    app = create_app(engine)
    server = uvicorn.Server(uvicorn.Config(app, port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    url = f"http://127.0.0.1:{port}/v1/predict"
    try:
        with ThreadPoolExecutor(2) as pool:
            accepted = [
                pool.submit(httpx.post, url, json={"nodes": [i]}, timeout=30) for i in (1, 2)
            ]
            while engine.queue_depth < 2:
                time.sleep(0.01)
            refused = httpx.post(url, json={"nodes": [3]})
            assert refused.status_code == 429
            assert refused.json()["error"]["kind"] == "overloaded"
            _assert_grpc_refused_as_overloaded(app.state.grpc_port)
            gate.event.set()
            assert [f.result().status_code for f in accepted] == [200, 200]
        assert httpx.post(url, json={"nodes": [3]}).status_code == 200
    finally:
        gate.event.set()
        server.should_exit = True
        thread.join(30)


def _assert_grpc_refused_as_overloaded(port: int) -> None:
    """A gRPC infer is shed as HTTP's is: UNAVAILABLE, saying the server is overloaded."""
    import numpy as np
    import tritonclient.grpc as triton
    from tritonclient.utils import InferenceServerException

    ids = triton.InferInput("node_ids", [1], "INT64")
    ids.set_data_from_numpy(np.array([3], dtype=np.int64))
    client = triton.InferenceServerClient(url=f"127.0.0.1:{port}")
    try:
        client.infer("default", [ids])
    except InferenceServerException as exc:
        assert exc.status() == "StatusCode.UNAVAILABLE", exc
        assert "overloaded" in exc.message(), exc
    else:
        raise AssertionError("a gRPC infer was admitted beside a full queue")


class _CountingGate:
    """Wraps the model runner: counts forward passes, blocks them while ``open`` is clear."""

    def __init__(self, runner: Any) -> None:
        self.runner, self.open, self.forwards = runner, threading.Event(), 0
        self.open.set()

    def forward(self, batch: Any) -> Any:
        self.forwards += 1
        assert self.open.wait(30)
        return self.runner.forward(batch)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.runner, name)


def _gated_engine(store: Path, ckpt: Path, **overrides: object) -> tuple[Engine, _CountingGate]:
    config = ServeConfig.load(
        None, **{"store.path": str(store), "model_path": str(ckpt), **overrides}
    )
    engine = build_engine(config)
    gate = _CountingGate(engine.runner)
    engine.runner = gate  # type: ignore[assignment]
    return engine, gate


def _wait_for(condition: Callable[[], bool], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.01)


def _ready(base: str) -> None:
    """Wait for /v2/health/ready: the start-up warm-up (a forward of its own) is over."""
    _wait_for(lambda: httpx.get(f"{base}/v2/health/ready").status_code == 200)


def test_unmeetable_deadline_gets_429_at_once_while_admitted_requests_succeed(
    small_store: Path, small_ckpt: Path
) -> None:
    overrides = {"batcher.max_batch_nodes": 8, "admission.max_queue_delay_ms": None}
    engine, gate = _gated_engine(small_store, small_ckpt, **overrides)
    with serving(engine) as base:
        url = f"{base}/v1/predict"
        _ready(base)
        for i in range(20):  # completed batches: the measured service time
            assert httpx.post(url, json={"nodes": list(range(i, i + 8))}).status_code == 200
        gate.open.clear()
        release = threading.Timer(10.0, gate.open.set)  # old code: the refused one waits for it
        release.start()
        with ThreadPoolExecutor(12) as pool:
            admitted = [
                pool.submit(httpx.post, url, json={"nodes": list(range(8))}, timeout=60)
                for _ in range(12)
            ]
            _wait_for(lambda: engine.admission.backlog.queued[1] == 10)  # 2 batches in flight
            predicted = engine.admission.backlog.predict(1, time.perf_counter())
            assert predicted is not None and predicted.wait_s > 0
            timeout_ms = f"{max(predicted.latency_s * 1e3 / 4, 1.0):.1f}"
            refused = httpx.post(url, json={"nodes": [1]}, headers={"X-Timeout-Ms": timeout_ms})
            assert refused.status_code == 429, refused.text
            assert not gate.open.is_set()  # answered while the gate still held the batches
            assert refused.json() == {
                "error": {"kind": "overloaded", "message": ANY, "field": None}
            }
            assert int(refused.headers["retry-after"]) >= 1
            # shed before the body is read: a body that never arrives gets the same answer
            port = int(base.rsplit(":", 1)[1])
            with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
                sock.sendall(
                    b"POST /v1/predict HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                    b"content-length: 100000\r\nx-timeout-ms: " + timeout_ms.encode() + b"\r\n\r\n{"
                )
                head = sock.recv(65536)
            assert head.startswith(b"HTTP/1.1 429"), head
            infer = {
                "inputs": [{"name": "node_ids", "datatype": "INT64", "shape": [1], "data": [1]}]
            }
            oip = httpx.post(
                f"{base}/v2/models/sage/infer", json=infer, headers={"X-Timeout-Ms": timeout_ms}
            )
            assert oip.status_code == 429, oip.text
            updates = httpx.post(  # only requests that run the model are shed
                f"{base}/v1/graph/updates", json={"ops": []}, headers={"X-Timeout-Ms": timeout_ms}
            )
            assert updates.json()["error"]["kind"] == "read_only_store"
            untimed = pool.submit(httpx.post, url, json={"nodes": [1]}, timeout=60)
            assert not untimed.done()  # no deadline, no budget: admitted, waits behind the gate
            gate.open.set()
            assert [f.result().status_code for f in [*admitted, untimed]] == [200] * 13
        release.cancel()


def test_deadline_passed_in_the_pipeline_gets_504_without_compute(
    small_store: Path, small_ckpt: Path
) -> None:
    engine, gate = _gated_engine(small_store, small_ckpt)
    with serving(engine) as base, ThreadPoolExecutor(2) as pool:
        url = f"{base}/v1/predict"
        _ready(base)
        warm_up = gate.forwards
        gate.open.clear()
        first = pool.submit(httpx.post, url, json={"nodes": [1]}, timeout=60)
        _wait_for(lambda: gate.forwards == warm_up + 1)
        late = pool.submit(
            httpx.post, url, json={"nodes": [2]}, headers={"X-Timeout-Ms": "200"}, timeout=60
        )
        # admitted (counted in flight) by now, so its 200 ms run from before this point: past
        # them it has expired wherever it waits, however slowly the request reached the server
        _wait_for(lambda: engine.admission.in_flight == 2)
        time.sleep(0.3)
        gate.open.set()
        assert first.result().status_code == 200
        answer = late.result()
        assert answer.status_code == 504, answer.text
        assert answer.json()["error"]["kind"] == "deadline_exceeded"
        assert gate.forwards == warm_up + 1  # the expired batch never ran the model
        assert httpx.post(url, json={"nodes": [2]}).status_code == 200
        assert gate.forwards == warm_up + 2


def test_malformed_timeout_header_is_a_400(live_server: str) -> None:
    for value in ("soon", "-5", "0", "nan", "1e400"):
        r = httpx.post(
            f"{live_server}/v1/predict", json={"nodes": [1]}, headers={"X-Timeout-Ms": value}
        )
        assert r.status_code == 400, (value, r.text)
        assert r.json()["error"]["field"] == "X-Timeout-Ms"


def test_each_admitted_answer_calibrates_the_prediction_once(
    small_store: Path, small_ckpt: Path
) -> None:
    engine, _ = _gated_engine(small_store, small_ckpt)
    calibration = engine.admission.backlog.calibration
    with serving(engine) as base:
        url = f"{base}/v1/predict"
        for i in range(ServiceModel.MIN_BATCHES + 3):  # the model predicts from here on
            assert httpx.post(url, json={"nodes": [i]}).status_code == 200
        before = calibration.observed
        for i in range(5):
            r = httpx.post(url, json={"nodes": [i]}, headers={"X-Timeout-Ms": "30000"})
            assert r.status_code == 200
        assert httpx.post(url, json={"nodes": [10**9]}).status_code == 400  # never admitted
        assert calibration.observed == before + 5  # at the HTTP answer, not also at the future
