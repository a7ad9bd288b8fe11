"""Samples of a request's seed groups, answered by several serving workers, merged into one."""

from __future__ import annotations

from typing import Any

import numpy as np

from gnnserve.sampling import presample_kernels as pk
from gnnserve.sampling.sampler import to_subgraph
from gnnserve.types import SampledSubgraph

_IDENTITY = np.empty(0, dtype=np.int64)


def writable(assembled: tuple[Any, ...]) -> tuple[Any, ...]:
    """Ray hands large arrays over read-only (zero-copy from its object store); copy those,
    as torch tensors made from them must own writable memory."""
    return tuple(
        a.copy() if isinstance(a, np.ndarray) and not a.flags.writeable else a for a in assembled
    )


def merge_samples(
    seeds: np.ndarray, parts: list[SampledSubgraph], hop_query: np.ndarray, fans: np.ndarray
) -> SampledSubgraph:
    """The sample of ``seeds`` assembled from samples of disjoint groups of them.

    Each part's block h holds, per destination in order, its hop-h reservoir in slot order; the
    union of the parts holds every reservoir the whole request reads (L_h of a union is the
    union of the L_h), so assembling from them on compact ids reproduces the single-cache
    result (assembly depends only on first-appearance order, not on id values).
    """
    ids = np.unique(np.concatenate([p.nodes for p in parts]))
    cols = np.concatenate([[0], np.cumsum(fans)[:-1]]).astype(np.int64)
    table = np.full((ids.size, int(fans.sum())), -1, dtype=np.int64)
    counts = np.full((ids.size, fans.size), -1, dtype=np.int64)
    for part in parts:
        local = np.searchsorted(ids, part.nodes)
        for h, block in enumerate(reversed(part.blocks)):
            src, dst = block.edge_index.numpy()
            q = int(hop_query[h])
            per_dst = np.bincount(dst, minlength=block.n_dst)
            counts[local[: block.n_dst], q] = per_dst
            slot = np.arange(dst.size) - np.concatenate([[0], np.cumsum(per_dst)[:-1]])[dst]
            table[local[dst], cols[q] + slot] = local[src]
    local_id = np.full(ids.size, -1, dtype=np.int64)
    out = pk.assemble(
        table, counts, cols, hop_query, np.searchsorted(ids, seeds), local_id, _IDENTITY
    )
    if out[6] >= 0:
        raise RuntimeError(f"merged parts miss a reservoir of vertex {ids[out[6]]}")
    return to_subgraph((ids[out[0]], *out[1:]), hop_query.size)
