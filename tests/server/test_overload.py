"""Overload over HTTP: a full admission queue answers 429 with a JSON body, then recovers."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import uvicorn

from gnnserve.config import ServeConfig
from gnnserve.demo import free_port
from gnnserve.engine.loader import build_engine
from gnnserve.server.app import create_app
from tests.engine.test_engine import _Gate


def test_full_queue_answers_429_and_keeps_accepted_requests(
    small_store: Path, small_ckpt: Path
) -> None:
    config = ServeConfig.load(
        None,
        **{
            "store.path": str(small_store),
            "model_path": str(small_ckpt),
            "admission.max_queue_requests": 2,
        },
    )
    engine = build_engine(config)
    gate = _Gate(engine.runner)
    engine.runner = gate  # type: ignore[assignment]
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(engine), port=port, log_level="warning"))
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
            gate.event.set()
            assert [f.result().status_code for f in accepted] == [200, 200]
        assert httpx.post(url, json={"nodes": [3]}).status_code == 200
    finally:
        gate.event.set()
        server.should_exit = True
        thread.join(30)
