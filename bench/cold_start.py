"""First request after ``/v2/health/ready`` against the steady state, with a cold numba cache.

Prepares a fresh SBM store and a small GraphSAGE checkpoint (``--workdir``), then per round
starts ``gnnserve serve`` with an empty ``NUMBA_CACHE_DIR`` (so no kernel comes from the on-disk
cache), waits for ready, times the first ``/v1/predict`` (one node) and then ``--steady`` more,
and stops the server. Latencies are client round trips in ms; ``first_sample_ms`` and
``*_engine_ms`` are the server's own timings (sampling; admission to answer).

    .venv/bin/python bench/cold_start.py --rounds 3
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from gnnserve.cli import main as gnnserve
from gnnserve.demo import free_port, stop_server, wait_ready


def prepare(workdir: Path, nodes: int) -> tuple[Path, Path]:
    """A fresh store and checkpoint under ``workdir`` (reused when present)."""
    store, ckpt = workdir / "store", workdir / "sage"
    if not store.exists():
        assert gnnserve(["prepare", "sbm", "--nodes", str(nodes), "--out", str(store)]) == 0
    if not ckpt.exists():
        argv = ["train", "--store", str(store), "--arch", "sage", "--layers", "2"]
        argv += ["--epochs", "1", "--fanouts", "10,5", "--out", str(ckpt)]
        assert gnnserve(argv) == 0
    return store, ckpt


def one_round(store: Path, ckpt: Path, fanouts: str, steady: int) -> dict[str, float]:
    """Start a server with an empty numba cache; time the first and the following requests."""
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="numba-cold-") as cache:
        env = {**os.environ, "NUMBA_CACHE_DIR": cache, "PYTHONUNBUFFERED": "1"}
        cmd = [sys.executable, "-m", "gnnserve.cli", "serve", "--store", str(store)]
        cmd += ["--model", str(ckpt), "--port", str(port), "--fanouts", fanouts]
        proc = subprocess.Popen(cmd, env=env, stderr=subprocess.DEVNULL)
        base = f"http://127.0.0.1:{port}"
        try:
            start = time.perf_counter()
            wait_ready(base, proc)
            ready_s = time.perf_counter() - start
            times, sample_ms, server_ms = [], [], []
            with httpx.Client(timeout=60) as client:
                for i in range(steady + 1):
                    t = time.perf_counter()
                    r = client.post(f"{base}/v1/predict", json={"nodes": [(7919 * i) % 1000]})
                    times.append((time.perf_counter() - t) * 1e3)
                    r.raise_for_status()
                    timings = r.json()["timings"]
                    sample_ms.append(timings["sample_ms"])
                    server_ms.append(timings["total_ms"])
        finally:
            stop_server(proc)
    return {
        "ready_s": round(ready_s, 2),
        "first_ms": round(times[0], 1),
        "first_sample_ms": round(sample_ms[0], 1),
        "first_engine_ms": round(server_ms[0], 1),
        "steady_engine_p50_ms": round(statistics.median(server_ms[1:]), 1),
        "steady_p50_ms": round(statistics.median(times[1:]), 1),
        "steady_max_ms": round(max(times[1:]), 1),
    }


def main() -> int:
    """Run the rounds and print one JSON object."""
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--workdir", default=None, help="store + checkpoint (default: a temp dir)")
    p.add_argument("--nodes", type=int, default=20_000, help="SBM nodes")
    p.add_argument("--fanouts", default="10,5")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steady", type=int, default=50, help="requests after the first")
    args = p.parse_args()
    logging.getLogger("httpx").setLevel(logging.WARNING)
    with tempfile.TemporaryDirectory(prefix="gnnserve-cold-") as tmp:
        store, ckpt = prepare(Path(args.workdir or tmp), args.nodes)
        rounds = [one_round(store, ckpt, args.fanouts, args.steady) for _ in range(args.rounds)]
    summary = {k: statistics.median(r[k] for r in rounds) for k in ("first_ms", "steady_p50_ms")}
    print(json.dumps({"rounds": rounds, "median": summary}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
