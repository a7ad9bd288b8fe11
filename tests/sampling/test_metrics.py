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
    else:
        indptr, indices = graph.csr()
        two_hop = np.array([deg[indices[indptr[v] : indptr[v + 1]]].sum() for v in range(50)])
        np.testing.assert_allclose(values[:50], 1 + deg[:50] + two_hop)


def test_psgs_matches_monte_carlo_tree_size(small_store: Path) -> None:
    """For two hops the expected tree size equals the mean over many independent samples."""
    graph = open_graph_store(small_store)
    fanouts = [4, 3]
    expected = psgs(graph, fanouts)
    indptr, indices = graph.csr()
    sampler = NeighborSampler(graph, [fanouts[0]])
    deg = graph.in_degree()
    for v in (0, 11, 123):
        sizes = []
        for r in range(400):
            sg = sampler.sample(np.array([v]), rng_seed=r)
            hop1 = sg.nodes[sg.blocks[0].edge_index[0].numpy()]
            sizes.append(1 + hop1.size + np.minimum(deg[hop1], fanouts[1]).sum())
        assert abs(np.mean(sizes) - expected[v]) < 4 * np.std(sizes) / np.sqrt(400) + 1e-9
