"""HTTP serving load: `gnnserve serve` vs the PyG baseline server (bench/baseline_server.py).

The baseline samples with pyg-lib, as PyG users do; the same server on PyG's deprecated
torch-sparse fallback runs beside it at the largest thread count (``baseline_torch_sparse``,
labelled, never the headline; ``--no-fallback`` skips it).

GraphSAGE, 2 layers, hidden 256, fanouts [25, 10], single-node requests on fb100_cornell5 with
128-dim random features (both servers load the same store and checkpoint; weights are a seeded
random init: throughput does not depend on their values). Open-loop Poisson load from this
process, one server at a time.

Each side runs at 1 and at 2 torch intra-op threads (``--threads``; numba gets the same count
through NUMBA_NUM_THREADS, OMP_WAIT_POLICY=PASSIVE on both) and is reported at its best setting
(the higher median capacity), saying which. A session starts a fresh server, warms it (200
requests, 8 concurrent), measures p99 at a fixed load both sustain (``FIXED_RPS``), then finds
its capacity, the highest rate with p99 <= 30 ms and no errors: a coarse ladder (x2 from 100/s;
later rounds x1.2 from the median so far) then bisection until the first failing rate is within
10% of the last passing one. Rounds alternate the servers (A B B A order); published: median
over rounds with the range (min-max), and the throughput ratio as the median of per-round
ratios at each side's best thread setting. No round starts that would end past 540 s (the
JSON's ``rounds_completed`` says how many ran).

    python bench/serving.py            # full run: 3 rounds (< 10 min), results/serving.json
    python bench/serving.py --quick    # smoke run: 2 rounds, 1 s steps, serving_quick.json
    python bench/serving.py --protocols  # one request over HTTP JSON, HTTP binary and gRPC
                                         # (bench/serving_protocols.py), serving_protocols.json
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

import gnnserve  # noqa: F401  (first: sets the OpenMP wait policy)

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (  # noqa: E402
    Targets,
    fb100_sage,
    find_capacity,
    fmt_range,
    interleaved_rounds,
    median_range,
    ratios,
    require_baseline,
    result_name,
    save_figure,
    write_results,
)
from gnnserve import loadgen  # noqa: E402
from gnnserve.demo import stop_server, wait_ready  # noqa: E402
from gnnserve.ports import free_port  # noqa: E402

P99_BUDGET_MS = 30.0
FIXED_RPS = 100.0  # below both servers' capacity on the 2-core reference machine
START_RPS = 100.0  # first rung of the first round's ladder
MAX_RPS = 4000.0  # the in-process load generator's ceiling on 2 cores
SIDES = ("baseline", "gnnserve")  # the headline pair: the baseline samples with pyg-lib
FALLBACK = "baseline_torch_sparse"  # the same baseline on PyG's deprecated torch-sparse sampler


def launch(side: str, store: Path, ckpt: Path, port: int, threads: int) -> subprocess.Popen[bytes]:
    """Start one server on loopback with ``threads`` torch (and numba) threads."""
    common_args = ["--store", str(store), "--model", str(ckpt), "--port", str(port)]
    if side == "gnnserve":
        cmd = [sys.executable, "-m", "gnnserve.cli", "serve", *common_args, "--fanouts", "25,10"]
    else:
        sampler = "torch-sparse" if side == FALLBACK else "pyg-lib"
        script = str(Path(__file__).with_name("baseline_server.py"))
        cmd = [sys.executable, script, *common_args, "--sampler", sampler]
    env = {
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        "OMP_WAIT_POLICY": "PASSIVE",
        "NUMBA_NUM_THREADS": str(threads),
    }
    return subprocess.Popen([*cmd, "--torch-threads", str(threads)], env=env)


def wait_health(
    url: str, proc: subprocess.Popen[bytes], timeout_s: float = 120.0
) -> dict[str, Any]:
    """Poll the baseline's ``url`` until it answers 200; return its JSON body."""
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"baseline exited with {proc.returncode}")
        try:
            resp = httpx.get(url, timeout=1)
            if resp.status_code == 200:
                return dict(resp.json())
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise RuntimeError("baseline not ready")


def step(url: str, num_nodes: int, rate: float, duration: float) -> dict[str, float]:
    """One open-loop run at ``rate`` requests/s for ``duration`` s; its summary row."""
    seed = int(rate * 10)
    nodes = np.random.default_rng(seed).integers(0, num_nodes, int(rate * duration) + 1)
    report = asyncio.run(
        loadgen.open_loop(url, lambda i: {"nodes": [int(nodes[i])]}, rate, duration, seed=seed)
    )
    return report.summary()


def passed(row: dict[str, float]) -> bool:
    """Within budget: p99 <= 30 ms and no errors."""
    return row["p99_ms"] <= P99_BUDGET_MS and not row["errors"]


class Session:
    """One server start: warm-up, p99 at ``FIXED_RPS``, capacity search; the record of it all."""

    def __init__(self, store: Path, ckpt: Path, num_nodes: int, opts: argparse.Namespace) -> None:
        self.store, self.ckpt, self.num_nodes, self.opts = store, ckpt, num_nodes, opts

    def run(self, side: str, threads: int, guess: float | None) -> dict[str, Any]:
        """Start ``side`` at ``threads``, measure, stop; ``guess``: capacity so far (or None)."""
        t0 = time.perf_counter()
        port = free_port()
        proc = launch(side, self.store, self.ckpt, port, threads)
        base = f"http://127.0.0.1:{port}"
        record: dict[str, Any] = {"side": side, "torch_threads": threads}
        try:
            if side == "gnnserve":
                wait_ready(base, proc)
                url = f"{base}/v1/predict"
            else:
                health = wait_health(f"{base}/health", proc)
                record["reported_torch_threads"] = health.get("torch_threads")
                record["sampler"] = health.get("sampler")
                url = f"{base}/predict"
            record["start_s"] = round(time.perf_counter() - t0, 1)
            asyncio.run(loadgen.closed_loop(url, [{"nodes": [i]} for i in range(200)], 8))
            record["fixed_load"] = step(url, self.num_nodes, FIXED_RPS, self.opts.duration)
            rows: list[dict[str, float]] = []

            def passes(rate: float) -> bool:
                rows.append(step(url, self.num_nodes, round(rate, 1), self.opts.duration))
                return passed(rows[-1])

            start, factor = (guess, 1.2) if guess else (START_RPS, 2.0)
            cap = find_capacity(
                passes, start, factor, self.opts.tolerance, min_rate=10.0, max_rate=MAX_RPS
            )
        finally:
            stop_server(proc)
        fail_rps = round(cap.first_fail, 1) if cap.first_fail else None
        record.update(capacity_rps=round(cap.rate, 1), first_fail_rps=fail_rps, probes=rows)
        record["wall_s"] = round(time.perf_counter() - t0, 1)
        fail = f"{cap.first_fail:.0f}/s" if cap.first_fail else "none"
        if not cap.rate:
            print(
                f"  warning: no rate down to 10/s kept p99 <= {P99_BUDGET_MS:.0f} ms "
                "(is the machine busy?)"
            )
        print(
            f"  {side:8s} @{threads} thr: capacity {cap.rate:7.1f}/s (first fail {fail}), "
            f"p99 at {FIXED_RPS:.0f}/s {record['fixed_load']['p99_ms']:6.2f} ms, "
            f"{len(rows)} steps, {record['wall_s']:.0f} s",
            flush=True,
        )
        return record


def summarise(
    sessions: dict[str, list[dict[str, Any]]], opts: argparse.Namespace
) -> dict[str, Any]:
    """Per config: capacity and fixed-load p99 (median, range); each side's best; the ratio."""
    configs = {}
    for key, recs in sessions.items():
        configs[key] = {
            "side": recs[0]["side"],
            "torch_threads": recs[0]["torch_threads"],
            "numba_threads": recs[0]["torch_threads"],
            "capacity_rps": median_range([r["capacity_rps"] for r in recs]),
            "fixed_load_p99_ms": median_range([r["fixed_load"]["p99_ms"] for r in recs]),
            "sessions": recs,
        }
    best = {
        side: max(
            (k for k in configs if configs[k]["side"] == side),
            key=lambda k: configs[k]["capacity_rps"]["median"],
        )
        for side in SIDES
    }
    cap = {side: configs[best[side]]["capacity_rps"] for side in SIDES}
    fallback = [k for k in configs if configs[k]["side"] == FALLBACK]
    beside = {}
    if fallback:
        fb = configs[fallback[0]]["capacity_rps"]
        n = len(fb["rounds"])
        beside = {
            FALLBACK: {
                "config": fallback[0],
                "capacity_rps": fb,
                "gnnserve_ratio": median_range(ratios(cap["gnnserve"]["rounds"][:n], fb["rounds"])),
                "note": "PyG's deprecated torch-sparse sampler, reported beside the headline",
            }
        }
    return {
        "threads": {
            side: {
                "tried_torch_threads": opts.threads,
                "numba_threads": "same as torch (NUMBA_NUM_THREADS)",
                "best_torch_threads": configs[best[side]]["torch_threads"],
            }
            for side in SIDES
        },
        "capacity_rps": cap,
        "throughput_ratio": median_range(
            ratios(cap["gnnserve"]["rounds"], cap["baseline"]["rounds"])
        ),
        "fixed_load_rps": FIXED_RPS,
        "fixed_load_p99_ms": {side: configs[best[side]]["fixed_load_p99_ms"] for side in SIDES},
        "beside": beside,
        "configs": configs,
    }


def plot(summary: dict[str, Any], path: Path) -> None:
    """Left: capacity per side and thread count (median, min-max); right: p99 per probe."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    keys = list(summary["configs"])
    caps = [summary["configs"][k]["capacity_rps"] for k in keys]
    err = np.array([[c["median"] - c["min"] for c in caps], [c["max"] - c["median"] for c in caps]])
    left.bar(keys, [c["median"] for c in caps], yerr=err, capsize=4, color="tab:blue")
    for i, c in enumerate(caps):
        text = f"{c['median']:.0f}\n({c['min']:.0f}-{c['max']:.0f})"
        left.annotate(text, (i, c["max"]), textcoords="offset points", xytext=(0, 4), ha="center")
    left.set_ylim(0, 1.2 * max(c["max"] for c in caps) or 1.0)
    left.set(
        ylabel="requests/s at p99 <= 30 ms", title="capacity: median, bars min-max over rounds"
    )
    left.tick_params(axis="x", labelrotation=20)
    for k in keys:
        probes = [p for s in summary["configs"][k]["sessions"] for p in s["probes"]]
        right.scatter(
            [p["offered_rps"] for p in probes], [p["p99_ms"] for p in probes], s=12, label=k
        )
    right.axhline(P99_BUDGET_MS, color="grey", ls=":", label="p99 budget 30 ms")
    right.set(
        xscale="log",
        yscale="log",
        xlabel="offered load (requests/s)",
        ylabel="p99 latency (ms)",
        title="every ladder step, all rounds",
    )
    right.legend(fontsize=7)
    fig.suptitle("single-node requests, GraphSAGE 2x256, fanouts [25, 10]", fontsize=10)
    save_figure(fig, path)


def parse() -> argparse.Namespace:
    """Flags; then a check that the PyG baseline runs."""
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--quick", action="store_true", help="smoke run: 2 rounds, 1 s steps, 30%%")
    p.add_argument("--rounds", type=int, default=None, help="rounds (default 3; quick 2)")
    p.add_argument("--threads", default="1,2", help="torch thread counts tried on both sides")
    p.add_argument(
        "--no-fallback", action="store_true", help="skip the torch-sparse baseline beside it"
    )
    p.add_argument(
        "--protocols",
        action="store_true",
        help="only the per-call latency of one request over each protocol (no baseline)",
    )
    args = p.parse_args()
    if args.protocols:
        return args
    args.threads = [int(t) for t in args.threads.split(",")]
    args.rounds = args.rounds or (2 if args.quick else 3)
    args.duration = 1.0 if args.quick else 4.0  # seconds per ladder step
    args.tolerance = 0.3 if args.quick else 0.1  # capacity known within this fraction
    args.budget_s = 540.0  # no round starts that would end past this (the run stays < 10 min)
    require_baseline()
    return args


def main() -> None:
    opts = parse()
    if opts.protocols:
        import serving_protocols

        serving_protocols.main(opts.quick)
        return
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        session = Session(*fb100_sage(Path(tmp), "random init for the serving benchmark"), opts)
        sessions: dict[str, list[dict[str, Any]]] = {}
        arms = {}
        for t in opts.threads:  # the two servers next to each other at each thread count
            for side in SIDES:
                key = f"{side}@{t}"
                sessions[key] = []

                def arm(side: str = side, t: int = t, key: str = key) -> float:
                    done = [r["capacity_rps"] for r in sessions[key] if r["capacity_rps"]]
                    sessions[key].append(session.run(side, t, np.median(done) if done else None))
                    return float(sessions[key][-1]["capacity_rps"])

                arms[key] = arm
        if not opts.no_fallback:
            key = f"{FALLBACK}@{max(opts.threads)}"
            sessions[key] = []

            def fallback_arm(key: str = key) -> float:
                sessions[key].append(session.run(FALLBACK, max(opts.threads), None))
                return float(sessions[key][-1]["capacity_rps"])

            arms[key] = fallback_arm
        marks = [time.perf_counter()]

        def on_round(r: int, _v: dict[str, float]) -> None:
            marks.append(time.perf_counter())
            print(f"round {r + 1}/{opts.rounds} done in {marks[-1] - marks[-2]:.0f} s", flush=True)

        def keep_going(done: int) -> bool:  # the last round's length predicts the next one's
            ok = marks[-1] - t0 + (marks[-1] - marks[-2]) <= opts.budget_s
            if not ok:
                print(f"stopping after {done} rounds: another would pass {opts.budget_s:.0f} s")
            return ok

        interleaved_rounds(arms, opts.rounds, on_round, keep_going)
    summary = summarise(sessions, opts)
    payload = {
        "p99_budget_ms": P99_BUDGET_MS,
        "duration_s_per_rate": opts.duration,
        "capacity_tolerance": opts.tolerance,
        "rounds": opts.rounds,
        "rounds_completed": len(next(iter(sessions.values()))),
        "budget_s": opts.budget_s,
        "quick": opts.quick,
        "wall_s": round(time.perf_counter() - t0, 1),
        **summary,
    }
    out = write_results(result_name("serving", opts.quick), payload)
    plot(summary, out.with_suffix(".png"))
    best = {s: summary["threads"][s]["best_torch_threads"] for s in SIDES}
    cap, p99 = summary["capacity_rps"], summary["fixed_load_p99_ms"]
    done = payload["rounds_completed"]
    print(
        f"capacity at p99 <= {P99_BUDGET_MS:.0f} ms (median [min-max] of {done} rounds, "
        f"each side at its best thread count): gnnserve {fmt_range(cap['gnnserve'], '.0f')}/s "
        f"@{best['gnnserve']} thr, baseline {fmt_range(cap['baseline'], '.0f')}/s "
        f"@{best['baseline']} thr, ratio {fmt_range(summary['throughput_ratio'], '.1f', 'x')}"
    )
    print(
        f"p99 at {FIXED_RPS:.0f}/s: gnnserve {fmt_range(p99['gnnserve'], '.2f')} ms, "
        f"baseline {fmt_range(p99['baseline'], '.2f')} ms"
    )
    if summary["beside"]:
        fb = summary["beside"][FALLBACK]
        print(
            f"beside it: the baseline on torch-sparse ({fb['config']}) "
            f"{fmt_range(fb['capacity_rps'], '.0f')}/s, gnnserve "
            f"{fmt_range(fb['gnnserve_ratio'], '.1f', 'x')} that"
        )
    print(f"wrote {out} and {out.with_suffix('.png')} ({payload['wall_s']:.0f} s)")
    targets = Targets()
    targets.check(
        "serving_throughput_ratio_at_p99_30ms_median", summary["throughput_ratio"]["median"], 5.0
    )
    targets.print()


if __name__ == "__main__":
    main()
