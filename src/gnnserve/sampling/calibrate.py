"""PSGS calibration (Quiver §4.2.1): latency of each sampling path against a batch's summed PSGS.

:func:`gnnserve.sampling.calibration_runs.measure` builds batches of increasing summed PSGS
(geometric buckets from one seed to ``max_seeds`` seeds), runs each end to end as the engine
does (sample -> feature gather -> model forward) through each path several times, interleaving
the paths, and records every latency.
A bucket's curve value is the mean and the max of its runs (the max stands for Quiver's upper
line; with the default 10 runs per bucket p99 and max coincide). The curves are then fitted
monotone in PSGS (:func:`fit_curve`: isotonic regression of the means, the running max of the
maxima), since more work never takes less time; where the raw curve fell by more than
:data:`NOISE_DROP` the profile carries a warning naming the buckets (too noisy to place a
point reliably), which ``gnnserve calibrate`` prints.

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
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from gnnserve.errors import GnnServeError

log = logging.getLogger(__name__)

PROFILE_NAME = "calibration.json"  # default profile file, in the store directory
FORMAT_VERSION = 1
Stat = Literal["mean", "max"]
NOISE_DROP = 0.2  # a raw curve falling by more than this share flags the profile as noisy
POINTS: dict[str, tuple[Stat, Stat]] = {  # point name -> (statistic of A, statistic of B)
    "cpu_preferred": ("max", "mean"),
    "b_preferred": ("mean", "max"),
    "latency": ("max", "max"),
    "throughput": ("mean", "mean"),
}


def describe_point(name: str, point: float, path_a: str, path_b: str) -> str:
    """One line saying what crossover ``point`` (summed PSGS) of ``name`` means for routing."""
    if math.isinf(point):
        return (
            f"{name}: PSGS inf ({path_a} was faster over the whole measured range: "
            f"routing by this point sends every batch to {path_a})"
        )
    if point == 0:
        return (
            f"{name}: PSGS 0 ({path_b} was at least as fast everywhere: routing by this "
            f"point sends every batch to {path_b})"
        )
    return f"{name}: PSGS {point:.0f} (batches of more summed PSGS go to {path_b})"


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


def isotonic(values: list[float]) -> list[float]:
    """The non-decreasing sequence closest to ``values`` in least squares (pool adjacent
    violators; equal weights)."""
    pools: list[tuple[float, int]] = []  # (mean, count) of each pooled block
    for v in values:
        pools.append((float(v), 1))
        while len(pools) > 1 and pools[-2][0] > pools[-1][0]:
            (m1, n1), (m2, n2) = pools[-2], pools[-1]
            pools[-2:] = [((m1 * n1 + m2 * n2) / (n1 + n2), n1 + n2)]
    return [m for m, n in pools for _ in range(n)]


def _drops(psgs: list[float], ys: list[float], what: str) -> list[str]:
    """A warning for each bucket whose raw value falls more than NOISE_DROP below an earlier
    bucket's."""
    out, peak, at = [], -math.inf, 0.0
    for x, y in zip(psgs, ys, strict=True):
        if y < (1 - NOISE_DROP) * peak:
            out.append(
                f"{what} falls from {peak:.2f} ms (PSGS {at:.0f}) to {y:.2f} ms (PSGS {x:.0f})"
            )
        if y > peak:
            peak, at = y, x
    return out


def fit_curve(psgs: list[float], runs_ms: list[list[float]], name: str) -> tuple[Curve, list[str]]:
    """A path's curve from its runs per bucket, fitted monotone (module docstring), and the
    noise warnings of its raw mean and max curves."""
    mean = [float(np.mean(r)) for r in runs_ms]
    peak = [float(np.max(r)) for r in runs_ms]
    warnings = _drops(psgs, mean, f"{name} mean") + _drops(psgs, peak, f"{name} max")
    fitted_max = np.maximum.accumulate(peak).tolist()
    return Curve(list(psgs), isotonic(mean), fitted_max, runs_ms), warnings


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
    warnings: list[str] = field(default_factory=list)  # raw curves too noisy (fit_curve)
    concurrency: int = 1  # batches run at once while measuring
    p99_confidence: float = 0.0  # chance a bucket's max bounds its p99 (1 - 0.99^runs)
    intervals: dict[str, list[float]] = field(default_factory=dict)  # point -> [p5, p95]

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
        doc["intervals"] = {
            k: [None if math.isinf(x) else x for x in v] for k, v in self.intervals.items()
        }
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
            doc["intervals"] = {
                k: [math.inf if x is None else float(x) for x in v]
                for k, v in doc.get("intervals", {}).items()
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
