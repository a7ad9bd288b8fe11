"""Two real `gnnserve serve` processes side by side: a deployment mode against ``local``."""

from __future__ import annotations

import subprocess
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


@contextmanager
def served_pair(
    store: Path, ckpt: Path, flags_a: tuple[str, ...], flags_b: tuple[str, ...]
) -> Iterator[tuple[str, str]]:
    """Two `gnnserve serve` child processes started at once (their start-ups overlap), both
    ready; yields their base URLs."""
    ports = free_port(), free_port()
    while ports[1] == ports[0]:
        ports = ports[0], free_port()
    bases = tuple(f"http://127.0.0.1:{p}" for p in ports)
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for port, flags in zip(ports, (flags_a, flags_b), strict=True):
            procs.append(start_server(store, ckpt, port, *flags))
        for base, proc in zip(bases, procs, strict=True):
            wait_ready(base, proc, timeout_s=180)
        yield bases[0], bases[1]
    finally:
        codes = [stop_server(proc, timeout_s=60) for proc in procs]
        assert codes == [0] * len(procs), codes


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
