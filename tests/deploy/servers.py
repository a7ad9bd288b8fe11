"""Two real `gnnserve serve` processes side by side: a deployment mode against ``local``."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from gnnserve.demo import start_server, stop_server, wait_ready
from gnnserve.ports import free_port


@contextmanager
def served_together(
    store: Path, ckpt: Path, *flag_sets: tuple[str, ...], join_ray: bool = False
) -> Iterator[list[str]]:
    """One `gnnserve serve` child process per entry of ``flag_sets``, started at once (their
    start-ups overlap), all ready; yields their base URLs. Each must stop with exit code 0.
    ``join_ray``: a deployment joins the session's Ray instance (``ray_instance``, which the
    test must use) instead of starting its own: for tests that do not look for its workers
    among the server's child processes."""
    ports: list[int] = []
    while len(ports) < len(flag_sets):
        if (port := free_port()) not in ports:
            ports.append(port)
    bases = [f"http://127.0.0.1:{p}" for p in ports]
    procs: list[subprocess.Popen[bytes]] = []
    try:
        env = _joining_env() if join_ray else None
        for port, flags in zip(ports, flag_sets, strict=True):
            procs.append(start_server(store, ckpt, port, *flags, env=env))
        for base, proc in zip(bases, procs, strict=True):
            wait_ready(base, proc, timeout_s=180)
        yield bases
    finally:
        codes = [stop_server(proc, timeout_s=60) for proc in procs]
        assert codes == [0] * len(procs), codes


def _joining_env() -> dict[str, str]:
    """The servers' environment when this test process runs the session's Ray instance
    (``ray_instance``): its address, so that a deployment joins it as it would a cluster a user
    started, instead of starting and stopping a Ray instance of its own (seconds of CPU each)."""
    import ray

    assert ray.is_initialized(), "join_ray needs the test to use the ray_instance fixture"
    return {**os.environ, "RAY_ADDRESS": ray.get_runtime_context().gcs_address}


@contextmanager
def served(store: Path, ckpt: Path, *flags: str, join_ray: bool = False) -> Iterator[str]:
    """A `gnnserve serve` child process with ``flags``, ready; yields its base URL."""
    with served_together(store, ckpt, flags, join_ray=join_ray) as (base,):
        yield base


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
