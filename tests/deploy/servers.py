"""Two real `gnnserve serve` processes side by side: a deployment mode against ``local``."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from gnnserve.demo import free_port, start_server, stop_server, wait_ready


@contextmanager
def served(store: Path, ckpt: Path, *flags: str) -> Iterator[str]:
    """A `gnnserve serve` child process with ``flags``, ready; yields its base URL."""
    port = free_port()
    proc = start_server(store, ckpt, port, *flags)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_ready(base, proc, timeout_s=180)
        yield base
    finally:
        assert stop_server(proc, timeout_s=60) == 0


def predict(base: str, body: dict[str, object]) -> dict[str, object]:
    """POST /v1/predict; the JSON answer (asserts 200)."""
    r = httpx.post(f"{base}/v1/predict", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


def update(base: str, ops: list[dict[str, object]]) -> None:
    """POST /v1/graph/updates (asserts 200)."""
    r = httpx.post(f"{base}/v1/graph/updates", json={"ops": ops}, timeout=60)
    assert r.status_code == 200, r.text


def metric(base: str, name: str) -> float:
    """The value of the unlabelled Prometheus sample ``name`` on /metrics (asserts it exists)."""
    text = httpx.get(f"{base}/metrics", timeout=10).text
    for line in text.splitlines():
        if line.startswith(f"{name} "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not on /metrics")
