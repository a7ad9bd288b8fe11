"""IEP: the bottleneck assignment equals brute force over all n! mappings, beats or ties the
baselines, Eq. 8 costs equal a plain computation, METIS parts cut fewer edges than random."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from gnnserve.deploy.fog.planner import (
    FogSpec,
    bottleneck_assignment,
    cost_matrix,
    greedy_assignment,
    metis_parts,
    plan,
    random_assignment,
)
from gnnserve.deploy.fog.profiler import LatencyModel
from gnnserve.errors import InvalidInputError
from tests.conftest import random_simple_graph


def _brute_force(costs: np.ndarray) -> float:
    n = costs.shape[0]
    return min(costs[np.arange(n), list(p)].max() for p in itertools.permutations(range(n)))


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 6, 7])
def test_bottleneck_equals_brute_force(n: int) -> None:
    rng = np.random.default_rng(n)
    for trial in range(20):
        costs = rng.random((n, n)) * 100
        if trial % 4 == 0:  # ties
            costs = np.round(costs / 20) * 20
        cols = bottleneck_assignment(costs)
        assert sorted(cols.tolist()) == list(range(n))
        got = costs[np.arange(n), cols].max()
        assert got == pytest.approx(_brute_force(costs), abs=0)
        for other in (greedy_assignment(costs), random_assignment(n, rng)):
            assert sorted(other.tolist()) == list(range(n))
            assert costs[np.arange(n), other].max() >= got


def test_ties_at_the_bottleneck_take_the_least_total() -> None:
    costs = np.array([[5.0, 1.0, 9.0], [5.0, 5.0, 1.0], [9.0, 5.0, 5.0]])
    cols = bottleneck_assignment(costs)  # bottleneck 5; (1, 2, 0) costs 1+1+9? no: must be <= 5
    n = 3
    best = min(
        (costs[np.arange(n), list(p)].sum(), p)
        for p in itertools.permutations(range(n))
        if costs[np.arange(n), list(p)].max() <= 5.0
    )
    assert costs[np.arange(n), cols].sum() == best[0]


def test_bad_cost_matrices_are_refused() -> None:
    for bad in (np.ones((2, 3)), np.array([[1.0, np.nan], [1.0, 1.0]])):
        with pytest.raises(InvalidInputError, match="square and finite"):
            bottleneck_assignment(bad)


def _graph(n: int = 600, m: int = 6000) -> tuple[np.ndarray, np.ndarray]:
    ei = random_simple_graph(n, m, seed=3)
    order = np.argsort(ei[1], kind="stable")
    src, dst = ei[0][order], ei[1][order]
    indptr = np.concatenate([[0], np.cumsum(np.bincount(dst, minlength=n))])
    return indptr, src.astype(np.int64)


def test_eq8_costs_equal_a_plain_computation() -> None:
    indptr, indices = _graph()
    parts = np.random.default_rng(0).integers(0, 3, indptr.size - 1)
    fogs = [
        FogSpec("weak", 1e6, LatencyModel(0.02, 0.01, 3.0)),
        FogSpec("mid", 5e6, LatencyModel(0.01, 0.005, 2.0)),
        FogSpec("strong", 2e7, LatencyModel(0.002, 0.001, 1.0)),
    ]
    got = cost_matrix(indptr, indices, parts, fogs, phi_bytes=512, layers=2, delta_ms=4.0)
    for k in range(3):
        members = set(np.flatnonzero(parts == k).tolist())
        halo = {
            int(u)
            for v in members
            for u in indices[indptr[v] : indptr[v + 1]]
            if int(u) not in members
        }
        for j, f in enumerate(fogs):
            m = f.model
            want = len(members) * 512 / f.bandwidth * 1e3
            want += m.beta_v * len(members) + m.beta_n * len(halo) + m.eps + 2 * 4.0
            assert got[k, j] == pytest.approx(want)


def test_metis_cuts_fewer_edges_than_random_parts() -> None:
    indptr, indices = _graph(1000, 8000)
    dst = np.repeat(np.arange(1000), np.diff(indptr))
    parts = metis_parts(indptr, indices, 4)
    assert sorted(np.unique(parts).tolist()) == [0, 1, 2, 3]
    assert np.bincount(parts).min() >= 1000 / 4 * 0.8  # balanced
    cut = np.mean(parts[indices] != parts[dst])
    shuffled = np.random.default_rng(0).permutation(parts)
    assert cut < np.mean(shuffled[indices] != shuffled[dst]) - 0.05
    assert (metis_parts(indptr, indices, 1) == 0).all()
    with pytest.raises(InvalidInputError, match="parts"):
        metis_parts(indptr, indices, 1001)


def test_plan_puts_the_most_work_on_the_strongest_fog() -> None:
    indptr, indices = _graph()
    fogs = [
        FogSpec("weak", 1e6, LatencyModel(0.05, 0.01, 1.0)),
        FogSpec("strong", 1e8, LatencyModel(0.005, 0.001, 1.0)),
    ]
    parts = np.where(np.arange(indptr.size - 1) < 450, 0, 1)  # part 0 holds 3/4 of the vertices
    p = plan(indptr, indices, fogs, 512, 2, parts=parts)
    assert p.part_to_fog.tolist() == [1, 0]
    assert (p.membership[:450] == 1).all() and (p.membership[450:] == 0).all()
    assert p.bottleneck_ms == pytest.approx(p.costs[[0, 1], [1, 0]].max())
    greedy = plan(indptr, indices, fogs, 512, 2, assign="greedy", parts=parts)
    assert greedy.bottleneck_ms >= p.bottleneck_ms
    with pytest.raises(InvalidInputError, match="assign"):
        plan(indptr, indices, fogs, 512, 2, assign="best", parts=parts)


def test_weighted_metis_parts_follow_the_weights() -> None:
    indptr, indices = _graph(2000, 16000)
    parts = metis_parts(indptr, indices, 3, weights=np.array([1.0, 2.0, 4.0]))
    shares = np.bincount(parts, minlength=3) / 2000
    np.testing.assert_allclose(shares, [1 / 7, 2 / 7, 4 / 7], atol=0.03)
    with pytest.raises(InvalidInputError, match="weights"):
        metis_parts(indptr, indices, 3, weights=np.array([1.0, 0.0, 1.0]))


def test_greedy_gives_the_largest_part_first_pick() -> None:
    """Fig. 8's METIS+Greedy, parts largest first: a plain loop over the parts in size order,
    each taking its cheapest free fog."""
    rng = np.random.default_rng(5)
    for _ in range(50):
        n = int(rng.integers(2, 7))
        costs, sizes = rng.random((n, n)), rng.integers(1, 100, n)
        want, free = np.empty(n, np.int64), list(range(n))
        for k in sorted(range(n), key=lambda k: (-sizes[k], k)):
            j = min(free, key=lambda j: (costs[k, j], j))
            want[k] = j
            free.remove(j)
        np.testing.assert_array_equal(greedy_assignment(costs, sizes), want)
    costs = np.array([[1.0, 5.0], [2.0, 9.0]])  # both parts cost least on fog 0
    np.testing.assert_array_equal(greedy_assignment(costs, np.array([10, 90])), [1, 0])
    np.testing.assert_array_equal(greedy_assignment(costs), [0, 1])  # no sizes: index order
