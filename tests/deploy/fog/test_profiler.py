"""The profiler: least squares recovers a known latency model, the load factor rescales it, and
cardinalities equal a plain count."""

from __future__ import annotations

import numpy as np
import pytest

from gnnserve.deploy.fog.profiler import (
    LatencyModel,
    calibration_sets,
    cardinality,
    fit_latency,
    halo_sizes,
    profile_node,
)
from gnnserve.errors import InvalidInputError
from tests.deploy.fog.test_planner import _graph


def test_cardinality_and_halos_equal_a_plain_count() -> None:
    indptr, indices = _graph(300, 2000)
    rng = np.random.default_rng(0)
    membership = rng.integers(0, 3, 300)
    halos = halo_sizes(indptr, indices, membership)
    for p in range(3):
        members = set(np.flatnonzero(membership == p).tolist())
        want = {
            int(u) for v in members for u in indices[indptr[v] : indptr[v + 1]] if u not in members
        }
        assert halos[p] == len(want)
        assert cardinality(indptr, indices, np.array(sorted(members))) == (len(members), len(want))


def test_fit_recovers_the_model_and_eta_rescales_it() -> None:
    indptr, indices = _graph(400, 3000)
    truth = LatencyModel(0.03, 0.01, 2.5)
    noise = np.random.default_rng(1)

    def run(vertices: np.ndarray) -> float:
        v, n = cardinality(indptr, indices, vertices)
        return float(truth.predict(v, n)) + noise.normal(0, 0.05)

    sizes = [10, 50, 100, 200, 300]
    model, cards, ms = profile_node(run, indptr, indices, sizes, np.random.default_rng(2))
    assert cards.shape == (100, 2) and ms.shape == (100,)
    assert model.beta_v == pytest.approx(truth.beta_v, abs=0.003)
    assert model.beta_n == pytest.approx(truth.beta_n, abs=0.003)
    assert model.eps == pytest.approx(truth.eps, abs=0.3)
    loaded = model.observed(100, 80, 2.0 * float(model.predict(100, 80)))
    assert loaded.eta == pytest.approx(2.0)
    assert float(loaded.predict(300, 10)) == pytest.approx(2.0 * float(model.predict(300, 10)))


def test_bad_calibration_input_is_refused() -> None:
    rng = np.random.default_rng(0)
    with pytest.raises(InvalidInputError, match="sizes"):
        calibration_sets(10, [0, 5], rng)
    with pytest.raises(InvalidInputError, match="at least 3"):
        fit_latency(np.ones((2, 2)), np.ones(2))
    with pytest.raises(InvalidInputError, match="finite"):
        fit_latency(np.ones((3, 2)), np.array([1.0, np.inf, 2.0]))
    with pytest.raises(InvalidInputError, match="finite"):
        LatencyModel(1, 1, 1).observed(1, 1, float("nan"))
    sets = calibration_sets(50, [5, 10], rng, per_size=3)
    assert [s.size for s in sets] == [5, 5, 5, 10, 10, 10]
    assert all(np.unique(s).size == s.size for s in sets)
