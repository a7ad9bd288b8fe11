"""Calibrated routing and PSGS-bounded batching in a built engine: the planner's threshold is
the profile's point, the batcher's cost cap is the SLO's curve inversion, and a missing or stale
profile falls back (routing) or refuses to build (SLO)."""

from __future__ import annotations

import logging
import math
from pathlib import Path

import numpy as np
import pytest

from gnnserve.config import ServeConfig
from gnnserve.engine.batcher import Batch
from gnnserve.engine.loader import build_engine
from gnnserve.errors import InvalidInputError
from gnnserve.graph import open_graph_store
from gnnserve.models.checkpoint import load_checkpoint
from gnnserve.sampling.calibrate import CalibrationProfile, Curve, Identity
from gnnserve.sampling.device import DeviceSampler
from gnnserve.sampling.paths import NEVER

FANOUTS = [5, 5]
X = [100.0, 1000.0, 10000.0, 100000.0]


def _profile(
    store: Path, ckpt: Path, path: Path, model: str | None = None, scale: float = 1.0
) -> Path:
    """A hand-built profile for ``ckpt`` on ``store`` (``model``: another version: stale;
    ``scale``: every latency times this)."""
    version = model or load_checkpoint(ckpt).version
    identity = Identity.here(version, open_graph_store(store).version, FANOUTS)
    s = scale
    curves = {
        "inline": Curve(X, [s * 0.2, s * 0.5, s * 2, s * 20], [s * 0.4, s * 1, s * 4, s * 40]),
        "parallel": Curve(X, [s * 1, s * 1.2, s * 2.5, s * 8], [s * 2, s * 2.4, s * 5, s * 16]),
    }
    profile = CalibrationProfile(identity, "inline", "parallel", curves)
    profile.compute_points()
    return profile.save(path)


def _config(store: Path, ckpt: Path, **overrides: object) -> ServeConfig:
    base = {
        "store.path": str(store),
        "model_path": str(ckpt),
        "sampler.fanouts": FANOUTS,
        "compute.warm_up": False,
    }
    return ServeConfig.load(None, **{**base, **overrides})


def _loglinear(x: list[float], y: list[float], level: float) -> float:
    """x where the segment through (x0, y0), (x1, y1) reaches ``level``, linear in log x."""
    t = (level - y[0]) / (y[1] - y[0])
    return 10 ** (math.log10(x[0]) + t * (math.log10(x[1]) - math.log10(x[0])))


@pytest.mark.parametrize("routing", ["latency", "throughput"])
def test_planner_takes_the_profiled_point(small_store, small_ckpt, tmp_path, routing) -> None:
    path = _profile(small_store, small_ckpt, tmp_path / "p.json")
    profile = CalibrationProfile.from_json(path.read_text(), "p")
    # by hand: max curves cross where 4 + 36 t = 5 + 11 t on [10^4, 10^5] (t = 0.04); mean
    # curves where 2 + 18 t = 2.5 + 5.5 t (t = 0.04): both at 10^4.04
    assert profile.points[routing] == pytest.approx(10**4.04)
    config = _config(
        small_store, small_ckpt, **{"sampler.routing": routing, "sampler.calibration": str(path)}
    )
    engine = build_engine(config)
    want = math.ceil(profile.points[routing])
    assert engine.planner.parallel_threshold == want
    assert engine.planner.sampler_for(None).parallel_threshold == want  # type: ignore[attr-defined]
    other = engine.planner.sampler_for((3, 3))  # fanouts it was not measured for: the constant
    assert other.parallel_threshold == config.sampler.parallel_threshold  # type: ignore[attr-defined]


def test_each_routing_takes_its_own_point(small_store, small_ckpt, tmp_path) -> None:
    """Points that differ, so routing by the wrong one is caught: the parallel max curve
    rises faster at the end, moving only the max/max (latency) crossing."""
    path = _profile(small_store, small_ckpt, tmp_path / "p.json")
    profile = CalibrationProfile.from_json(path.read_text(), "p")
    profile.curves["parallel"].max_ms[-1] = 30.0  # max/max: 4 + 36 t = 5 + 25 t, t = 1/11
    profile.compute_points()
    profile.save(path)
    assert profile.points["latency"] == pytest.approx(10 ** (4 + 1 / 11))
    assert profile.points["throughput"] == pytest.approx(10**4.04)
    for routing in ("latency", "throughput"):
        overrides = {"sampler.routing": routing, "sampler.calibration": str(path)}
        engine = build_engine(_config(small_store, small_ckpt, **overrides))
        assert engine.planner.parallel_threshold == math.ceil(profile.points[routing])


def test_unrouted_missing_and_stale_profiles_keep_the_constant(
    small_store, small_ckpt, tmp_path, caplog
) -> None:
    stale = _profile(small_store, small_ckpt, tmp_path / "stale.json", model="other@0")
    constant = ServeConfig().sampler.parallel_threshold
    engine = build_engine(_config(small_store, small_ckpt))
    assert engine.planner.parallel_threshold == constant and engine.planner.profile is None
    for path, reason in [(stale, "model_version"), (tmp_path / "none.json", "no calibration")]:
        overrides = {"sampler.routing": "latency", "sampler.calibration": str(path)}
        with caplog.at_level(logging.WARNING):
            engine = build_engine(_config(small_store, small_ckpt, **overrides))
        assert engine.planner.parallel_threshold == constant
        assert reason in caplog.text


def test_a_point_at_infinity_never_goes_parallel(small_store, small_ckpt, tmp_path) -> None:
    path = _profile(small_store, small_ckpt, tmp_path / "p.json")
    profile = CalibrationProfile.from_json(path.read_text(), "p")
    profile.curves["parallel"] = Curve(X, [50.0] * 4, [60.0] * 4)  # never faster
    profile.compute_points()
    profile.save(path)
    overrides = {"sampler.routing": "throughput", "sampler.calibration": str(path)}
    engine = build_engine(_config(small_store, small_ckpt, **overrides))
    assert engine.planner.parallel_threshold == NEVER


@pytest.mark.parametrize(
    ("bound", "slo", "want"),
    [
        ("strict", 2.0, _loglinear(X[1:3], [1.0, 4.0], 2.0)),  # inline max 1 -> 4
        ("loose", 2.0, _loglinear(X[2:4], [2.0, 20.0], 2.0)),  # inline mean reaches 2 at 10^4
        ("loose", 1.0, _loglinear(X[1:3], [0.5, 2.0], 1.0)),
    ],
)
def test_slo_bound_is_the_inverted_curve(small_store, small_ckpt, tmp_path, bound, slo, want):
    path = _profile(small_store, small_ckpt, tmp_path / "p.json")
    overrides = {
        "sampler.calibration": str(path),
        "sampler.parallel_threshold": 65536,  # every point here is served inline
        "batcher.latency_slo_ms": slo,
        "batcher.psgs_bound": bound,
    }
    engine = build_engine(_config(small_store, small_ckpt, **overrides))
    assert engine.batcher.config.max_batch_cost == pytest.approx(want)
    assert engine.config.batcher.max_batch_cost is None  # the caller's config is left alone


def test_slo_with_routing_bounds_the_served_curve(small_store, small_ckpt, tmp_path) -> None:
    path = _profile(small_store, small_ckpt, tmp_path / "p.json")
    overrides = {
        "sampler.calibration": str(path),
        "sampler.routing": "latency",
        "batcher.latency_slo_ms": 10.0,
    }
    engine = build_engine(_config(small_store, small_ckpt, **overrides))
    # inline max passes 10 ms only beyond the latency point 10^4.04; parallel max there is
    # 5 + 11 t, reaching 10 at t = 5/11 of [10^4, 10^5]
    want = 10 ** (4 + 5 / 11)
    assert engine.batcher.config.max_batch_cost == pytest.approx(want)


def test_a_cap_below_the_routing_point_warns_naming_both(
    small_store, small_ckpt, tmp_path, caplog
) -> None:
    path = _profile(small_store, small_ckpt, tmp_path / "p.json")
    for threshold, warned in ((65536, True), (100, False)):  # cap here ~ 10^2.67
        overrides = {
            "sampler.calibration": str(path),
            "sampler.parallel_threshold": threshold,
            "batcher.latency_slo_ms": 0.8,
        }
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            engine = build_engine(_config(small_store, small_ckpt, **overrides))
        cap = engine.batcher.config.max_batch_cost
        assert cap is not None and (cap < threshold) == warned
        found = "below the routing point" in caplog.text
        assert found == warned, caplog.text
        if warned:
            assert f"cap {cap:.0f}" in caplog.text and f"point {threshold}" in caplog.text


def test_slo_without_a_profile_is_refused(small_store, small_ckpt, tmp_path) -> None:
    stale = _profile(small_store, small_ckpt, tmp_path / "stale.json", model="other@0")
    for path in (stale, tmp_path / "none.json"):
        overrides = {"sampler.calibration": str(path), "batcher.latency_slo_ms": 10.0}
        with pytest.raises(InvalidInputError, match="gnnserve calibrate") as info:
            build_engine(_config(small_store, small_ckpt, **overrides))
        assert info.value.field == "batcher.latency_slo_ms"


def test_served_batches_respect_the_slo_bound(small_store, small_ckpt, tmp_path) -> None:
    # latencies x 50, SLO 40 ms: the same cap as 0.8 ms on the unscaled curves, with room for
    # this machine's real batches (the cap of each batch is what is left of its SLO)
    path = _profile(small_store, small_ckpt, tmp_path / "p.json", scale=50.0)
    overrides = {
        "sampler.calibration": str(path),
        "batcher.latency_slo_ms": 40.0,  # strict: inline max 20 -> 50 over [100, 1000]
        "batcher.max_wait_ms": 20.0,
    }
    seen: list[Batch] = []
    with build_engine(_config(small_store, small_ckpt, **overrides)) as engine:
        engine.observers.append(seen.append)  # list.append is atomic
        cap = engine.batcher.config.max_batch_cost
        assert cap == pytest.approx(_loglinear(X[:2], [0.4, 1.0], 0.8))
        rng = np.random.default_rng(0)
        futures = [engine.submit(engine.request(rng.integers(0, 2000, 2))) for _ in range(60)]
        for f in futures:
            f.result(timeout=30)
    assert engine.psgs is not None and cap is not None
    multi = [b for b in seen if len(b.tickets) > 1]
    assert multi, "no batch held two requests"
    for b in seen:
        assert len(b.tickets) == 1 or engine.psgs[b.seeds].sum() <= cap


def test_a_device_throughput_path_serves_the_batches_past_the_point(
    small_store, small_ckpt, tmp_path
) -> None:
    path = _profile(small_store, small_ckpt, tmp_path / "p.json")
    profile = CalibrationProfile.from_json(path.read_text(), "p")
    profile.curves["torch"] = profile.curves.pop("parallel")  # measured against the torch path
    profile.path_b = "torch"
    profile.save(path)
    overrides = {"sampler.routing": "throughput", "sampler.calibration": str(path)}
    engine = build_engine(_config(small_store, small_ckpt, **overrides))
    sampler = engine.planner.sampler_for(None)
    assert isinstance(sampler.throughput, DeviceSampler)  # type: ignore[attr-defined]
    assert sampler.throughput.device.type == "cpu"  # type: ignore[attr-defined]
    plain = _profile(small_store, small_ckpt, tmp_path / "plain.json")  # parallel: none needed
    overrides["sampler.calibration"] = str(plain)
    engine = build_engine(_config(small_store, small_ckpt, **overrides))
    assert engine.planner.sampler_for(None).throughput is None  # type: ignore[attr-defined]
