"""Feature placement: tier fill and server plans against plain sorts, a plain sequential greedy
and brute-force enumeration of stable assignments; remote share against a plain count."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from gnnserve.errors import InvalidInputError
from gnnserve.features import partitioned, placement
from gnnserve.features.placement import (
    REPLICATED,
    ServerPlan,
    default_replicated,
    degree_partition,
    degree_tier_plan,
    hash_partition,
    random_server_plan,
    random_tier_plan,
    remote_share,
    server_plan,
    tier_plan,
)


def plain_rank(scores: np.ndarray) -> list[int]:
    """Node ids by score descending, ties by id: a plain Python sort."""
    return sorted(range(len(scores)), key=lambda v: (-float(scores[v]), v))


def check_server_plan(plan: ServerPlan, n: int) -> None:
    """Every node replicated or owned by exactly one server; no server over capacity."""
    owned = np.concatenate(plan.owned)
    assert np.array_equal(np.sort(np.concatenate([plan.replicated, owned])), np.arange(n))
    for p in range(plan.num_servers):
        assert np.array_equal(plan.owned[p], np.flatnonzero(plan.owner == p))
        assert plan.held(p).size <= plan.per_server_rows
    assert np.array_equal(np.sort(plan.replicated), np.flatnonzero(plan.owner == REPLICATED))


def plain_greedy(scores: np.ndarray, ids: list[int], capacity: int) -> dict[int, int]:
    """Sequential greedy: (server, node) pairs by score descending, ties by node id then
    server; a pair is taken when the node is unplaced and the server has room."""
    p_count = scores.shape[0]
    pairs = sorted((-float(scores[p, v]), v, p) for v in ids for p in range(p_count))
    owner: dict[int, int] = {}
    load = [0] * p_count
    for _, v, p in pairs:
        if v not in owner and load[p] < capacity:
            owner[v] = p
            load[p] += 1
    return owner


def test_tier_fill_order_and_budgets_match_a_plain_sort() -> None:
    rng = np.random.default_rng(1)
    scores = rng.integers(0, 6, 200).astype(float)  # many ties: broken by id
    row_bytes = 64
    budgets = {"gpu": 10 * 64 + 63, "ram": 30 * 64, "disk": 0.0, "remote": None}
    plan = tier_plan(scores, row_bytes, budgets)
    ranked = plain_rank(scores)
    expected = [ranked[:10], ranked[10:40], [], ranked[40:]]
    assert plan.names == ("gpu", "ram", "disk", "remote")
    assert plan.sizes() == {"gpu": 10, "ram": 30, "disk": 0, "remote": 160}
    for t, ids in enumerate(expected):
        assert plan.nodes[t].tolist() == ids
        assert plan.tier[ids].tolist() == [t] * len(ids)
        assert plan.row[ids].tolist() == list(range(len(ids)))
    assert plan.index("disk") == 2


def test_tier_plan_budgets_larger_than_the_graph_and_finite_last_tier() -> None:
    scores = np.arange(5, dtype=float)
    plan = tier_plan(scores, 4, {"ram": 1000, "disk": 1000})  # finite last tier, room to spare
    assert plan.sizes() == {"ram": 5, "disk": 0}
    assert plan.nodes[0].tolist() == [4, 3, 2, 1, 0]


@pytest.mark.parametrize(
    ("scores", "row_bytes", "budgets", "field"),
    [
        (np.ones(5), 4, {"ram": 8, "disk": 8}, "budgets"),  # 3 rows do not fit the last tier
        (np.ones(5), 4, {"ram": None, "disk": None}, "budgets"),  # unbounded before the last
        (np.ones(5), 4, {"ram": -4, "disk": None}, "budgets"),
        (np.ones(5), 4, {}, "budgets"),
        (np.ones(5), 0, {"ram": None}, "row_bytes"),
        (np.array([1.0, np.nan]), 4, {"ram": None}, "scores"),
        (np.array([1.0, -1.0]), 4, {"ram": None}, "scores"),
        (np.ones((2, 2)), 4, {"ram": None}, "scores"),
    ],
)
def test_tier_plan_rejects_bad_input(
    scores: np.ndarray, row_bytes: int, budgets: dict, field: str
) -> None:
    with pytest.raises(InvalidInputError) as err:
        tier_plan(scores, row_bytes, budgets)
    assert err.value.field == field


def test_one_score_vector_replicates_the_top_and_deals_the_rest_round_robin() -> None:
    rng = np.random.default_rng(2)
    n, servers, cap = 103, 4, 40
    scores = rng.integers(0, 9, n).astype(float)
    plan = server_plan(scores, servers, cap)
    r = default_replicated(n, servers, cap)
    assert r + servers * (cap - r) >= n > (r + 1) + servers * (cap - r - 1)
    ranked = plain_rank(scores)
    assert plan.replicated.tolist() == ranked[:r]
    assert [int(plan.owner[v]) for v in ranked[r:]] == [i % servers for i in range(n - r)]
    check_server_plan(plan, n)
    # the owner array is what features.partitioned.FeatureCluster takes
    assert REPLICATED == partitioned.REPLICATED
    assert np.array_equal(partitioned.check_owner(plan.owner, n, servers), plan.owner)
    for p in range(servers):
        assert np.array_equal(partitioned.held_rows(plan.owner, p), plan.held(p))


@pytest.mark.parametrize("seed", range(12))
def test_per_server_scores_equal_a_plain_sequential_greedy(seed: int) -> None:
    rng = np.random.default_rng(seed)
    servers = int(rng.integers(2, 5))
    n = int(rng.integers(5, 40))
    cap = int(rng.integers(-(-n // servers), n + 1))
    scores = rng.integers(0, 5, (servers, n)).astype(float)  # ties on both sides
    replicated = int(rng.integers(0, default_replicated(n, servers, cap) + 1))
    plan = server_plan(scores, servers, cap, replicated=replicated)
    ranked = plain_rank(scores.sum(axis=0))
    assert plan.replicated.tolist() == ranked[:replicated]
    expected = plain_greedy(scores, ranked[replicated:], cap - replicated)
    assert {v: int(plan.owner[v]) for v in ranked[replicated:]} == expected
    check_server_plan(plan, n)


def stable_assignments(scores: np.ndarray, capacity: int) -> list[tuple[int, ...]]:
    """Brute force: every assignment of nodes to servers within capacity with no node and
    server that both prefer each other (the server has room or holds a node it wants less)."""
    servers, n = scores.shape
    found = []
    for owner in itertools.product(range(servers), repeat=n):
        load = np.bincount(owner, minlength=servers)
        if load.max() > capacity:
            continue
        blocking = any(
            scores[q, v] > scores[owner[v], v]
            and (
                load[q] < capacity
                or any(scores[q, u] < scores[q, v] for u in range(n) if owner[u] == q)
            )
            for v in range(n)
            for q in range(servers)
        )
        if not blocking:
            found.append(owner)
    return found


@pytest.mark.parametrize(
    ("seed", "servers", "n", "cap"), [(0, 2, 7, 4), (1, 3, 6, 2), (2, 3, 7, 3)]
)
def test_per_server_scores_give_the_unique_stable_assignment(
    seed: int, servers: int, n: int, cap: int
) -> None:
    scores = np.random.default_rng(seed).random((servers, n))  # no ties
    plan = server_plan(scores, servers, cap, replicated=0)
    assert stable_assignments(scores, cap) == [tuple(plan.owner.tolist())]


def test_each_node_on_the_server_reading_it_most_when_capacity_allows() -> None:
    rng = np.random.default_rng(3)
    scores = rng.random((3, 500)) * (rng.random((3, 500)) < 0.7)  # zeros tie: lowest server
    plan = server_plan(scores, 3, 500, replicated=0)
    assert np.array_equal(plan.owner, np.argmax(scores, axis=0))


def test_home_servers_hold_their_hottest_nodes() -> None:
    rng = np.random.default_rng(4)
    n, servers, cap = 300, 3, 110
    scores = rng.random(n)
    home = rng.integers(0, servers, n)
    plan = server_plan(scores, servers, cap, home=home, replicated=10)
    check_server_plan(plan, n)
    for v in np.flatnonzero((plan.owner != REPLICATED) & (plan.owner != home)):
        # its home server is full of nodes at least as hot as v
        held = plan.owned[home[v]]
        assert held.size == cap - 10 and scores[held].min() >= scores[v]
    assert (plan.owner[plan.owner != REPLICATED] == home[plan.owner != REPLICATED]).mean() > 0.8
    roomy = server_plan(scores, servers, n, home=home, replicated=0)
    assert np.array_equal(roomy.owner, home)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"scores": np.ones(10), "num_servers": 2, "per_server_rows": 4}, "per_server_rows"),
        ({"scores": np.ones(10), "num_servers": 0, "per_server_rows": 10}, "num_servers"),
        ({"scores": np.ones((3, 10)), "num_servers": 2, "per_server_rows": 10}, "scores"),
        (
            {"scores": np.ones(4), "num_servers": 2, "per_server_rows": 3, "replicated": 4},
            "replicated",
        ),
        (
            {"scores": np.ones(4), "num_servers": 2, "per_server_rows": 3, "replicated": 3},
            "per_server_rows",
        ),
        (
            {"scores": np.ones(4), "num_servers": 2, "per_server_rows": 4, "home": [0, 1, 2, 0]},
            "home",
        ),
        (
            {
                "scores": np.ones((2, 4)),
                "num_servers": 2,
                "per_server_rows": 4,
                "home": [0, 1, 1, 0],
            },
            "home",
        ),
    ],
)
def test_server_plan_rejects_bad_input(kwargs: dict, field: str) -> None:
    with pytest.raises(InvalidInputError) as err:
        server_plan(**kwargs)
    assert err.value.field == field


def test_remote_share_matches_a_plain_count() -> None:
    rng = np.random.default_rng(5)
    n, servers = 60, 3
    plan = server_plan(rng.random((servers, n)), servers, 25)
    counts = rng.integers(0, 5, (servers, n))
    row_bytes = rng.integers(1, 100, n)
    remote = total = 0
    for p in range(servers):
        for v in range(n):
            total += counts[p, v] * row_bytes[v]
            if plan.owner[v] not in (REPLICATED, p):
                remote += counts[p, v] * row_bytes[v]
    assert remote_share(plan, counts, row_bytes) == pytest.approx(remote / total)
    assert remote_share(plan, counts, 512) == pytest.approx(
        sum(counts[p, v] for p in range(servers) for v in range(n) if plan.owner[v] not in (-1, p))
        / counts.sum()
    )
    assert remote_share(plan, np.zeros((servers, n)), 4) == 0.0
    with pytest.raises(InvalidInputError):
        remote_share(plan, counts[:2], 4)


def test_baselines() -> None:
    hashed = hash_partition(10, 3)
    assert hashed.owner.tolist() == [v % 3 for v in range(10)] and hashed.replicated.size == 0
    check_server_plan(hashed, 10)
    # uniform traffic on every server: a server reads 1 - (its share of nodes) remotely
    assert remote_share(hashed, np.ones((3, 10)), 4) == pytest.approx(1 - 10 / 30)
    degrees = np.random.default_rng(6).integers(0, 20, 50)
    by_degree = degree_partition(degrees, 4, 20)
    assert np.array_equal(by_degree.owner, server_plan(degrees.astype(float), 4, 20).owner)
    assert by_degree.replicated.tolist() == plain_rank(degrees)[: by_degree.replicated.size]
    tiers = degree_tier_plan(degrees, 8, {"ram": 80, "disk": None})
    assert tiers.nodes[0].tolist() == plain_rank(degrees)[:10]
    a, b = random_server_plan(50, 4, 20, seed=1), random_server_plan(50, 4, 20, seed=1)
    assert np.array_equal(a.owner, b.owner)
    assert not np.array_equal(a.owner, random_server_plan(50, 4, 20, seed=2).owner)
    check_server_plan(a, 50)
    r1, r2 = (
        random_tier_plan(50, 8, {"ram": 80, "disk": None}, seed=1),
        random_tier_plan(50, 8, {"ram": 80, "disk": None}, seed=2),
    )
    assert r1.sizes() == {"ram": 10, "disk": 40} and not np.array_equal(r1.tier, r2.tier)
    assert placement.rank_nodes(np.array([1.0, 3.0, 3.0, 0.0])).tolist() == [1, 2, 0, 3]
