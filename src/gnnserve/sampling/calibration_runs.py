"""Calibration runs: the batches of each PSGS bucket, run end to end through each sampling path,
and the plot of the resulting profile (the profile and its curves: :mod:`.calibrate`)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch

from gnnserve.errors import InvalidInputError
from gnnserve.features.base import FeatureStore
from gnnserve.graph.base import GraphStore
from gnnserve.sampling.calibrate import POINTS, CalibrationProfile, Identity, fit_curve
from gnnserve.sampling.metrics import psgs
from gnnserve.sampling.paths import build_path, throughput_path
from gnnserve.types import MiniBatch


def p99_confidence(runs: int) -> float:
    """Probability that the max of ``runs`` independent runs is at least their p99:
    1 - 0.99^runs (10 runs: 9.6%; 69: 50%; 230: 90%)."""
    return 1.0 - 0.99**runs


def runs_for(confidence: float) -> int:
    """Runs per bucket whose max bounds the p99 with ``confidence`` (in (0, 1))."""
    if not 0 < confidence < 1:
        raise InvalidInputError(f"confidence must be in (0, 1), got {confidence}", "confidence")
    return math.ceil(math.log(1 - confidence) / math.log(0.99))


def point_intervals(
    profile: CalibrationProfile, rng: np.random.Generator, rounds: int = 200
) -> dict[str, list[float]]:
    """5th and 95th percentile of each crossover point over ``rounds`` bootstrap resamples of
    every bucket's runs (refitted): how far the measured noise moves the points."""
    a, b = profile.path_a, profile.path_b
    found: dict[str, list[float]] = {k: [] for k in POINTS}
    for _ in range(rounds):
        curves = {}
        for p in (a, b):
            c = profile.curves[p]
            resampled = [list(rng.choice(r, len(r))) for r in c.runs_ms]
            curves[p] = fit_curve(c.psgs, resampled, p)[0]
        again = CalibrationProfile(profile.identity, a, b, curves)
        again.compute_points()
        for k, v in again.points.items():
            found[k].append(v)
    # order statistics, not interpolation: a point may be inf (the curves do not cross)
    low, high = (partial(np.percentile, q=q, method=m) for q, m in ((5, "lower"), (95, "higher")))
    return {k: [float(low(v)), float(high(v))] for k, v in found.items()}


def bucket_batches(
    cost: np.ndarray, buckets: int, runs: int, max_seeds: int, rng: np.random.Generator
) -> list[list[np.ndarray]]:
    """``runs`` random seed batches (int64, distinct) per bucket; the bucket targets are
    geometric from one median seed's PSGS to ``max_seeds`` mean seeds' (capped at all nodes)."""
    n = cost.size
    lo = float(np.median(cost))
    hi = min(float(cost.mean()) * max_seeds, float(cost.sum()))
    targets = np.geomspace(lo, max(hi, lo), buckets)
    out: list[list[np.ndarray]] = []
    for target in targets:
        batches = []
        for _ in range(runs):
            perm = rng.permutation(n)[: min(n, 4 * max_seeds)]
            k = int(np.searchsorted(np.cumsum(cost[perm]), target)) + 1
            batches.append(perm[: min(k, perm.size)].astype(np.int64))
        out.append(batches)
    return out


def run_batch(
    sampler: Any, graph: GraphStore, features: FeatureStore, forward: Callable, seeds: np.ndarray
) -> float:
    """ms of one batch end to end: sample -> feature gather (+ GCN degrees) -> model forward."""
    start = time.perf_counter()
    subgraph = sampler.sample_valid(seeds)
    ids = subgraph.input_nodes
    x = features.get_valid(ids)
    forward(MiniBatch(subgraph, x, torch.from_numpy(graph.gcn_degree(ids))))
    return (time.perf_counter() - start) * 1e3


def measure(
    graph: GraphStore,
    features: FeatureStore,
    forward: Callable[[MiniBatch], object],
    identity: Identity,
    buckets: int = 12,
    runs: int = 10,
    max_seeds: int = 1024,
    seed: int = 0,
    progress: Callable[[str], None] | None = None,
    throughput: str | None = None,
    concurrency: int = 1,
) -> CalibrationProfile:
    """Calibrate the latency path (inline) against the ``throughput`` path (default
    :func:`throughput_path`: cuda where present, else parallel) on ``graph`` with
    ``identity.fanouts``: every batch through both paths, the paths alternating bucket by
    bucket, after one untimed warm-up pass of the smallest and largest batches.
    ``concurrency``: batches of a bucket run at once (threads), so the curves are measured
    with the processors as busy as a server running that many batches keeps them."""
    fanouts = identity.fanouts
    cost = psgs(graph, fanouts)
    plan = bucket_batches(cost, buckets, runs, max_seeds, np.random.default_rng(seed))
    names = ["inline", throughput or throughput_path()]
    if names[1] == "inline":
        raise InvalidInputError("the throughput path must not be inline itself", "throughput")
    samplers = {p: build_path(p, graph, fanouts, seed, cost) for p in names}
    for sampler in samplers.values():
        for seeds in (plan[0][0], plan[-1][0]):
            run_batch(sampler, graph, features, forward, seeds)
    runs_ms: dict[str, list[list[float]]] = {p: [] for p in names}
    xs = []
    pool = ThreadPoolExecutor(concurrency, thread_name_prefix="calibrate")
    for i, batches in enumerate(plan):
        times: dict[str, list[float]] = {}
        for p in names:
            run = partial(run_batch, samplers[p], graph, features, forward)
            times[p] = list(pool.map(run, batches))
        xs.append(float(np.mean([cost[s].sum() for s in batches])))
        for p in names:
            runs_ms[p].append(times[p])
        if progress is not None:
            shown = ", ".join(f"{p} {np.mean(t):.2f}/{np.max(t):.2f}" for p, t in times.items())
            progress(
                f"bucket {i + 1}/{len(plan)}: PSGS {xs[-1]:.0f} "
                f"({np.mean([s.size for s in batches]):.0f} seeds), ms mean/max: {shown}"
            )
    fitted = {p: fit_curve(xs, rs, p) for p, rs in runs_ms.items()}
    curves = {p: curve for p, (curve, _) in fitted.items()}
    created = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    profile = CalibrationProfile(identity, names[0], names[1], curves, {}, runs, created)
    pool.shutdown()
    profile.warnings = [w for _, found in fitted.values() for w in found]
    profile.concurrency = concurrency
    profile.p99_confidence = p99_confidence(runs)
    profile.intervals = point_intervals(profile, np.random.default_rng(seed))
    profile.compute_points()
    return profile


def plot_profile(profile: CalibrationProfile, path: str | Path) -> Path:
    """PNG of the four curves against summed PSGS (log x) with the finite points marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, style in ((profile.path_a, "tab:blue"), (profile.path_b, "tab:orange")):
        curve = profile.curves[name]
        ax.plot(curve.psgs, curve.mean_ms, "o-", color=style, label=f"{name} mean")
        ax.plot(curve.psgs, curve.max_ms, "s--", color=style, label=f"{name} max")
    a = profile.curves[profile.path_a]
    for name, x in profile.points.items():
        if 0 < x < math.inf:
            y = float(a.at(x, POINTS[name][0]))
            ax.plot([x], [y], "k*", markersize=10)
            ax.annotate(f"{name}\n{x:.0f}", (x, y), textcoords="offset points", xytext=(4, 6))
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("summed PSGS of the batch (expected sampled nodes)")
    ax.set_ylabel("end-to-end batch latency (ms)")
    ax.set_title(f"calibration, fanouts {profile.identity.fanouts}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return Path(path)
