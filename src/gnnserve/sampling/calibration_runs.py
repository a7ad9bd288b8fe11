"""Calibration runs: the batches of each PSGS bucket, run end to end through each sampling path,
and the plot of the resulting profile (the profile and its curves: :mod:`.calibrate`)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
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
) -> CalibrationProfile:
    """Calibrate the latency path (inline) against the ``throughput`` path (default
    :func:`throughput_path`: cuda where present, else parallel) on ``graph`` with
    ``identity.fanouts``: every batch through both paths, interleaved, after one untimed
    warm-up pass of the smallest and largest batches."""
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
    for i, batches in enumerate(plan):
        times: dict[str, list[float]] = {p: [] for p in names}
        for seeds in batches:
            for p in names:
                times[p].append(run_batch(samplers[p], graph, features, forward, seeds))
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
    profile.warnings = [w for _, found in fitted.values() for w in found]
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
