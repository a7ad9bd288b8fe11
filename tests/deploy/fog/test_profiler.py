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
    profile_cluster,
    rows_sent,
    time_together,
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
    sent = rows_sent(indptr, indices, membership, 3)  # what each part sends of others' halos
    for p in range(3):
        held = 0
        for q in range(3):
            theirs = np.flatnonzero(membership == q)
            halo = {int(u) for v in theirs for u in indices[indptr[v] : indptr[v + 1]]}
            held += sum(1 for u in halo if membership[u] == p and q != p)
        assert sent[p] == held
    assert sent.sum() == halos.sum()


def test_fit_recovers_each_nodes_model_and_eta_rescales_it() -> None:
    indptr, indices = _graph(400, 3000)
    truths = [LatencyModel(0.03, 0.01, 2.5), LatencyModel(0.12, 0.02, 1.0)]
    noise = np.random.default_rng(1)
    timed: list[tuple[int, list[float]]] = []

    def time_all(vertices: np.ndarray) -> list[float]:
        v, n = cardinality(indptr, indices, vertices)
        ms = [float(t.predict(v, n)) + noise.normal(0, 0.05) for t in truths]
        timed.append((vertices.size, ms))
        return ms

    sizes = [10, 50, 100, 200, 300]
    models, vertex_ms = profile_cluster(time_all, indptr, indices, sizes, np.random.default_rng(2))
    assert len(timed) == 100  # 20 subgraphs per size, each timed on every node
    for model, truth in zip(models, truths, strict=True):
        assert model.beta_v == pytest.approx(truth.beta_v, abs=0.003)
        assert model.beta_n == pytest.approx(truth.beta_n, abs=0.003)
        assert model.eps == pytest.approx(truth.eps, abs=0.3)
    largest = np.array([ms for size, ms in timed if size == 300])
    np.testing.assert_allclose(vertex_ms, largest.mean(axis=0) / 300)
    model = models[0]
    loaded = model.observed(100, 80, 2.0 * float(model.predict(100, 80)))
    assert loaded.eta == pytest.approx(2.0)
    assert float(loaded.predict(300, 10)) == pytest.approx(2.0 * float(model.predict(300, 10)))
    # eta is measured against the unloaded model, not the already-scaled one: a second round at
    # 3x the unloaded time gives 3, not 1.5
    again = loaded.observed(100, 80, 3.0 * float(model.predict(100, 80)))
    assert again.eta == pytest.approx(3.0)


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


def test_nodes_are_timed_together_only_where_each_keeps_its_quota() -> None:
    assert time_together([0.5, 0.5], None, 1)  # the quotas exactly fill the machine
    assert not time_together([0.5, 0.51], None, 1)
    assert not time_together([0.2, None], None, 2)  # an unlimited node takes what is free
    assert time_together([None, None], ["10.0.0.1", "10.0.0.2"], 1)  # a machine each
    assert not time_together([None, None], ["10.0.0.1", "10.0.0.1"], 1)
    assert not time_together([None, None], [None, None], 8)  # no quota, one machine
