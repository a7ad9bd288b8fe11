"""Recomputation policies against brute-force Python, and the oracle against true PE errors."""

from __future__ import annotations

import math
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
import torch

from gnnserve.data.writer import GraphData, write_store
from gnnserve.errors import InvalidInputError
from gnnserve.newnodes.policies import (
    Candidates,
    PolicyInputs,
    budget,
    check_gamma,
    importance_scores,
    select_targets,
)
from tests.embeddings.reference import layer_outputs, srpe_graph
from tests.newnodes.test_inference import N, build, request, stored_graph


def brute_budget(gamma: float, count: int) -> int:
    return math.ceil(Fraction(str(gamma)) * count)


def brute_top(nodes: list[int], scores: list, b: int) -> list[int]:  # type: ignore[type-arg]
    ranked = sorted(zip(nodes, scores, strict=True), key=lambda p: (-p[1], p[0]))
    return sorted(v for v, _ in ranked[:b])


def random_candidates(seed: int, c: int = 30) -> Candidates:
    rng = np.random.default_rng(seed)
    nodes = np.sort(rng.choice(200, c, replace=False)).astype(np.int64)
    return Candidates(nodes, rng.integers(1, 4, c), rng.integers(0, 6, c))  # many ties


def brute_importance(num_nodes: int, edges: list[tuple[int, int]]) -> list[float]:
    """IS(v) = 1/deg(v) * sum over in-neighbours u (with multiplicity) of 1/deg(u)."""
    ins: list[list[int]] = [[] for _ in range(num_nodes)]
    for u, v in edges:
        ins[v].append(u)
    deg = [len(x) for x in ins]
    return [
        sum(1.0 / deg[u] for u in ins[v] if deg[u]) / deg[v] if deg[v] else 0.0
        for v in range(num_nodes)
    ]


# ------------------------------------------------------------------ budget and gamma


def test_budget_is_ceil_of_gamma_times_count() -> None:
    gammas = [0.0, 0.01, 0.05, 0.1, 0.2, 0.25, 0.3, 1 / 3, 0.5, 0.6, 0.7, 0.9, 0.99, 1.0]
    for count in range(0, 41):
        for gamma in gammas:
            want = brute_budget(gamma, count) if gamma != 1 / 3 else -(-count // 3)
            assert budget(gamma, count) == want, (gamma, count)


@pytest.mark.parametrize("gamma", [-0.01, 1.01, float("nan"), "0.5", None, True])
def test_check_gamma_rejects(gamma: object) -> None:
    with pytest.raises(InvalidInputError) as err:
        check_gamma(gamma)
    assert err.value.field == "gamma"


# ------------------------------------------------------------------ select_targets


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("gamma", [0.1, 0.3, 0.5, 0.8])
def test_query_edges_ratio_top(seed: int, gamma: float) -> None:
    cands = random_candidates(seed)
    scores = [
        Fraction(int(q), int(q) + int(d))
        for q, d in zip(cands.query_edges, cands.degree, strict=True)
    ]
    want = brute_top(cands.nodes.tolist(), scores, brute_budget(gamma, cands.count))
    got = select_targets("query_edges_ratio", gamma, cands)
    assert got.dtype == np.int64 and got.tolist() == want


@pytest.mark.parametrize("seed", range(3))
def test_importance_top(seed: int) -> None:
    cands = random_candidates(seed)
    rng = np.random.default_rng(seed + 10)
    importance = rng.integers(0, 5, 200) / 4.0  # ties again
    want = brute_top(cands.nodes.tolist(), importance[cands.nodes].tolist(), 9)
    got = select_targets("importance", 0.3, cands, PolicyInputs(importance=importance))
    assert got.tolist() == want


def test_oracle_top_and_missing_inputs() -> None:
    cands = random_candidates(0)
    errors = np.random.default_rng(1).random(cands.count)
    want = brute_top(cands.nodes.tolist(), errors.tolist(), 6)
    assert select_targets("oracle", 0.2, cands, PolicyInputs(errors=errors)).tolist() == want
    for policy, inputs in [
        ("oracle", PolicyInputs()),
        ("oracle", PolicyInputs(errors=errors[:-1])),
        ("importance", PolicyInputs()),
    ]:
        with pytest.raises(InvalidInputError) as err:
            select_targets(policy, 0.2, cands, inputs)
        assert err.value.field == "policy"
    with pytest.raises(InvalidInputError):
        select_targets("best", 0.2, cands)


def test_random_is_seeded_and_uniform() -> None:
    cands = random_candidates(2, c=10)
    first = select_targets("random", 0.3, cands, PolicyInputs(seed=7))
    assert first.tolist() == select_targets("random", 0.3, cands, PolicyInputs(seed=7)).tolist()
    hits = np.zeros(cands.count)
    trials = 2000
    for seed in range(trials):
        got = select_targets("random", 0.3, cands, PolicyInputs(seed=seed))
        assert got.size == 3 and np.isin(got, cands.nodes).all()
        hits += np.isin(cands.nodes, got)
    assert np.abs(hits / trials - 0.3).max() < 0.05  # binomial sd ~0.01


def test_budget_extremes_need_no_scores() -> None:
    cands = random_candidates(3)
    for policy in ("query_edges_ratio", "importance", "random", "oracle"):
        assert select_targets(policy, 0.0, cands).size == 0
        assert select_targets(policy, 1.0, cands).tolist() == cands.nodes.tolist()


# ------------------------------------------------------------------ importance scores


def test_importance_scores_brute_force() -> None:
    rng = np.random.default_rng(0)
    n = 40
    edges = [(int(a), int(b)) for a, b in rng.integers(0, n - 5, (150, 2))]  # 5 isolated nodes
    edges += [(3, 3), (7, 8), (7, 8)]  # a self loop and a duplicate
    indptr = np.zeros(n + 1, np.int64)
    np.add.at(indptr, np.array([b for _, b in edges]) + 1, 1)
    indptr = np.cumsum(indptr)
    by_dst = sorted(edges, key=lambda e: e[1])
    indices = np.array([a for a, _ in by_dst], np.int32)
    got = importance_scores(np.diff(indptr), indptr, indices)
    np.testing.assert_allclose(got, brute_importance(n, edges), rtol=1e-12)


# ------------------------------------------------------------------ with the engine


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    ei, x = stored_graph(seed=1)
    out = tmp_path_factory.mktemp("policies") / "store"
    write_store(GraphData("p", N, ei, x), out)
    return out


def test_engine_candidates_and_importance(store: Path) -> None:
    s = build(store, "sage", 2)
    new = request(3)
    cands = s.engine.candidates(new)
    counts: dict[int, int] = {}
    for _, u in new.edges.tolist():
        counts[u] = counts.get(u, 0) + 1
    assert cands.nodes.tolist() == sorted(counts)
    assert cands.query_edges.tolist() == [counts[u] for u in sorted(counts)]
    stored_in = np.bincount(s.edge_index[1], minlength=N)
    assert cands.degree.tolist() == stored_in[cands.nodes].tolist()
    edges = list(map(tuple, s.edge_index.T.tolist()))
    np.testing.assert_allclose(s.engine.importance, brute_importance(N, edges), rtol=1e-12)


@pytest.mark.parametrize(("arch", "k"), [("gcn", 2), ("sage", 3), ("gat", 3)])
def test_oracle_picks_largest_true_errors(store: Path, arch: str, k: int) -> None:
    s = build(store, arch, k)
    new = request(4)
    cands = s.engine.candidates(new)
    errors = s.engine.true_errors(new, cands)
    # brute force: exact layer outputs on G+ minus the PEs, summed over layers 1..k-1
    x = torch.cat([s.x, new.features])
    exact = layer_outputs(s.model, x, srpe_graph(s.edge_index, N, new, None))
    want = np.zeros(cands.count)
    for layer in range(k - 1):
        diff = exact[layer][cands.nodes].double() - s.pes[layer][cands.nodes].double()
        want += torch.linalg.vector_norm(diff, dim=1).numpy()
    np.testing.assert_allclose(errors, want, atol=1e-5)
    assert (errors > 1e-4).any()
    for gamma in (0.2, 0.5):
        res = s.engine.run(new, gamma=gamma, policy="oracle")
        b = brute_budget(gamma, cands.count)
        assert res.recomputed.tolist() == brute_top(cands.nodes.tolist(), want.tolist(), b)
