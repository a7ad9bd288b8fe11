"""A real uvicorn server on loopback, serving the small test store, shared by the HTTP tests."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import uvicorn
from fastapi import FastAPI

from gnnserve.config import ServeConfig
from gnnserve.engine.engine import Engine
from gnnserve.engine.loader import build_engine
from gnnserve.ports import free_port
from gnnserve.server.app import create_app

MAX_NODES = 64


@contextmanager
def serving(engine: Engine, name: str = "sage") -> Iterator[str]:
    """Serve ``engine`` as model ``name`` on a free loopback port; yields the base URL."""
    with serving_app(engine, name) as (url, _):
        yield url


@contextmanager
def serving_app(engine: Engine, name: str = "sage") -> Iterator[tuple[str, FastAPI]]:
    """:func:`serving`, yielding the app too (its state: the gRPC port, when it serves one)."""
    app = create_app(engine, name)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not (server.started and engine.warm):  # ready: warmed up after the port is bound
        assert time.monotonic() < deadline, "server did not start"
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}", app
    finally:
        server.should_exit = True
        thread.join(30)


@pytest.fixture(scope="session")
def live_app(small_store: Path, small_ckpt: Path) -> Iterator[tuple[str, FastAPI]]:
    """A running server (model name 'sage', fanouts [-1, -1], 64 nodes max, gRPC on a free
    port): its base URL and app."""
    config = ServeConfig.load(
        None,
        **{
            "store.path": str(small_store),
            "model_path": str(small_ckpt),
            "sampler.fanouts": [-1, -1],
            "admission.max_nodes_per_request": MAX_NODES,
            "server.grpc_port": 0,
        },
    )
    with serving_app(build_engine(config), "sage") as served:
        yield served


@pytest.fixture(scope="session")
def live_server(live_app: tuple[str, FastAPI]) -> str:
    """Base URL of the running server of :func:`live_app`."""
    return live_app[0]


@pytest.fixture(scope="session")
def live_grpc(live_app: tuple[str, FastAPI]) -> str:
    """``host:port`` of the running server's gRPC front end."""
    return f"127.0.0.1:{live_app[1].state.grpc_port}"
