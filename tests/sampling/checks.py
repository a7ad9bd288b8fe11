"""Structural checks every sampler's output must pass (shared by the sampler test files)."""

from __future__ import annotations

import numpy as np

from gnnserve.graph.base import GraphStore
from gnnserve.types import SampledSubgraph


def edge_set(graph: GraphStore) -> set[tuple[int, int]]:
    """Every (source, destination) edge of ``graph``."""
    indptr, indices = graph.csr()
    dst = np.repeat(np.arange(graph.num_nodes), np.diff(indptr))
    return set(zip(np.asarray(indices).tolist(), dst.tolist(), strict=True))


def check_sample(
    sg: SampledSubgraph, seeds: np.ndarray, fanouts: list[int], edges: set, deg: np.ndarray
) -> None:
    """Edges exist, per-destination count = min(deg, f) (deg for -1), no duplicates, seeds map
    right, and each block's destinations are the next block's sources."""
    assert sg.num_seeds == len(np.unique(seeds))
    np.testing.assert_array_equal(sg.nodes[sg.seed_rows], seeds)
    assert len(sg.blocks) == len(fanouts)
    assert len(np.unique(sg.nodes)) == sg.nodes.size
    # blocks are input-first; their hops are nearest-first in `fanouts`
    for block, fanout in zip(reversed(sg.blocks), fanouts, strict=True):
        src, dst = block.edge_index.numpy()
        assert src.size == 0 or (src.max() < block.n_src and dst.max() < block.n_dst)
        pairs = zip(sg.nodes[src].tolist(), sg.nodes[dst].tolist(), strict=True)
        assert all(e in edges for e in pairs)
        counts = np.bincount(dst, minlength=block.n_dst)
        want = deg[sg.nodes[: block.n_dst]]
        if fanout > 0:
            want = np.minimum(want, fanout)
        np.testing.assert_array_equal(counts, want)
        keys = dst.astype(np.int64) * block.n_src + src
        assert len(np.unique(keys)) == keys.size, "a neighbour drawn twice for one destination"
    for outer, inner in zip(sg.blocks, sg.blocks[1:], strict=False):
        assert outer.n_dst == inner.n_src
