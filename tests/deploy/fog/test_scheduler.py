"""Algorithm 2 on scripted load changes: keep when balanced, diffusion when few fogs are slow
(moving the boundary vertices a plain greedy picks, until the pair is even), IEP when many are."""

from __future__ import annotations

import numpy as np
import pytest

from gnnserve.deploy.fog.partition import symmetric_adjacency
from gnnserve.deploy.fog.scheduler import (
    diffuse_pair,
    schedule,
    skew,
)
from gnnserve.errors import InvalidInputError
from tests.deploy.fog.test_planner import _graph


def _setup(n_fogs: int = 4) -> tuple:  # type: ignore[type-arg]
    indptr, indices = _graph(800, 6000)
    adjacency = symmetric_adjacency(indptr, indices)
    membership = np.arange(800) % n_fogs
    return adjacency, membership


def _never(_: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    raise AssertionError("IEP must not be called")


def _true_times(membership: np.ndarray, per_vertex_ms: np.ndarray) -> np.ndarray:
    return np.bincount(membership, minlength=per_vertex_ms.size) * per_vertex_ms


def test_skew_is_eq9() -> None:
    np.testing.assert_allclose(skew(np.array([1.0, 2.0, 3.0])), [0.5, 1.0, 1.5])
    for bad in (np.array([1.0, np.nan]), np.array([]), np.array([-1.0, 1.0])):
        with pytest.raises(InvalidInputError, match="round times"):
            skew(bad)


def test_balanced_rounds_keep_the_plan() -> None:
    adjacency, membership = _setup()
    decision = schedule(adjacency, membership, np.array([10.0, 11.0, 9.5, 10.2]), _never)
    assert decision.mode == "keep" and decision.moved.size == 0
    np.testing.assert_array_equal(decision.membership, membership)


def test_one_slow_fog_is_diffused_back_within_the_slack() -> None:
    adjacency, membership = _setup()
    per_vertex = np.array([0.05, 0.05, 0.05, 0.05])
    per_vertex[1] *= 3  # background load on fog 1
    times = _true_times(membership, per_vertex)
    decision = schedule(adjacency, membership, times, _never, slack=1.2, damping=1.0)
    assert decision.mode == "diffusion"
    assert decision.mu[1] == pytest.approx(3 / 1.5)
    assert decision.moved.size > 0
    assert (decision.membership[decision.moved] != 1).all()  # nothing moves onto the slow fog
    assert (membership[decision.moved] == 1).mean() > 0.5  # it gave most of the moved vertices
    changed = np.flatnonzero(decision.membership != membership)
    np.testing.assert_array_equal(np.sort(changed), decision.moved)
    after = _true_times(decision.membership, per_vertex)
    assert after.max() <= 1.2 * after.mean()  # back within the slack on the true times
    np.testing.assert_allclose(decision.predicted_ms, after)  # per-vertex model is exact here
    assert np.array_equal(membership, np.arange(800) % 4)  # the caller's plan is untouched


def _greedy_reference(adjacency, membership, slow, fast, count):  # type: ignore[no-untyped-def]
    member = membership.copy()
    dense = adjacency.toarray()
    out = []
    for _ in range(count):
        best, best_links = -1, -1
        for v in range(member.size):
            if member[v] == slow:
                links = int(dense[v][member == fast].sum())
                if links > best_links:
                    best, best_links = v, links
        if best < 0:
            break
        member[best] = fast
        out.append(best)
    return out


def test_damping_moves_part_of_the_way() -> None:
    adjacency, membership = _setup()
    per_vertex = np.array([0.05, 0.15, 0.05, 0.05])
    times = _true_times(membership, per_vertex)
    full = schedule(adjacency, membership, times, _never, slack=1.01, damping=1.0)
    half = schedule(adjacency, membership, times, _never, slack=1.01, damping=0.5)
    first_pair = int((times[1] - times[0]) / (0.15 + 0.05))  # 200 vertices even fogs 1 and 0
    assert half.moved.size < full.moved.size
    assert (membership[half.moved] == 1).sum() >= first_pair // 2
    with pytest.raises(InvalidInputError, match="damping"):
        schedule(adjacency, membership, times, _never, damping=0.0)


def test_diffusion_moves_the_vertices_a_plain_greedy_picks() -> None:
    indptr, indices = _graph(200, 1200)
    adjacency = symmetric_adjacency(indptr, indices)
    membership = np.random.default_rng(4).integers(0, 3, 200)
    member = membership.copy()
    moved = diffuse_pair(adjacency, member, 0, 2, 15)
    assert moved.tolist() == _greedy_reference(adjacency, membership, 0, 2, 15)
    assert (member[moved] == 2).all()


def test_many_slow_fogs_replan_with_iep() -> None:
    adjacency, membership = _setup()
    calls: list[np.ndarray] = []
    new = (np.arange(800) + 1) % 4

    def replan(times: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        calls.append(times)
        return new, np.full(4, 7.0)

    times = np.array([10.0, 10.0, 10.0, 1.0])  # mu 1.29 on three of four fogs: n+/n = 0.75
    decision = schedule(adjacency, membership, times, replan, slack=1.2, skew_threshold=0.5)
    assert decision.mode == "replan" and len(calls) == 1
    np.testing.assert_array_equal(calls[0], times)
    np.testing.assert_array_equal(decision.membership, new)
    assert decision.moved.size == 800
    with pytest.raises(InvalidInputError, match="slack"):
        schedule(adjacency, membership, times, replan, slack=1.0)


def test_a_small_skew_must_show_twice_and_a_surge_acts_at_once() -> None:
    adjacency, membership = _setup()
    noisy = np.array([10.0, 10.0, 10.0, 15.0])  # mu 1.33: past the slack, below 2 x slack
    first = schedule(adjacency, membership, noisy, _never, previous=np.zeros(4, bool))
    assert first.mode == "keep" and first.over is not None and first.over.tolist() == [0, 0, 0, 1]
    again = schedule(adjacency, membership, noisy, _never, previous=first.over)
    assert again.mode == "diffusion" and again.moved.size > 0
    elsewhere = schedule(adjacency, membership, noisy[::-1].copy(), _never, previous=first.over)
    assert elsewhere.mode == "keep"  # fog 0 was not past the slack before
    surge = np.array([10.0, 10.0, 10.0, 60.0])  # mu 2.67 > 2 x 1.2
    quiet = np.zeros(4, bool)
    assert schedule(adjacency, membership, surge, _never, previous=quiet).mode == "diffusion"
    assert schedule(adjacency, membership, noisy, _never).mode == "diffusion"  # no history


def test_a_surge_is_evened_in_one_undamped_step() -> None:
    adjacency, membership = _setup()
    per_vertex = np.array([0.05, 0.05, 0.05, 0.05])
    per_vertex[2] *= 4  # mu 2.29, above 2 x slack (2.2): a surge
    times = _true_times(membership, per_vertex)
    surge = schedule(adjacency, membership, times, _never, slack=1.1, damping=0.5)
    full = schedule(adjacency, membership, times, _never, slack=1.1, damping=1.0)
    np.testing.assert_array_equal(surge.membership, full.membership)
    mild = schedule(adjacency, membership, times, _never, slack=1.1, damping=0.5, surge=3.0)
    assert mild.moved.size < full.moved.size  # below 3 x slack the step stays damped


def test_the_papers_boundaries() -> None:
    """Algorithm 2 at its edges: mu equal to lambda is not overloaded (mu > lambda); exactly
    theta * n overloaded fogs still diffuse (n+/n <= theta); one more re-plans."""
    adjacency, membership = _setup()
    at_slack = np.array([5.0, 4.0, 3.5, 3.5])  # mean 4: mu 1.25, exactly the slack
    assert schedule(adjacency, membership, at_slack, _never, slack=1.25).mode == "keep"
    past = schedule(adjacency, membership, at_slack + [1e-9, 0, 0, 0], _never, slack=1.25)
    assert past.mode == "diffusion"
    half = np.array([30.0, 30.0, 10.0, 10.0])  # 2 of 4 over: n+/n = 0.5 = theta
    assert schedule(adjacency, membership, half, _never, skew_threshold=0.5).mode == "diffusion"
    called: list[np.ndarray] = []

    def replan(times: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        called.append(times)
        return membership, times

    three = np.array([30.0, 30.0, 30.0, 1.0])  # mean 22.75: three of four past 1.2x
    assert schedule(adjacency, membership, three, replan, skew_threshold=0.5).mode == "replan"
    assert len(called) == 1


def test_diffusion_pairs_the_slowest_with_the_fastest() -> None:
    adjacency, membership = _setup()
    times = np.array([40.0, 10.0, 20.0, 5.0])  # slowest 0, fastest 3
    decision = schedule(adjacency, membership, times, _never, slack=1.2)
    assert decision.mode == "diffusion"
    first = decision.moved[membership[decision.moved] == 0]
    assert first.size and (decision.membership[first] == 3).all()
    assert (decision.membership[decision.moved] != 0).all()
