"""bench/sampling_bound.py: the plain-loop bound draws real neighbours, and the stage split
samples the same computation graph as the served sampler's throughput path."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from gnnserve.features import open_feature_store
from gnnserve.graph import open_graph_store
from gnnserve.sampling import NeighborSampler, kernels
from tests.bench.loader import load_bench

bound = load_bench("sampling_bound")


def test_plain_draws_pick_neighbours_of_each_frontier_node(small_store: Path) -> None:
    graph = open_graph_store(small_store)
    row_start, degree, indices = graph.adjacency()
    frontier = np.random.default_rng(0).integers(0, graph.num_nodes, 300)
    offsets = kernels.hop_counts(degree, frontier, 7)
    out = np.full(int(offsets[-1]), -1, dtype=np.int64)
    bound.plain_draws(row_start, degree, indices, frontier, offsets, out)
    for i, v in enumerate(frontier.tolist()):
        lo = int(row_start[v])
        neighbours = set(np.asarray(indices[lo : lo + int(degree[v])]).tolist())
        assert set(out[offsets[i] : offsets[i + 1]].tolist()) <= neighbours


def test_stage_split_counts_the_served_samples_sizes(small_store: Path) -> None:
    graph, features = open_graph_store(small_store), open_feature_store(small_store)
    seeds = np.random.default_rng(1).integers(0, graph.num_nodes, 40)
    times = bound.stage_times(graph, features.table, [5, 3], seeds)
    served = NeighborSampler(graph, [5, 3], parallel_threshold=1).sample(seeds, rng_seed=1)
    assert times.edges == sum(b.edge_index.shape[1] for b in served.blocks)
    assert times.nodes == served.nodes.size and times.bytes == times.nodes * features.dim * 4
    row = bound.split_and_bound(graph, features.table, [5, 3], [seeds, seeds], gbps=10.0)
    assert row["bound_ms"] == row["plain_draw_ms"] + row["bytes"] / 10e9 * 1e3
