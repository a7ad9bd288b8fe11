"""``gnnserve demo``: generate a graph, train GraphSAGE, serve it over HTTP, load it, report.

Needs nothing but the installed package: the graph is a stochastic block model generated with a
fixed seed, the server is a real ``gnnserve serve`` process on loopback.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import IO

import httpx
import numpy as np

from gnnserve import loadgen
from gnnserve.data import layout
from gnnserve.data.generators import sbm
from gnnserve.data.writer import write_store
from gnnserve.models.train import train
from gnnserve.models.zoo import ModelConfig
from gnnserve.ports import free_port


def _step(text: str) -> None:
    print(f"\n== {text}", flush=True)


def wait_ready(base_url: str, proc: subprocess.Popen[bytes], timeout_s: float = 120.0) -> None:
    """Poll /v2/health/ready until 200; fail early if the server process died."""
    deadline = time.monotonic() + timeout_s
    with httpx.Client(timeout=1.0) as client:  # one client: each new one loads the CA bundle
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                code = proc.returncode
                raise RuntimeError(f"server exited with code {code} before becoming ready")
            with contextlib.suppress(httpx.HTTPError):
                if client.get(f"{base_url}/v2/health/ready").status_code == 200:
                    return
            time.sleep(0.2)
    raise RuntimeError(f"server not ready after {timeout_s:.0f} s")


def start_server(
    store: Path,
    model: Path,
    port: int,
    *extra: str,
    stdout: IO[bytes] | None = None,
    stderr: IO[bytes] | None = None,
    env: dict[str, str] | None = None,
) -> subprocess.Popen[bytes]:
    """Start ``gnnserve serve`` as a child process on loopback (``stdout`` / ``stderr``: where
    its output goes, e.g. a file to read the request counts it prints when it stops; ``env``:
    its environment, default this process's)."""
    cmd = [
        sys.executable,
        "-m",
        "gnnserve.cli",
        "serve",
        "--store",
        str(store),
        "--model",
        str(model),
        "--port",
        str(port),
        *extra,
    ]
    env = {**(os.environ if env is None else env), "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(cmd, env=env, stdout=stdout, stderr=stderr)


def stop_server(proc: subprocess.Popen[bytes], timeout_s: float = 30.0) -> int:
    """SIGTERM (graceful: finishes accepted requests) and wait for the exit code."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return int(proc.returncode)


def _prepare(workdir: Path) -> Path:
    store = workdir / "store"
    if (store / layout.META).is_file():
        print(f"reusing {store}")
        return store
    t = time.perf_counter()
    data = sbm(num_nodes=20_000, seed=0)
    meta = write_store(data, store, overwrite=True)
    print(
        f"SBM graph: {meta.num_nodes} nodes, {meta.num_edges} edges, "
        f"{meta.feature_dim} features, {meta.num_classes} classes ({time.perf_counter() - t:.1f} s)"
    )
    return store


def _train(store: Path, workdir: Path) -> Path:
    meta = layout.read_meta(store)
    ckpt = workdir / "sage"
    config = ModelConfig(
        arch="sage", in_dim=meta.feature_dim, hidden_dim=128, out_dim=meta.num_classes, num_layers=2
    )
    report = train(
        store, config, epochs=3, fanouts=[10, 5], batch_size=512, lr=0.01, seed=0, out_dir=ckpt
    )
    print(f"trained: test accuracy {report.test_acc:.3f}")
    return ckpt


def _load(base_url: str, store: Path, n_requests: int) -> None:
    warmup = [{"nodes": [i]} for i in range(64)]
    asyncio.run(loadgen.closed_loop(f"{base_url}/v1/predict", warmup, 8))
    labels = np.load(store / "labels.npy")
    test = np.flatnonzero(np.load(store / "test_mask.npy"))
    rng = np.random.default_rng(1)
    payloads = [
        {"nodes": rng.choice(test, int(rng.integers(1, 5))).tolist(), "output": "label"}
        for _ in range(n_requests)
    ]
    report = asyncio.run(loadgen.closed_loop(f"{base_url}/v1/predict", payloads, 32, True))
    got = np.concatenate([r["predictions"] for r in report.responses if r and "predictions" in r])
    want = np.concatenate(
        [
            labels[p["nodes"]]
            for p, r in zip(payloads, report.responses, strict=True)
            if r and "predictions" in r
        ]
    )
    s = report.summary()
    print(f"{report.ok}/{n_requests} requests answered, {len(got)} node predictions")
    print(f"served accuracy: {np.mean(got == want):.3f}")
    print(
        f"latency p50 {s['p50_ms']:.1f} ms, p99 {s['p99_ms']:.1f} ms; "
        f"throughput {s['throughput_rps']:.0f} requests/s at concurrency 32"
    )


def run(args: argparse.Namespace) -> int:
    """The demo; returns a process exit code."""
    start = time.perf_counter()
    logging.getLogger("httpx").setLevel(logging.WARNING)
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    _step("1/4 generate a 20K-node stochastic block model graph")
    store = _prepare(workdir)
    _step("2/4 train GraphSAGE (2 layers) on sampled mini-batches")
    ckpt = _train(store, workdir)
    _step("3/4 start `gnnserve serve` on loopback")
    port = free_port()
    proc = start_server(store, ckpt, port)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_ready(base, proc)
        print(f"ready at {base}")
        _step(f"4/4 send {args.requests} concurrent HTTP requests")
        _load(base, store, args.requests)
    finally:
        code = stop_server(proc)
    print(
        f"\nserver shut down cleanly (exit {code}); demo took {time.perf_counter() - start:.0f} s"
    )
    return 0 if code == 0 else 1
