"""Serving capacity with more processes: `serve --workers N` against N PyG baseline processes.

The HTTP serving benchmark's set-up (bench/serving.py: fb100_cornell5, 128-dim features,
GraphSAGE 2x256, fanouts [25, 10], single-node requests, open-loop Poisson load from this
process, capacity = the highest rate with p99 <= 30 ms and no errors, found by a ladder then
bisection) with ``--workers`` W in 1, 2, ... at 1 torch and 1 numba thread per worker, against
W processes of the PyG + pyg-lib baseline server sharing one port (SO_REUSEPORT), also at 1
thread each. Arms interleaved per round (A B B A order); published: the median capacity per arm,
the ratios W workers / 1 worker and gnnserve / baseline at equal processes, and the best
single-process gnnserve setting (1 or 2 threads) for the ``>= 1.2x`` comparison.

    python bench/cores.py                          # 2 cores here: 1 and 2 workers, 2 rounds
    python bench/cores.py --workers 1,2,4,8,16 --rounds 1 --budget-s 540   # a 16-core machine

``--no-baseline`` runs the gnnserve arms alone, where no PyG sampler can be installed (the lent
GPU machines: no pyg-lib build for their torch; ``bench/cores_device.sh``).
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

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (  # noqa: E402
    fb100_sage,
    find_capacity,
    interleaved_rounds,
    median_range,
    require_baseline,
    result_name,
    write_results,
)
from gnnserve import loadgen  # noqa: E402
from gnnserve.demo import stop_server, wait_ready  # noqa: E402
from gnnserve.ports import free_port  # noqa: E402
from serving import MAX_RPS, P99_BUDGET_MS, passed, step, wait_health  # noqa: E402

BASELINE = str(Path(__file__).with_name("baseline_server.py"))


def _env(threads: int) -> dict[str, str]:
    return {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_WAIT_POLICY": "PASSIVE",
            "NUMBA_NUM_THREADS": str(threads)}  # fmt: skip


def start(side: str, workers: int, threads: int, store: Path, ckpt: Path, port: int) -> list[Any]:
    """The processes of one arm, ready; the first answers on ``port``."""
    common = ["--store", str(store), "--model", str(ckpt), "--port", str(port),
              "--torch-threads", str(threads)]  # fmt: skip
    if side == "gnnserve":
        cmd = [sys.executable, "-m", "gnnserve.cli", "serve", *common, "--fanouts", "25,10",
               "--workers", str(workers)]  # fmt: skip
        proc = subprocess.Popen(cmd, env=_env(threads), stdout=subprocess.DEVNULL)
        wait_ready(f"http://127.0.0.1:{port}", proc, timeout_s=300)
        return [proc]
    cmd = [sys.executable, BASELINE, *common, "--sampler", "pyg-lib", "--reuse-port"]
    procs = [subprocess.Popen(cmd, env=_env(threads)) for _ in range(workers)]
    for proc in procs:  # each answers /health once up; the port is shared
        wait_health(f"http://127.0.0.1:{port}/health", proc, timeout_s=300)
    time.sleep(2.0)  # the last ones to bind: /health may have reached an earlier one
    return procs


def measure(side: str, workers: int, threads: int, data: tuple[Path, Path, int],
            opts: argparse.Namespace, guess: float | None) -> dict[str, Any]:  # fmt: skip
    """Start an arm, warm it, find its capacity, stop it; the record."""
    store, ckpt, num_nodes = data
    port = free_port()
    t0 = time.perf_counter()
    procs = start(side, workers, threads, store, ckpt, port)
    url = f"http://127.0.0.1:{port}/" + ("v1/predict" if side == "gnnserve" else "predict")
    rows: list[dict[str, float]] = []
    try:
        asyncio.run(loadgen.closed_loop(url, [{"nodes": [i]} for i in range(400)], 16))

        def passes(rate: float) -> bool:
            rows.append(step(url, num_nodes, round(rate, 1), opts.duration))
            return passed(rows[-1])

        start_rate, factor = (guess, 1.2) if guess else (100.0, 2.0)
        cap = find_capacity(passes, start_rate, factor, opts.tolerance, 10.0, MAX_RPS)
    finally:
        for proc in procs:
            stop_server(proc, timeout_s=120)
    print(f"  {side} x{workers} @{threads} thr: {cap.rate:.0f}/s "
          f"({time.perf_counter() - t0:.0f} s)", flush=True)  # fmt: skip
    return {"side": side, "workers": workers, "threads": threads, "capacity_rps": cap.rate,
            "first_fail_rps": cap.first_fail, "probes": rows}  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--workers", default="1,2", help="worker (process) counts")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--duration", type=float, default=3.0, help="seconds per ladder step")
    p.add_argument("--tolerance", type=float, default=0.1)
    p.add_argument("--budget-s", type=float, default=540.0, help="no round starts past this")
    p.add_argument("--quick", action="store_true", help="1 round, 1 s steps, 30%% tolerance")
    p.add_argument("--no-baseline", action="store_true", help="gnnserve arms only")
    opts = p.parse_args()
    if opts.quick:
        opts.rounds, opts.duration, opts.tolerance = 1, 1.0, 0.3
    counts = [int(w) for w in opts.workers.split(",")]
    sides = ("gnnserve",) if opts.no_baseline else ("gnnserve", "baseline")
    if not opts.no_baseline:
        require_baseline()
    t0 = time.perf_counter()
    records: dict[str, list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        data = fb100_sage(Path(tmp), "random init for the cores benchmark")
        arms = {}
        plan = [(side, w, 1) for w in counts for side in sides]
        plan.append(("gnnserve", 1, 2))  # the best single process may use both cores
        for side, w, t in plan:
            key = f"{side}x{w}@{t}"
            records[key] = []

            def arm(side: str = side, w: int = w, t: int = t, key: str = key) -> float:
                done = [r["capacity_rps"] for r in records[key] if r["capacity_rps"]]
                guess = float(np.median(done)) if done else None
                records[key].append(measure(side, w, t, data, opts, guess))
                return float(records[key][-1]["capacity_rps"])

            arms[key] = arm
        marks = [time.perf_counter()]

        def on_round(r: int, _v: dict[str, float]) -> None:
            marks.append(time.perf_counter())
            print(f"round {r + 1} done in {marks[-1] - marks[-2]:.0f} s", flush=True)

        def keep_going(done: int) -> bool:
            return marks[-1] - t0 + (marks[-1] - marks[-2]) <= opts.budget_s

        interleaved_rounds(arms, opts.rounds, on_round, keep_going)
    capacity = {k: median_range([r["capacity_rps"] for r in v]) for k, v in records.items()}
    med = {k: v["median"] for k, v in capacity.items()}
    one = med["gnnservex1@1"]
    best_single = max(med["gnnservex1@1"], med["gnnservex1@2"])
    summary = {
        "capacity_rps": capacity,
        "speedup_over_one_worker": {w: med[f"gnnservex{w}@1"] / one for w in counts},
        "over_best_single_process": {w: med[f"gnnservex{w}@1"] / best_single for w in counts},
        "over_baseline_equal_processes": None
        if opts.no_baseline
        else {w: med[f"gnnservex{w}@1"] / med[f"baselinex{w}@1"] for w in counts},
    }
    payload = {"p99_budget_ms": P99_BUDGET_MS, "workers": counts, "rounds": opts.rounds,
               "rounds_completed": len(records["gnnservex1@1"]), "duration_s_per_rate":
               opts.duration, "tolerance": opts.tolerance, "cpus": os.cpu_count(),
               "wall_s": round(time.perf_counter() - t0, 1), "quick": opts.quick, **summary,
               "records": records}  # fmt: skip
    name = result_name("cores", opts.quick) + (
        "" if os.cpu_count() == 2 else f"_{os.cpu_count()}cpu"
    )
    out = write_results(name, payload)
    for key, value in sorted(med.items()):
        print(f"{key:18s} {value:8.0f}/s")
    versus = summary["over_baseline_equal_processes"]
    for w in counts:
        baseline = f", {versus[w]:.2f}x the baseline at {w} processes" if versus else ""
        print(f"{w} workers: {summary['speedup_over_one_worker'][w]:.2f}x one worker, "
              f"{summary['over_best_single_process'][w]:.2f}x the best single process"
              f"{baseline}")  # fmt: skip
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
