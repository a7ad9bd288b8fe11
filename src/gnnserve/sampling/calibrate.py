"""PSGS calibration (Quiver §4.2.1): latency of each sampling path against a batch's summed PSGS.

:func:`measure` builds batches of increasing summed PSGS (geometric buckets from one seed to
``max_seeds`` seeds), runs each end to end as the engine does (sample -> feature gather -> model
forward) through each path several times, interleaving the paths, and records every latency.
A bucket's curve value is the mean and the max of its runs (the max stands for Quiver's upper
line; with the default 10 runs per bucket p99 and max coincide).

Curves are piecewise linear in log PSGS between the bucket points and flat beyond the measured
range (no least-squares fit: the points are the measurement). Two curves cross where their
difference changes sign; :func:`crossover` returns the PSGS at which curve A (the latency path,
``inline``) stops being faster than curve B (``parallel``), interpolated linearly in log PSGS
within the segment. When A is faster over the whole measured range the curves do not
cross: ``math.inf`` (never leave A; ``null`` in the JSON); when B is at least as fast over the
whole range: ``0.0`` (always B). Measured curves are noisy and may cross several times; then
the crossing that routes the least area (|A - B| over log PSGS) to the slower path is taken,
which for curves crossing once is that crossing. The four points of Quiver:

- ``cpu_preferred``: max_A ∩ mean_B (below it A wins even in its worst case)
- ``b_preferred``: mean_A ∩ max_B (above it B wins even in its worst case)
- ``latency``: max_A ∩ max_B (bounds the worst case)
- ``throughput``: mean_A ∩ mean_B (best on average)

The profile (:class:`CalibrationProfile`, JSON, by default ``<store>/calibration.json``) names
the machine, the model checkpoint version, the graph checksum and the fanouts it was measured
for; :func:`find_profile` gives None (with a logged warning) for a missing or stale one.
"""

from __future__ import annotations

import json
import logging
import math
import os
import platform
import socket
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

from gnnserve.errors import GnnServeError
from gnnserve.features.base import FeatureStore
from gnnserve.graph.base import GraphStore
from gnnserve.sampling.metrics import psgs
from gnnserve.sampling.paths import build_path, cpu_paths
from gnnserve.types import MiniBatch

log = logging.getLogger(__name__)

PROFILE_NAME = "calibration.json"  # default profile file, in the store directory
FORMAT_VERSION = 1
Stat = Literal["mean", "max"]
POINTS: dict[str, tuple[Stat, Stat]] = {  # point name -> (statistic of A, statistic of B)
    "cpu_preferred": ("max", "mean"),
    "b_preferred": ("mean", "max"),
    "latency": ("max", "max"),
    "throughput": ("mean", "mean"),
}


class ProfileError(GnnServeError):
    """A calibration profile that is missing, unreadable or measured for something else."""


@dataclass
class Identity:
    """What a profile was measured for; any difference makes it stale."""

    hostname: str  # socket.gethostname()
    cpu_count: int  # os.cpu_count()
    platform: str  # platform.platform()
    model_version: str  # checkpoint version, name@sha256[:12]
    graph_checksum: str  # the store's content checksum (meta.json)
    fanouts: list[int]  # per-hop fanouts, nearest hop first

    @classmethod
    def here(cls, model_version: str, graph_checksum: str, fanouts: list[int]) -> Identity:
        """This machine's identity for ``model_version`` on ``graph_checksum``."""
        cpus = os.cpu_count() or 0
        host, plat = socket.gethostname(), platform.platform()
        return cls(host, cpus, plat, model_version, graph_checksum, list(fanouts))

    def differences(self, other: Identity) -> list[str]:
        """``field: saved -> now`` for each field that differs from ``other`` (now)."""
        mine, theirs = asdict(self), asdict(other)
        return [f"{k}: {mine[k]!r} -> {theirs[k]!r}" for k in mine if mine[k] != theirs[k]]


@dataclass
class Curve:
    """One path's latency per PSGS bucket (ms)."""

    psgs: list[float]  # bucket points: mean summed PSGS of the bucket's batches, increasing
    mean_ms: list[float]  # mean latency per bucket
    max_ms: list[float]  # max latency per bucket
    runs_ms: list[list[float]] = field(default_factory=list)  # every run, per bucket

    def at(self, x: np.ndarray | float, stat: Stat) -> np.ndarray:
        """The ``stat`` curve at summed PSGS ``x``: linear in log PSGS, flat beyond the ends."""
        ys = self.mean_ms if stat == "mean" else self.max_ms
        return np.interp(np.log(np.asarray(x, float)), np.log(self.psgs), ys)


def _split_at_roots(u: np.ndarray, d: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(u, d) with the root of every sign-changing segment inserted (d = 0 there)."""
    i = np.flatnonzero(d[:-1] * d[1:] < 0)
    roots = u[i] + d[i] / (d[i] - d[i + 1]) * (u[i + 1] - u[i])
    order = np.argsort(np.concatenate([u, roots]), kind="stable")
    return np.concatenate([u, roots])[order], np.concatenate([d, np.zeros(i.size)])[order]


def crossover(a: Curve, stat_a: Stat, b: Curve, stat_b: Stat) -> float:
    """Summed PSGS where A's ``stat_a`` curve crosses B's ``stat_b`` curve upwards (A faster
    below it): ``inf`` when A is faster over the whole measured range, ``0.0`` when B is at least
    as fast everywhere. With several crossings (noise) the one misrouting the least area
    (integral of |A - B| d log PSGS where the slower path would run) is returned."""
    grid = np.union1d(a.psgs, b.psgs)
    u, d = _split_at_roots(np.log(grid), a.at(grid, stat_a) - b.at(grid, stat_b))
    area = (d[:-1] + d[1:]) / 2 * np.diff(u)  # one sign per segment: roots are grid points
    # threshold at u[j]: segments left of it run on A (lose where A is slower), right on B
    left = np.concatenate([[0.0], np.cumsum(np.maximum(area, 0))])
    right = np.concatenate([np.cumsum(np.maximum(-area, 0)[::-1])[::-1], [0.0]])
    j = int(np.argmin(left + right))
    if j == u.size - 1 and d[-1] < 0:
        return math.inf
    if j == 0 and d[0] >= 0:
        return 0.0
    return float(math.exp(u[j]))


@dataclass
class CalibrationProfile:
    """Latency curves of two sampling paths and their crossover points (summed PSGS)."""

    identity: Identity
    path_a: str  # the latency path (inline)
    path_b: str  # the throughput path (parallel)
    curves: dict[str, Curve]  # path name -> its curve
    points: dict[str, float] = field(default_factory=dict)  # POINTS name -> PSGS (inf: none)
    runs_per_bucket: int = 0
    created: str = ""  # ISO time of the measurement
    format_version: int = FORMAT_VERSION

    def compute_points(self) -> None:
        """Fill ``points`` from the curves of ``path_a`` and ``path_b``."""
        a, b = self.curves[self.path_a], self.curves[self.path_b]
        self.points = {k: crossover(a, sa, b, sb) for k, (sa, sb) in POINTS.items()}

    def served_curve(self, x: np.ndarray, stat: Stat, threshold: float) -> np.ndarray:
        """Latency at summed PSGS ``x`` of a server routing below ``threshold`` to A, else B."""
        a, b = self.curves[self.path_a], self.curves[self.path_b]
        return np.where(x < threshold, a.at(x, stat), b.at(x, stat))

    def to_json(self) -> str:
        """JSON text; an infinite point is written as null."""
        doc = asdict(self)
        doc["points"] = {k: None if math.isinf(v) else v for k, v in self.points.items()}
        return json.dumps(doc, indent=2)

    @classmethod
    def from_json(cls, text: str, where: str) -> CalibrationProfile:
        """Parse :meth:`to_json` output; ProfileError naming ``where`` when malformed."""
        try:
            doc: dict[str, Any] = json.loads(text)
            if doc.get("format_version") != FORMAT_VERSION:
                raise ValueError(f"format_version {doc.get('format_version')}")
            doc["identity"] = Identity(**doc["identity"])
            doc["curves"] = {k: Curve(**c) for k, c in doc["curves"].items()}
            doc["points"] = {
                k: math.inf if v is None else float(v) for k, v in doc["points"].items()
            }
            return cls(**doc)
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise ProfileError(
                f"{where}: not a calibration profile ({exc})", "calibration"
            ) from exc

    def save(self, path: str | Path) -> Path:
        """Write the JSON to ``path`` (atomically: a temporary file renamed); returns it."""
        path = Path(path)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(self.to_json())
        os.replace(tmp, path)
        return path


def load_profile(path: str | Path, expected: Identity) -> CalibrationProfile:
    """The profile at ``path``; ProfileError when missing, unreadable or not for ``expected``."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ProfileError(
            f"no calibration profile at {path} ({exc.strerror})", "calibration"
        ) from None
    profile = CalibrationProfile.from_json(text, str(path))
    stale = profile.identity.differences(expected)
    if stale:
        raise ProfileError(f"{path} is stale: {'; '.join(stale)}", "calibration")
    return profile


def find_profile(path: str | Path, expected: Identity) -> CalibrationProfile | None:
    """:func:`load_profile`, or None with a logged warning (the caller keeps its default)."""
    try:
        return load_profile(path, expected)
    except ProfileError as exc:
        log.warning("%s; run `gnnserve calibrate` to measure one", exc.message)
        return None


def psgs_bound(profile: CalibrationProfile, slo_ms: float, stat: Stat, threshold: float) -> float:
    """Largest summed PSGS up to which the served latency curve (``stat``: max = strict, mean =
    loose; A below ``threshold``, B from it) stays within ``slo_ms``; log-linear inversion in the
    segment where it first exceeds. Within the SLO everywhere: the largest measured PSGS (no
    extrapolation); above it at the smallest batch: the smallest measured PSGS."""
    a, b = profile.curves[profile.path_a], profile.curves[profile.path_b]
    grid = np.union1d(a.psgs, b.psgs)
    if grid[0] < threshold < grid[-1]:
        grid = np.union1d(grid, [threshold])
    for lo, hi in zip(grid[:-1], grid[1:], strict=True):
        curve = a if hi <= threshold else b  # the path serving the whole segment
        y_lo, y_hi = curve.at(lo, stat), curve.at(hi, stat)
        if y_lo > slo_ms:
            return float(lo)
        if y_hi > slo_ms:
            t = (slo_ms - y_lo) / (y_hi - y_lo)
            return float(math.exp(math.log(lo) + t * (math.log(hi) - math.log(lo))))
    return float(grid[-1])


# measurement ----------------------------------------------------------------------------------
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
) -> CalibrationProfile:
    """Calibrate the CPU paths on ``graph`` with ``identity.fanouts``: every batch through both
    paths, interleaved, after one untimed warm-up pass of the smallest and largest batches."""
    fanouts = identity.fanouts
    cost = psgs(graph, fanouts)
    plan = bucket_batches(cost, buckets, runs, max_seeds, np.random.default_rng(seed))
    names = cpu_paths()
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
    curves = {
        p: Curve(xs, [float(np.mean(r)) for r in rs], [float(np.max(r)) for r in rs], rs)
        for p, rs in runs_ms.items()
    }
    created = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    profile = CalibrationProfile(identity, names[0], names[1], curves, {}, runs, created)
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
