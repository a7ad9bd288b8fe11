"""HTTP capacity through ``serve --device cuda`` against the CPU path on one machine (issue 46).

The HTTP serving benchmark's set-up (bench/serving.py: fb100_cornell5 with 128-dim features,
GraphSAGE 2x256, fanouts [25, 10], single-node requests, open-loop Poisson load from this
process; capacity = the highest rate with p99 <= 30 ms and no errors, a ladder then bisection),
two arms of one ``serve`` process each with the same flags but ``--device``:

- ``cpu``: the default CPU path (numba kernels on every core, torch's default threads);
- ``cuda``: routed batches (past the inline path) sampled, gathered and run on the GPU.

Arms interleave per round. ``python bench/gpu_serve.py [--rounds N] [--duration S]``; writes
``results/gpu_serve.json``. Run by ``bench/gpu_device.sh`` on a lent GPU machine.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (  # noqa: E402  # noqa: E402
    fb100_sage,
    find_capacity,
    interleaved_rounds,
    median_range,
    strict,
    write_results,
)
from gnnserve import loadgen  # noqa: E402
from gnnserve.demo import stop_server, wait_ready  # noqa: E402
from gnnserve.ports import free_port  # noqa: E402
from serving import MAX_RPS, P99_BUDGET_MS, passed, step  # noqa: E402

ARMS = ("cpu", "cuda")


def measure(device: str, data: tuple[Path, Path, int], opts: argparse.Namespace,
            guess: float | None) -> dict[str, Any]:  # fmt: skip
    """Start ``serve --device device``, warm it, find its capacity, stop it; the record."""
    store, ckpt, num_nodes = data
    port = free_port()
    cmd = [sys.executable, "-m", "gnnserve.cli", "serve", "--store", str(store), "--model",
           str(ckpt), "--port", str(port), "--fanouts", "25,10", "--device", device,
           "--torch-threads", str(opts.torch_threads)]  # fmt: skip
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    rows: list[dict[str, float]] = []
    try:
        wait_ready(f"http://127.0.0.1:{port}", proc, timeout_s=240)
        url = f"http://127.0.0.1:{port}/v1/predict"
        asyncio.run(loadgen.closed_loop(url, [{"nodes": [i]} for i in range(400)], 16))

        def passes(rate: float) -> bool:
            rows.append(step(url, num_nodes, round(rate, 1), opts.duration))
            print(f"  {device} {rate:.0f}/s: p99 {rows[-1]['p99_ms']:.1f} ms", flush=True)
            return passed(rows[-1])

        start, factor = (guess, 1.2) if guess else (200.0, 2.0)
        cap = find_capacity(passes, start, factor, opts.tolerance, 10.0, opts.max_rps)
    finally:
        stop_server(proc, timeout_s=60)
    print(f"{device}: {cap.rate:.0f}/s ({time.perf_counter() - t0:.0f} s)", flush=True)
    return {"device": device, "capacity_rps": cap.rate, "first_fail_rps": cap.first_fail,
            "probes": rows}  # fmt: skip


def main() -> None:
    """Both arms, interleaved rounds; the JSON under results/."""
    p = argparse.ArgumentParser(description=(main.__doc__ or "").splitlines()[0])
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--duration", type=float, default=2.0, help="seconds per ladder step")
    p.add_argument("--tolerance", type=float, default=0.15)
    p.add_argument("--torch-threads", type=int, default=1, help="serve --torch-threads")
    p.add_argument("--max-rps", type=float, default=MAX_RPS)
    opts = p.parse_args()
    if not torch.cuda.is_available():
        sys.exit("gpu_serve.py needs a CUDA GPU")
    records: dict[str, list[dict[str, Any]]] = {arm: [] for arm in ARMS}
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        data = fb100_sage(Path(tmp), "random init for the GPU serving benchmark")

        def arm(device: str) -> float:
            done = [r["capacity_rps"] for r in records[device] if r["capacity_rps"]]
            guess = sorted(done)[len(done) // 2] if done else None
            records[device].append(measure(device, data, opts, guess))
            return float(records[device][-1]["capacity_rps"])

        interleaved_rounds({a: lambda a=a: arm(a) for a in ARMS}, opts.rounds)
    capacity = {k: median_range([r["capacity_rps"] for r in v]) for k, v in records.items()}
    ratio = capacity["cuda"]["median"] / max(capacity["cpu"]["median"], 1e-9)
    payload = {"gpu": torch.cuda.get_device_name(0), "cpus": os.cpu_count(),
               "p99_budget_ms": P99_BUDGET_MS, "rounds": opts.rounds, "duration_s_per_rate":
               opts.duration, "tolerance": opts.tolerance, "torch_threads": opts.torch_threads,
               "capacity_rps": capacity, "cuda_over_cpu": ratio,
               "wall_s": round(time.perf_counter() - t0, 1), "records": records}  # fmt: skip
    print(f"cuda / cpu capacity: {ratio:.2f}x; wrote {write_results('gpu_serve', strict(payload))}")


if __name__ == "__main__":
    main()
