"""Calibration: crossover points and SLO bounds against brute force on hand-built curves, the
profile's JSON round trip and staleness, the batch buckets, and a small real calibration."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import numpy as np
import pytest

from gnnserve.engine.planner import calibrate
from gnnserve.errors import InvalidInputError
from gnnserve.graph import open_graph_store
from gnnserve.models.checkpoint import load_checkpoint
from gnnserve.sampling.calibrate import (
    POINTS,
    CalibrationProfile,
    Curve,
    Identity,
    ProfileError,
    crossover,
    find_profile,
    fit_curve,
    isotonic,
    load_profile,
    psgs_bound,
)
from gnnserve.sampling.calibration_runs import bucket_batches
from gnnserve.sampling.metrics import psgs

X = [10.0, 100.0, 1000.0, 10000.0]
FINE = np.geomspace(X[0], X[-1], 200_001)  # brute-force grid, log-uniform


def _curve(mean: list[float], maxima: list[float], x: list[float] = X) -> Curve:
    return Curve(list(x), list(mean), list(maxima))


def _profile(a: Curve, b: Curve, model: str = "m@1", graph: str = "g1") -> CalibrationProfile:
    identity = Identity.here(model, graph, [5, 5])
    profile = CalibrationProfile(identity, "inline", "parallel", {"inline": a, "parallel": b})
    profile.compute_points()
    return profile


def _line(x: np.ndarray, xs: list[float], ys: list[float]) -> np.ndarray:
    """Plain piecewise-linear interpolation in log10 x, flat beyond the ends."""
    return np.interp(np.log10(x), np.log10(xs), ys)


# A: 1 ms more per decade (max one above the mean); B: flat mean 2.2 ms, flat max 3.5 ms
A = _curve([1, 2, 3, 4], [2, 3, 4, 5])
B = _curve([2.2] * 4, [3.5] * 4)
# where the lines meet, solved by hand: A(x) = k + log10(x / 10) for k = 1 (mean), 2 (max)
HAND = {
    "cpu_preferred": 10**1.2,  # max_A = 2 + (l - 1) = 2.2 -> l = 1.2
    "b_preferred": 10**3.5,  # mean_A = 1 + (l - 1) = 3.5 -> l = 3.5
    "latency": 10**2.5,  # max_A = 3.5 -> l = 2.5
    "throughput": 10**2.2,  # mean_A = 2.2 -> l = 2.2
}


def test_four_points_of_hand_built_curves() -> None:
    profile = _profile(A, B)
    for name, want in HAND.items():
        assert profile.points[name] == pytest.approx(want, rel=1e-9), name
        stat_a, stat_b = POINTS[name]
        ya = _line(FINE, X, A.mean_ms if stat_a == "mean" else A.max_ms)
        yb = _line(FINE, X, B.mean_ms if stat_b == "mean" else B.max_ms)
        brute = FINE[np.argmax(ya >= yb)]  # first grid point where A is no faster
        assert profile.points[name] == pytest.approx(brute, rel=1e-4), name
    order = ["cpu_preferred", "throughput", "latency", "b_preferred"]
    assert [profile.points[k] for k in order] == sorted(profile.points.values())


def test_curves_that_do_not_cross() -> None:
    fast, slow = _curve([1] * 4, [2] * 4), _curve([5] * 4, [6] * 4)
    assert all(v == math.inf for v in _profile(fast, slow).points.values())
    assert all(v == 0.0 for v in _profile(slow, fast).points.values())
    doc = json.loads(_profile(fast, slow).to_json())
    assert set(doc["points"].values()) == {None}  # inf is null in standard JSON


def test_noisy_curves_take_the_crossing_misrouting_least() -> None:
    # A - B: a small early blip above zero, then below, then a big sustained crossing
    x = [10.0, 20.0, 40.0, 100.0, 300.0, 1000.0, 3000.0]
    diff = [-1.0, 0.2, -1.0, -2.0, -0.5, 3.0, 4.0]
    a = _curve([5 + d for d in diff], [9.0] * 7, x)
    b = _curve([5.0] * 7, [9.0] * 7, x)
    got = crossover(a, "mean", b, "mean")
    fine = np.geomspace(x[0], x[-1], 400_001)
    d = _line(fine, x, diff)
    area = (d[:-1] + d[1:]) / 2 * np.diff(np.log(fine))  # brute force: fine trapezoids
    # misrouted area with the threshold at fine[j]: A-slower area left of it, B-slower right
    left = np.concatenate([[0.0], np.cumsum(np.maximum(area, 0))])
    right = np.concatenate([np.cumsum(np.maximum(-area, 0)[::-1])[::-1], [0.0]])
    best = fine[int(np.argmin(left + right))]
    assert got == pytest.approx(best, rel=1e-4)
    assert 300 < got < 1000  # the sustained crossing, not the blip at ~15


def test_slo_bound_is_the_curve_inversion() -> None:
    profile = _profile(A, B)
    # strict, inline only: max_A = 2 + (l - 1) reaches 4.5 at l = 3.5
    assert psgs_bound(profile, 4.5, "max", math.inf) == pytest.approx(10**3.5)
    assert psgs_bound(profile, 2.5, "mean", math.inf) == pytest.approx(10**2.5)
    assert psgs_bound(profile, 50.0, "max", math.inf) == X[-1]  # never above: measured end
    assert psgs_bound(profile, 0.5, "max", math.inf) == X[0]  # above at once: smallest
    # routed: A below 10^2.5, B from it; B's max (3.5) is over 3.2 from the threshold on
    cases = [(3.2, "max", 10**2.5), (3.4, "max", 10**2.3), (3.0, "mean", 10**1.5)]
    for slo, stat, threshold in cases:
        got = psgs_bound(profile, slo, stat, threshold)  # type: ignore[arg-type]
        served = profile.served_curve(FINE, stat, threshold)  # type: ignore[arg-type]
        over = np.flatnonzero(served > slo)
        brute = FINE[-1] if over.size == 0 else FINE[max(over[0] - 1, 0)]
        assert got == pytest.approx(brute, rel=1e-4), (slo, stat, threshold)
    assert psgs_bound(profile, 3.2, "max", 10**2.5) == pytest.approx(10**2.2)  # A: l + 1 = 3.2
    assert psgs_bound(profile, 3.4, "max", 10**2.3) == pytest.approx(10**2.3)  # B's 3.5 > 3.4
    assert psgs_bound(profile, 3.0, "mean", 10**1.5) == X[-1]  # B's mean 2.2 stays within


def test_profile_round_trip_and_staleness(tmp_path: Path, caplog) -> None:
    profile = _profile(A, B)
    path = profile.save(tmp_path / "calibration.json")
    same = Identity.here("m@1", "g1", [5, 5])
    assert load_profile(path, same) == profile
    for stale, field in [
        (Identity.here("m@2", "g1", [5, 5]), "model_version"),
        (Identity.here("m@1", "g2", [5, 5]), "graph_checksum"),
        (Identity.here("m@1", "g1", [5, 10]), "fanouts"),
    ]:
        with pytest.raises(ProfileError, match=f"stale: {field}"):
            load_profile(path, stale)
        with caplog.at_level(logging.WARNING):
            assert find_profile(path, stale) is None
        assert field in caplog.text
    moved = Identity(**{**profile.identity.__dict__, "hostname": "elsewhere"})
    with pytest.raises(ProfileError, match="hostname"):
        load_profile(path, moved)
    with pytest.raises(ProfileError, match="no calibration profile"):
        load_profile(tmp_path / "missing.json", same)
    (tmp_path / "bad.json").write_text('{"format_version": 1, "curves": 3}')
    with pytest.raises(ProfileError, match="not a calibration profile"):
        load_profile(tmp_path / "bad.json", same)


def test_buckets_span_one_seed_to_max_seeds(small_store: Path) -> None:
    cost = psgs(open_graph_store(small_store), [5, 5])
    plan = bucket_batches(cost, buckets=6, runs=4, max_seeds=256, rng=np.random.default_rng(1))
    targets = np.geomspace(np.median(cost), cost.mean() * 256, 6)
    for target, batches in zip(targets, plan, strict=True):
        for seeds in batches:
            assert np.unique(seeds).size == seeds.size
            assert cost[seeds].sum() >= target > cost[seeds[:-1]].sum()  # the shortest prefix
    assert min(s.size for s in plan[0]) == 1
    assert np.mean([s.size for s in plan[-1]]) == pytest.approx(256, rel=0.25)


def test_small_real_calibration_writes_json_and_png(small_store: Path, small_ckpt: Path, tmp_path):
    lines: list[str] = []
    out = tmp_path / "profile.json"
    kwargs = {"buckets": 4, "runs": 3, "max_seeds": 64, "progress": lines.append}
    profile, path, png = calibrate(small_store, small_ckpt, [5, 5], out, **kwargs)  # type: ignore[arg-type]
    assert path == out and png == tmp_path / "profile.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(lines) == 4 and lines[-1].startswith("bucket 4/4")
    version = load_checkpoint(small_ckpt).version
    identity = Identity.here(version, open_graph_store(small_store).version, [5, 5])
    loaded = load_profile(out, identity)
    assert loaded == profile
    for curve in loaded.curves.values():
        assert len(curve.psgs) == 4 and np.all(np.diff(curve.psgs) > 0)
        assert [len(r) for r in curve.runs_ms] == [3] * 4
        # the monotone fit of the raw runs: isotonic means, running max of the maxima
        assert curve.mean_ms == pytest.approx(isotonic([float(np.mean(r)) for r in curve.runs_ms]))
        assert curve.max_ms == np.maximum.accumulate([max(r) for r in curve.runs_ms]).tolist()
    again = CalibrationProfile(**{**loaded.__dict__, "points": {}})
    again.compute_points()
    assert again.points == loaded.points


def test_calibration_against_the_torch_path(small_store: Path, small_ckpt: Path, tmp_path):
    out = tmp_path / "torch.json"
    kwargs = {"buckets": 3, "runs": 2, "max_seeds": 32, "throughput": "torch"}
    profile, _, _ = calibrate(small_store, small_ckpt, [5, 5], out, **kwargs)  # type: ignore[arg-type]
    assert (profile.path_a, profile.path_b) == ("inline", "torch")
    assert sorted(profile.curves) == ["inline", "torch"]
    with pytest.raises(InvalidInputError, match="must not be inline") as info:
        calibrate(small_store, small_ckpt, [5, 5], out, **{**kwargs, "throughput": "inline"})  # type: ignore[arg-type]
    assert info.value.field == "throughput"


def test_describe_point_says_what_an_infinite_or_zero_point_means() -> None:
    from gnnserve.sampling.calibrate import describe_point

    never = describe_point("latency", math.inf, "inline", "parallel")
    assert (
        never.startswith("latency: PSGS inf (inline was faster")
        and "every batch to inline" in never
    )
    always = describe_point("throughput", 0.0, "inline", "parallel")
    assert always.startswith("throughput: PSGS 0 (parallel")
    assert "every batch to parallel" in always
    assert describe_point("latency", 1234.4, "inline", "cuda") == (
        "latency: PSGS 1234 (batches of more summed PSGS go to cuda)"
    )


def test_fit_is_monotone_and_a_noisy_raw_curve_is_flagged() -> None:

    assert isotonic([1.0, 3.0, 2.0, 4.0]) == [1.0, 2.5, 2.5, 4.0]  # pooled by hand
    assert isotonic([5.0, 1.0, 1.0]) == pytest.approx([7 / 3] * 3)
    xs = [100.0, 200.0, 400.0, 800.0]
    quiet = [[1.0, 1.2], [2.0, 2.1], [1.9, 2.0], [4.0, 4.4]]  # a 5% dip: noise, no warning
    curve, warnings = fit_curve(xs, quiet, "inline")
    assert warnings == [] and curve.mean_ms == sorted(curve.mean_ms)
    assert curve.max_ms == [1.2, 2.1, 2.1, 4.4] and curve.runs_ms == quiet
    noisy = [[1.0, 1.0], [7.5, 7.5], [2.0, 2.0], [4.0, 4.0]]  # 7.5 -> 2.0: flagged
    curve, warnings = fit_curve(xs, noisy, "parallel")
    assert curve.mean_ms == pytest.approx([1.0, 4.5, 4.5, 4.5])  # 7.5, 2, 4 pooled
    assert len(warnings) == 4  # mean and max, each at PSGS 400 and 800 (below 80% of 7.5)
    assert "parallel mean falls from 7.50 ms (PSGS 200) to 2.00 ms (PSGS 400)" in warnings[0]


def test_runs_for_a_p99_bound_with_a_stated_confidence() -> None:
    from gnnserve.sampling.calibration_runs import p99_confidence, runs_for

    assert p99_confidence(10) == pytest.approx(1 - 0.99**10)  # 9.6%
    assert runs_for(0.5) == 69 and runs_for(0.9) == 230
    assert p99_confidence(runs_for(0.9)) >= 0.9 > p99_confidence(runs_for(0.9) - 1)
    for bad in (0.0, 1.0, -0.5):
        with pytest.raises(InvalidInputError, match="confidence"):
            runs_for(bad)


def test_point_intervals_narrow_with_quiet_runs_and_widen_with_noise() -> None:
    from gnnserve.sampling.calibration_runs import point_intervals

    xs = [100.0, 1000.0, 10000.0, 100000.0]
    rng = np.random.default_rng(4)

    def profile(noise: float) -> CalibrationProfile:
        def runs(ys: list[float]) -> list[list[float]]:
            return [list(y * (1 + noise * rng.standard_normal(20)).clip(0.1)) for y in ys]

        a, b = runs([0.5, 1.0, 4.0, 40.0]), runs([2.0, 2.4, 5.0, 16.0])
        curves = {"inline": fit_curve(xs, a, "inline")[0], "parallel": fit_curve(xs, b, "p")[0]}
        identity = Identity("h", 2, "p", "m@0", "g", [5])
        out = CalibrationProfile(identity, "inline", "parallel", curves)
        out.compute_points()
        return out

    quiet, noisy = profile(0.01), profile(0.3)
    for p in (quiet, noisy):
        p.intervals = point_intervals(p, np.random.default_rng(0), rounds=100)
        assert set(p.intervals) == set(p.points)
        assert all(lo <= hi for lo, hi in p.intervals.values())
    lo, hi = quiet.intervals["throughput"]
    assert lo <= quiet.points["throughput"] <= hi and hi / lo < 1.2
    nlo, nhi = noisy.intervals["throughput"]
    assert nhi / nlo > hi / lo  # noisier runs: a wider interval
    again = CalibrationProfile.from_json(noisy.to_json(), "x")
    assert again.intervals == noisy.intervals


@pytest.mark.parametrize("concurrency", [1, 3])
def test_measure_runs_batches_at_once_as_asked(small_store: Path, concurrency: int) -> None:
    import threading
    import time

    from gnnserve.features import open_feature_store
    from gnnserve.sampling.calibration_runs import measure

    graph = open_graph_store(small_store)
    inside, most, guard = [0], [0], threading.Lock()

    def forward(_batch: object) -> None:  # counts the batches inside the model at once
        with guard:
            inside[0] += 1
            most[0] = max(most[0], inside[0])
        time.sleep(0.02)
        with guard:
            inside[0] -= 1

    identity = Identity.here("m@0", graph.version, [5, 5])
    profile = measure(
        graph, open_feature_store(small_store), forward, identity, buckets=2, runs=6,
        max_seeds=8, concurrency=concurrency,
    )  # fmt: skip
    assert most[0] == concurrency and profile.concurrency == concurrency
    assert profile.p99_confidence == pytest.approx(1 - 0.99**6)
