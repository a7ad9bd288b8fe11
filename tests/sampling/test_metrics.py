"""PSGS agrees with the mean sampled size measured by the sampler itself."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from gnnserve.graph import open_graph_store
from gnnserve.sampling import NeighborSampler
from gnnserve.sampling.metrics import psgs


@pytest.mark.parametrize("fanouts", [[-1], [5], [-1, -1]])
def test_psgs_exact_for_one_hop_and_full_fanout(small_store: Path, fanouts) -> None:
    graph = open_graph_store(small_store)
    deg = graph.in_degree().astype(float)
    values = psgs(graph, fanouts)
    if fanouts == [-1]:
        np.testing.assert_allclose(values, 1 + deg)
    elif fanouts == [5]:
        np.testing.assert_allclose(values, 1 + np.minimum(deg, 5))
    else:  # the seed draws its row at both hops, each neighbour its own at the second
        indptr, indices = graph.csr()
        two_hop = np.array([deg[indices[indptr[v] : indptr[v + 1]]].sum() for v in range(50)])
        np.testing.assert_allclose(values[:50], 1 + 2 * deg[:50] + two_hop)


def _drawn_sizes(sampler: NeighborSampler, v: int, runs: int) -> np.ndarray:
    """1 + edges the served sampler draws for seed ``v``, over ``runs`` independent draws."""
    return np.array(
        [
            1 + sum(b.edge_index.shape[1] for b in sampler.sample(np.array([v]), r).blocks)
            for r in range(runs)
        ]
    )


@pytest.mark.parametrize("fanouts", [[4], [4, 3], [25, 10], [-1, 3], [3, -1], [4, 3, 2]])
def test_psgs_matches_the_served_sampler(small_store: Path, fanouts: list[int]) -> None:
    """Monte Carlo of the served multi-hop sampler: for one and two hops PSGS is its expected
    size (a z-test per seed); for three, an upper bound within 5% (dedupe of nodes reached
    twice)."""
    graph = open_graph_store(small_store)
    expected = psgs(graph, fanouts)
    sampler = NeighborSampler(graph, fanouts)
    means, bounds = [], []
    for v in (0, 11, 123, 777, 1500):
        sizes = _drawn_sizes(sampler, v, 300)
        err = 4 * sizes.std() / np.sqrt(sizes.size) + 1e-9
        means.append(sizes.mean())
        bounds.append(expected[v])
        if len(fanouts) <= 2:
            assert abs(sizes.mean() - expected[v]) < err, (v, sizes.mean(), expected[v])
        else:
            assert sizes.mean() < expected[v] + err
    assert abs(np.sum(means) / np.sum(bounds) - 1) < 0.05


# --- FAP (Quiver §5.1) ------------------------------------------------------------------------


def _walk_sum(indptr: np.ndarray, indices: np.ndarray, fanouts: list[int], p0: np.ndarray):
    """Brute force: every walk a seed can start under the sampler's hop rule (each node present
    stays and draws each neighbour u with probability min(deg, f)/deg), enumerated one by one."""
    walks = [(s, p) for s, p in enumerate(p0) if p > 0]
    for fanout in fanouts:
        grown = []
        for node, p in walks:
            grown.append((node, p))  # a node reached earlier is still in the frontier
            deg = indptr[node + 1] - indptr[node]
            for u in indices[indptr[node] : indptr[node + 1]]:
                grown.append((int(u), p * (deg if fanout < 0 else min(deg, fanout)) / deg))
        walks = grown
    out = np.zeros(p0.size)
    for node, p in walks:
        out[node] += p
    return out


def _store(tmp_path: Path, n: int, edges: int, seed: int) -> Path:
    from gnnserve.data.writer import GraphData, write_store

    rng = np.random.default_rng(seed)
    src, dst = rng.integers(0, n, edges), rng.integers(0, n, edges)
    keep = src != dst
    x = np.zeros((n, 2), dtype=np.float32)
    write_store(GraphData("g", n, np.stack([src[keep], dst[keep]]), x), tmp_path / f"g{seed}")
    return tmp_path / f"g{seed}"


@pytest.mark.parametrize(("seed", "fanouts"), [(0, [2]), (1, [2, 1]), (2, [3, -1, 1]), (3, [1, 2])])
def test_fap_equals_brute_force_walk_enumeration(tmp_path: Path, seed: int, fanouts) -> None:
    from gnnserve.sampling.metrics import fap

    graph = open_graph_store(_store(tmp_path, 9, 26, seed))
    p0 = np.random.default_rng(seed).random(9)
    indptr, indices = graph.csr()
    np.testing.assert_allclose(
        fap(graph, fanouts, p0), _walk_sum(indptr, indices, fanouts, p0 / p0.sum()), rtol=1e-12
    )


def _empirical_access(graph, fanouts: list[int], p0: np.ndarray, requests: int) -> np.ndarray:
    """Share of one-seed requests (seed ~ p0) whose sampled input nodes include each node."""
    sampler = NeighborSampler(graph, fanouts, seed=7)
    seeds = np.random.default_rng(3).choice(p0.size, size=requests, p=p0)
    counts = np.zeros(p0.size)
    for seed in seeds:
        counts[sampler.sample(np.array([seed])).input_nodes] += 1
    return counts / requests


def _zipf(n: int) -> np.ndarray:
    p0 = 1.0 / np.arange(1, n + 1) ** 1.1
    return p0[np.random.default_rng(0).permutation(n)] / p0.sum()


def test_fap_one_hop_agrees_with_the_real_samplers_access_frequency(small_store: Path) -> None:
    """One hop: FAP is the exact inclusion probability; the sampler's empirical frequency over
    20,000 Zipf-skewed requests lies within 5 binomial standard errors at every node."""
    from gnnserve.sampling.metrics import fap

    graph = open_graph_store(small_store)
    p0 = _zipf(graph.num_nodes)
    requests = 20_000
    expected = fap(graph, [5], p0)
    measured = _empirical_access(graph, [5], p0, requests)
    sigma = np.sqrt(expected * (1 - expected) / requests) + 1.0 / requests
    assert np.all(np.abs(measured - expected) <= 5 * sigma)


def test_fap_two_hops_bounds_the_access_frequency_and_ranks_like_it(small_store: Path) -> None:
    """Two hops: FAP is an upper bound (union bound) within sampling error, and its hottest
    decile is the sampler's hottest decile (>= 90% overlap)."""
    from gnnserve.sampling.metrics import fap

    graph = open_graph_store(small_store)
    p0 = _zipf(graph.num_nodes)
    requests = 20_000
    expected = fap(graph, [5, 3], p0)
    measured = _empirical_access(graph, [5, 3], p0, requests)
    sigma = np.sqrt(np.clip(expected, 0, 1) * (1 - np.clip(expected, 0, 1)) / requests)
    assert np.all(measured <= expected + 5 * sigma + 1.0 / requests)
    top = graph.num_nodes // 10
    hot_fap = set(np.argsort(-expected)[:top].tolist())
    hot_seen = set(np.argsort(-measured)[:top].tolist())
    assert len(hot_fap & hot_seen) >= 0.9 * top


def test_fap_checks_p0(small_store: Path) -> None:
    from gnnserve.errors import InvalidInputError
    from gnnserve.sampling.metrics import fap

    graph = open_graph_store(small_store)
    n = graph.num_nodes
    for bad in (np.ones(n - 1), -np.ones(n), np.zeros(n), np.full(n, np.nan)):
        with pytest.raises(InvalidInputError, match="p0"):
            fap(graph, [5], bad)
    np.testing.assert_allclose(fap(graph, [5]), fap(graph, [5], np.full(n, 3.0)))
