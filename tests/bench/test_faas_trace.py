"""bench/faas_trace.py: the trace replay keeps each minute's (scaled) count inside its minute."""

from __future__ import annotations

import numpy as np

from tests.bench.loader import load_bench
from tests.conftest import datasets_dir

trace = load_bench("faas_trace")


def test_arrivals_keep_per_minute_counts_and_order() -> None:
    counts = np.zeros(100, dtype=np.int64)
    counts[10:20] = [5, 0, 0, 30, 2, 0, 0, 0, 9, 1]
    times, info = trace.arrivals(counts, 10, 10, replay_s=20.0, peak_rps=30.0, seed=0)
    assert np.all(np.diff(times) >= 0) and times.min() >= 0 and times.max() < 20.0
    per_minute = np.bincount((times // 2.0).astype(int), minlength=10)
    np.testing.assert_array_equal(per_minute, np.round(counts[10:20] * info["count_scale"]))
    assert info["time_compression"] == 30.0 and info["peak_rps"] == 30.0


def test_bursty_window_prefers_spikes_over_a_flat_busy_hour() -> None:
    counts = np.full(300, 0, dtype=np.int64)
    counts[:60] = 10  # flat: 600 invocations
    counts[150:210:20] = 100  # three spikes: 300 invocations
    assert 91 <= trace.bursty_window(counts, 60) <= 150


def test_frequent_bursty_functions_follow_the_selection_rule() -> None:
    path = datasets_dir() / "raw" / "traces" / "azure2019_functions_sample1350_invocations.csv.gz"
    picked = trace.frequent_functions(path, n=2, seed=0)
    for t in picked:
        assert t.daily > trace.MIN_DAILY and t.counts.size == 1440
        assert t.counts.std() / t.counts.mean() >= 0.5
    assert picked[0].function != picked[1].function
