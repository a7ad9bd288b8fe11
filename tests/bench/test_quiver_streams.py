"""bench/quiver_streams.py: access counts equal a plain per-request count, per server too."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from gnnserve.graph import open_graph_store
from gnnserve.sampling.sampler import NeighborSampler
from tests.bench.loader import load_bench

streams = load_bench("quiver_streams")


def test_counts_equal_a_plain_count_per_request_and_server(small_store: Path) -> None:
    graph = open_graph_store(small_store)
    seeds = streams.draw_seeds(streams.popularity("zipf", graph.num_nodes, 0), 300, 1)
    got = streams.count_accesses(graph, [5, 3], seeds, (2, 3))
    sampler = NeighborSampler(graph, [5, 3], seed=11)
    total = np.zeros(graph.num_nodes, dtype=np.int64)
    by_server = {p: np.zeros((p, graph.num_nodes), dtype=np.int64) for p in (2, 3)}
    for i, s in enumerate(seeds):
        for v in set(sampler.sample(np.array([s]), rng_seed=i).input_nodes.tolist()):
            total[v] += 1
            for p in (2, 3):
                by_server[p][s % p, v] += 1
    np.testing.assert_array_equal(got.total, total)
    for p in (2, 3):
        np.testing.assert_array_equal(got.per_server[p], by_server[p])
    assert got.rows_read == total.sum()
    held = np.zeros(graph.num_nodes, dtype=bool)
    held[:500] = True
    assert streams.hit_rate(total, held) == total[:500].sum() / total.sum()


def test_popularity_is_a_distribution_skewed_by_zipf() -> None:
    p = streams.popularity("zipf", 1000, 0)
    assert abs(p.sum() - 1) < 1e-12
    top = np.sort(p)[::-1]
    assert top[0] / top[9] > 10**streams.ZIPF_A * 0.99  # rank 1 vs rank 10
    np.testing.assert_allclose(streams.popularity("uniform", 4, 0), 0.25)


def test_the_lru_replay_equals_an_ordered_dict_lru() -> None:
    """The numba LRU (warmed on one read sequence, scored on the next) against a plain
    OrderedDict LRU, over random sizes, capacities and sequences."""
    from collections import OrderedDict

    rng = np.random.default_rng(0)
    for _ in range(60):
        n = int(rng.integers(1, 30))
        capacity = int(rng.integers(1, n + 1))
        warm, reads = (rng.integers(0, n, int(rng.integers(0, 60))) for _ in range(2))
        cache: OrderedDict[int, None] = OrderedDict()
        hits = 0
        for scored, sequence in ((0, warm), (1, reads)):
            for v in sequence.tolist():
                if v in cache:
                    hits += scored
                    cache.move_to_end(v)
                    continue
                if len(cache) == capacity:
                    cache.popitem(last=False)
                cache[v] = None
        assert streams._lru_hits(warm, reads, capacity, n) == hits
