"""Cold start: the first request after ``/v2/health/ready``, with and without the start-up warm-up.

A fresh SBM store and a small GraphSAGE checkpoint; each round starts ``gnnserve serve`` twice
(``--no-warm-up`` and the default), in alternating order, each with an empty ``NUMBA_CACHE_DIR``
so that no kernel comes from numba's on-disk cache (as on a new machine or for a store with new
index dtypes). Per server: the time from launch to ready, the first ``/v1/predict`` (one node)
after ready, then ``STEADY`` more requests. Latencies are client round trips in ms;
``first_sample_ms`` is the server's own sampling time of the first request. Published: medians
over rounds with their ranges; the target is the first request against the steady p50, with the
warm-up (the no-warm-up server is the baseline of the same run).

    python bench/cold_start.py            # 3 rounds (~5 min)
    python bench/cold_start.py --quick    # 1 round, smaller graph (results/cold_start_quick.json)
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

import gnnserve  # noqa: F401  (first: sets the OpenMP wait policy)

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (  # noqa: E402
    Targets,
    fmt_range,
    interleaved_rounds,
    median_range,
    result_name,
    save_figure,
    write_results,
)
from gnnserve.cli import main as gnnserve_cli  # noqa: E402
from gnnserve.demo import stop_server, wait_ready  # noqa: E402
from gnnserve.ports import free_port  # noqa: E402

STEADY = 50  # requests after the first
FANOUTS = "10,5"
ARMS = {"no_warm_up": ["--no-warm-up"], "warm_up": []}
GOAL_FIRST_OVER_STEADY = 3.0


def prepare(workdir: Path, nodes: int) -> tuple[Path, Path]:
    """A fresh SBM store and a 1-epoch GraphSAGE checkpoint under ``workdir``."""
    store, ckpt = workdir / "store", workdir / "sage"
    assert gnnserve_cli(["prepare", "sbm", "--nodes", str(nodes), "--out", str(store)]) == 0
    argv = ["train", "--store", str(store), "--arch", "sage", "--layers", "2"]
    argv += ["--epochs", "1", "--fanouts", FANOUTS, "--out", str(ckpt)]
    assert gnnserve_cli(argv) == 0
    return store, ckpt


def one_server(store: Path, ckpt: Path, flags: list[str]) -> dict[str, float]:
    """Start a server with an empty numba cache; time ready, the first and later requests."""
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="numba-cold-") as cache:
        env = {**os.environ, "NUMBA_CACHE_DIR": cache, "PYTHONUNBUFFERED": "1"}
        cmd = [sys.executable, "-m", "gnnserve.cli", "serve", "--store", str(store)]
        cmd += ["--model", str(ckpt), "--port", str(port), "--fanouts", FANOUTS, *flags]
        proc = subprocess.Popen(cmd, env=env, stderr=subprocess.DEVNULL)
        base = f"http://127.0.0.1:{port}"
        try:
            start = time.perf_counter()
            wait_ready(base, proc, timeout_s=600)
            ready_s = time.perf_counter() - start
            times, sample_ms = [], []
            with httpx.Client(timeout=600) as client:
                for i in range(STEADY + 1):
                    t = time.perf_counter()
                    r = client.post(f"{base}/v1/predict", json={"nodes": [(7919 * i) % 1000]})
                    times.append((time.perf_counter() - t) * 1e3)
                    r.raise_for_status()
                    sample_ms.append(r.json()["timings"]["sample_ms"])
        finally:
            stop_server(proc)
    steady = statistics.median(times[1:])
    return {
        "ready_s": ready_s,
        "first_ms": times[0],
        "first_sample_ms": sample_ms[0],
        "steady_p50_ms": steady,
        "first_over_steady": times[0] / steady,
    }


def plot(summary: dict[str, dict[str, dict[str, Any]]], path: Path) -> None:
    """First request and steady p50 (log scale), and time to ready, per arm with ranges."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    arms = list(summary)
    for k, key in enumerate(("first_ms", "steady_p50_ms")):
        med = [summary[a][key]["median"] for a in arms]
        err = [
            [m - summary[a][key]["min"] for a, m in zip(arms, med, strict=True)],
            [summary[a][key]["max"] - m for a, m in zip(arms, med, strict=True)],
        ]
        xs = [i + 0.4 * k for i in range(len(arms))]
        left.bar(xs, med, 0.4, yerr=err, capsize=4, label=key.replace("_", " "))
    left.set(yscale="log", ylabel="ms (client round trip)", title="after /v2/health/ready")
    left.set_xticks([i + 0.2 for i in range(len(arms))], arms)
    left.legend()
    med = [summary[a]["ready_s"]["median"] for a in arms]
    right.bar(arms, med, 0.5)
    right.set(ylabel="s from launch to ready", title="time to ready (empty numba cache)")
    save_figure(fig, path)


def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--quick", action="store_true", help="1 round on a 5,000-node graph")
    args = p.parse_args()
    logging.getLogger("httpx").setLevel(logging.WARNING)
    rounds, nodes = (1, 5_000) if args.quick else (3, 20_000)
    runs: dict[str, list[dict[str, float]]] = {a: [] for a in ARMS}
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="gnnserve-cold-") as tmp:
        store, ckpt = prepare(Path(tmp), nodes)

        def arm(name: str) -> Any:
            def go() -> float:
                row = one_server(store, ckpt, ARMS[name])
                runs[name].append(row)
                print(f"  {name:10s} " + "  ".join(f"{k} {v:.1f}" for k, v in row.items()))
                return row["first_ms"]

            return go

        interleaved_rounds({a: arm(a) for a in ARMS}, rounds)
    keys = ("ready_s", "first_ms", "first_sample_ms", "steady_p50_ms", "first_over_steady")
    summary = {a: {k: median_range([r[k] for r in rows]) for k in keys} for a, rows in runs.items()}
    out = write_results(
        result_name("cold_start", args.quick),
        {
            "quick": args.quick,
            "nodes": nodes,
            "fanouts": FANOUTS,
            "steady_requests": STEADY,
            "rounds": rounds,
            "runs": runs,
            "summary": summary,
            "wall_s": round(time.perf_counter() - started, 1),
        },
    )
    plot(summary, out.with_suffix(".png"))
    for a in ARMS:
        s = summary[a]
        print(
            f"{a}: ready {fmt_range(s['ready_s'], '.1f')} s, first request "
            f"{fmt_range(s['first_ms'], '.1f')} ms (sampling {fmt_range(s['first_sample_ms'])} "
            f"ms), steady p50 {fmt_range(s['steady_p50_ms'], '.2f')} ms"
        )
    print(f"wrote {out} and {out.with_suffix('.png')}")
    targets = Targets()
    warm = summary["warm_up"]["first_over_steady"]["median"]
    targets.check("cold_start_first_over_steady_p50", warm, GOAL_FIRST_OVER_STEADY, False)
    targets.print()


if __name__ == "__main__":
    main()
