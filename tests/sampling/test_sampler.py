"""NeighborSampler: edges exist, no duplicates, fanout bounds, uniformity, reproducibility."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from gnnserve.data.writer import GraphData, write_store
from gnnserve.errors import InvalidInputError
from gnnserve.fanouts import MAX_FANOUT
from gnnserve.graph import open_graph_store
from gnnserve.sampling import NeighborSampler
from tests.sampling.checks import check_sample, edge_set


@pytest.mark.parametrize("backend", ["memory", "mmap"])
@pytest.mark.parametrize("fanouts", [[5, 3], [10], [-1, 4], [3, 3, 3]])
def test_blocks_hold_only_graph_edges_within_fanout(small_store: Path, backend, fanouts) -> None:
    graph = open_graph_store(small_store, backend)
    edges = edge_set(graph)
    deg = graph.in_degree()
    sampler = NeighborSampler(graph, fanouts, seed=1)
    seeds = np.random.default_rng(2).integers(0, graph.num_nodes, 64)
    sg = sampler.sample(seeds)
    check_sample(sg, seeds, fanouts, edges, deg)


def test_full_fanout_returns_whole_neighbourhood(small_store: Path) -> None:
    graph = open_graph_store(small_store)
    sg = NeighborSampler(graph, [-1]).sample(np.array([7]))
    src, _ = sg.blocks[0].edge_index.numpy()
    assert sorted(sg.nodes[src].tolist()) == sorted(graph.neighbors(7).tolist())


def test_neighbour_choice_is_uniform(tmp_path: Path) -> None:
    """Chi-square: each of a hub's 40 neighbours is drawn equally often at fanout 5."""
    hub, degree, fanout, runs = 0, 40, 5, 4000
    src = np.arange(1, degree + 1)
    ei = np.stack([src, np.full(degree, hub)])
    write_store(
        GraphData("star", degree + 1, ei, np.zeros((degree + 1, 1), np.float32)), tmp_path / "s"
    )
    sampler = NeighborSampler(open_graph_store(tmp_path / "s"), [fanout])
    counts = np.zeros(degree + 1, dtype=np.int64)
    for r in range(runs):
        sg = sampler.sample(np.array([hub]), rng_seed=r)
        counts[sg.nodes[sg.blocks[0].edge_index[0].numpy()]] += 1
    observed = counts[1:]
    assert observed.sum() == runs * fanout
    result = stats.chisquare(observed)  # expected: runs * fanout / degree each
    assert result.pvalue > 1e-3, (result, observed)


def test_reproducible_and_parallel_equals_serial(small_store: Path) -> None:
    graph = open_graph_store(small_store)
    seeds = np.random.default_rng(3).integers(0, graph.num_nodes, 300)
    serial = NeighborSampler(graph, [10, 5], parallel_threshold=10**12).sample(seeds, rng_seed=42)
    parallel = NeighborSampler(graph, [10, 5], parallel_threshold=0).sample(seeds, rng_seed=42)
    np.testing.assert_array_equal(serial.nodes, parallel.nodes)
    for a, b in zip(serial.blocks, parallel.blocks, strict=True):
        assert (a.edge_index == b.edge_index).all()
    other = NeighborSampler(graph, [10, 5]).sample(seeds, rng_seed=43)
    assert not np.array_equal(serial.nodes, other.nodes)


@pytest.mark.parametrize(
    ("seeds", "fanouts", "field"),
    [
        (np.array([-1]), [5], "seeds"),
        (np.array([10**6]), [5], "seeds"),
        (np.array([], dtype=np.int64), [5], "seeds"),
        (np.array([1.5]), [5], "seeds"),
        (np.array([1]), [0], "fanouts"),
        (np.array([1]), [], "fanouts"),
    ],
)
def test_bad_input_is_a_typed_error(small_store: Path, seeds, fanouts, field) -> None:
    graph = open_graph_store(small_store)
    with pytest.raises(InvalidInputError) as info:
        NeighborSampler(graph, fanouts).sample(seeds)
    assert info.value.field == field


def test_size_bound_does_not_wrap_around_for_large_fanouts(small_store: Path) -> None:
    """The sampler's per-seed size bound grows with the fanouts instead of overflowing int64."""
    s = NeighborSampler(open_graph_store(small_store), [MAX_FANOUT] * 4)
    assert s.expected_size(np.array([0])) >= float(MAX_FANOUT) ** 4
