"""Request arrivals and query vertices for bench/faas.py, as FaaS-GNN §5.1 builds them.

Arrivals: Azure Functions 2019 invocation counts (per function, per minute, 1,440 minutes). As
the paper does, two functions with more than 10,000 invocations a day are drawn at random
(``trace-0``, ``trace-1``); a window of consecutive minutes is replayed with each minute's count
spread uniformly at random within the minute, the window compressed in time and the counts
scaled so the peak fits this machine, keeping the pattern (the paper scales its trace to its
cluster the same way).

Query vertices: the paper maps the trace onto each dataset's vertex-ID access sequence. Our
graphs have no access log, so the caller derives one from the edge list: the destination ids
grouped by source (an interaction log where consecutive entries are the recipients of one user's
interactions; a vertex is queried about as often as it receives edges), read from a random
starting point.
"""

from __future__ import annotations

import gzip
from dataclasses import dataclass
from pathlib import Path

import numpy as np

MIN_DAILY = 10_000  # FaaS-GNN's selection rule: functions invoked more than this a day


@dataclass
class Trace:
    """One function's per-minute invocation counts."""

    name: str  # "trace-0" | "trace-1"
    function: str  # the function hash (first 12 hex digits)
    counts: np.ndarray  # int64 [1440] invocations per minute
    daily: int  # sum of counts


def frequent_functions(path: Path, n: int = 2, seed: int = 0, min_cv: float = 0.5) -> list[Trace]:
    """``n`` functions with > MIN_DAILY invocations a day and a per-minute coefficient of
    variation >= ``min_cv`` (bursty: 5 of the sample's 13 frequent functions; the other 8 are
    timers at a constant rate, which no scaling policy is needed for), drawn with ``seed``."""
    with gzip.open(path, "rt") as f:
        header = f.readline().rstrip("\n").split(",")
        first_minute = header.index("1_minute")
        rows = [line.rstrip("\n").split(",") for line in f]
    counts = np.array([[int(v) for v in r[first_minute:]] for r in rows], dtype=np.int64)
    daily = counts.sum(axis=1)
    cv = counts.std(axis=1) / np.maximum(counts.mean(axis=1), 1e-9)
    frequent = np.flatnonzero((daily > MIN_DAILY) & (cv >= min_cv))
    picked = np.random.default_rng(seed).choice(frequent, size=n, replace=False)
    return [
        Trace(f"trace-{i}", rows[j][0][:12], counts[j], int(daily[j])) for i, j in enumerate(picked)
    ]


def bursty_window(counts: np.ndarray, minutes: int) -> int:
    """First minute of the ``minutes``-long window with the largest peak-to-mean ratio among
    those with at least a quarter of the busiest window's invocations (spikes and idle gaps:
    what cold starts, keep-alive and the scheduler are about)."""
    c = counts.astype(np.float64)
    windows = np.lib.stride_tricks.sliding_window_view(c, minutes)
    sums = windows.sum(axis=1)
    burst = windows.max(axis=1) / np.maximum(windows.mean(axis=1), 1e-9)
    burst[sums < 0.25 * sums.max()] = 0.0
    return int(np.argmax(burst))


def arrivals(
    counts: np.ndarray, start: int, minutes: int, replay_s: float, peak_rps: float, seed: int
) -> tuple[np.ndarray, dict[str, float]]:
    """Arrival times (s, sorted) replaying minutes ``[start, start + minutes)`` in ``replay_s``
    seconds, counts scaled so the busiest minute offers ``peak_rps`` requests per second.

    Returns the times and what was done (time compression, count scale, request count).
    """
    window = counts[start : start + minutes].astype(np.float64)
    minute_s = replay_s / minutes  # one trace minute lasts this long in the replay
    scale = peak_rps * minute_s / max(window.max(), 1.0)
    rng = np.random.default_rng(seed)
    scaled = rng.poisson(window * scale) if scale < 1 else np.round(window * scale)
    per_minute = scaled.astype(np.int64)
    times = np.concatenate(
        [m * minute_s + np.sort(rng.random(k)) * minute_s for m, k in enumerate(per_minute)]
    )
    info = {
        "trace_minutes": float(minutes),
        "replay_s": float(replay_s),
        "time_compression": 60.0 / minute_s,
        "count_scale": float(scale),
        "requests": float(times.size),
        "peak_rps": float(per_minute.max() / minute_s),
        "mean_rps": float(times.size / replay_s),
    }
    return times, info


def query_sequence(access: np.ndarray, n: int, seed: int) -> np.ndarray:
    """``n`` query vertices: consecutive entries of the access sequence from a random start
    (wrapping around)."""
    start = int(np.random.default_rng(seed).integers(0, access.size))
    idx = (start + np.arange(n)) % access.size
    return np.asarray(access[idx], dtype=np.int64)
