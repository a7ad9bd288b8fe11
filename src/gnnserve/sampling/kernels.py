"""numba kernels of k-hop uniform neighbour sampling without replacement.

The adjacency is read as (row_start, degree, indices): node v's in-neighbours are
``indices[row_start[v] : row_start[v] + degree[v]]``, which covers a static CSR and the dynamic
store's segments with slack alike.

Randomness is counter-based (splitmix64 of seed, hop and node id), so a sample depends only on
its seed and never on thread scheduling: the parallel and serial kernels give identical results.

The loops over a frontier prefetch (``gnnserve.prefetch``) the row metadata ``_META_AHEAD``
nodes ahead and the first neighbour line ``_ROW_AHEAD`` nodes ahead: the nodes are random, so
every row is a cache miss the hardware cannot predict (bench/sampling.py, the stage split).
"""

from __future__ import annotations

import numba
import numpy as np

from gnnserve.prefetch import prefetch

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)
_META_AHEAD = 16  # frontier nodes ahead whose row_start / degree entries are prefetched
_ROW_AHEAD = 8  # frontier nodes ahead whose first neighbour line is prefetched
_IDS_AHEAD = 16  # edges ahead whose id-map entry relabel prefetches


@numba.njit(inline="always")
def _mix(z: np.uint64) -> np.uint64:
    z = (z ^ (z >> np.uint64(30))) * _MIX1
    z = (z ^ (z >> np.uint64(27))) * _MIX2
    return z ^ (z >> np.uint64(31))


@numba.njit(inline="always")
def row_key(seed: np.uint64, hop: int, node: int) -> np.uint64:
    """The RNG state that drives the draws of ``node`` at ``hop``."""
    return _mix(seed ^ _mix(np.uint64(node) * _GOLDEN + np.uint64(hop + 1)))


@numba.njit(nogil=True, cache=True)
def hop_counts(degree: np.ndarray, frontier: np.ndarray, fanout: int) -> np.ndarray:
    """Number of neighbours each frontier node draws: min(degree, fanout), all when fanout < 0."""
    counts = np.empty(frontier.shape[0] + 1, dtype=np.int64)
    counts[0] = 0
    for i in range(frontier.shape[0]):
        v = frontier[i]
        deg = degree[v]
        counts[i + 1] = deg if fanout < 0 or deg <= fanout else fanout
    return np.cumsum(counts)


@numba.njit(inline="always")
def _prefetch_ahead(row_start, degree, indices, frontier, i):  # type: ignore[no-untyped-def]
    """Prefetch what the draws of frontier nodes i + _META_AHEAD and i + _ROW_AHEAD read."""
    n = frontier.shape[0]
    if i + _META_AHEAD < n:
        w = frontier[i + _META_AHEAD]
        prefetch(row_start, w)
        prefetch(degree, w)
    if i + _ROW_AHEAD < n:
        prefetch(indices, row_start[frontier[i + _ROW_AHEAD]])


@numba.njit(inline="always")
def _draw_row(row_start, degree, indices, v, k, key, edges, start, dst_local):  # type: ignore[no-untyped-def]
    """Write k distinct uniform neighbours of v into edges[:, start:start+k] (Floyd's algorithm).

    Floyd's test "is t taken" is a bit test for rows of at most 64 neighbours and a scan of the
    positions drawn so far for longer ones: the same draws either way."""
    lo = row_start[v]
    deg = degree[v]
    if k == deg:
        for j in range(k):
            edges[0, start + j] = indices[lo + j]
            edges[1, start + j] = dst_local
        return
    state = key
    if deg <= 64:
        taken = np.uint64(0)
        for filled, j in enumerate(range(deg - k, deg)):
            state += _GOLDEN
            t = np.int64(_mix(state) % np.uint64(j + 1))
            bit = np.uint64(1) << np.uint64(t)
            if taken & bit:
                t = np.int64(j)
                bit = np.uint64(1) << np.uint64(j)
            taken |= bit
            edges[0, start + filled] = indices[lo + t]
            edges[1, start + filled] = dst_local
        return
    for filled, j in enumerate(range(deg - k, deg)):
        state += _GOLDEN
        t = np.int64(_mix(state) % np.uint64(j + 1))
        for q in range(filled):  # t already chosen -> take j, which cannot be
            if edges[0, start + q] == t:
                t = np.int64(j)
                break
        edges[0, start + filled] = t
    for j in range(k):
        edges[0, start + j] = indices[lo + edges[0, start + j]]
        edges[1, start + j] = dst_local


@numba.njit(nogil=True, cache=True)
def draw_serial(row_start, degree, indices, frontier, offsets, seed, hop, edges):  # type: ignore[no-untyped-def]
    """Fill ``edges`` [2, offsets[-1]] with (global source, local destination) per frontier node."""
    for i in range(frontier.shape[0]):
        _prefetch_ahead(row_start, degree, indices, frontier, i)
        k = offsets[i + 1] - offsets[i]
        if k:
            key = row_key(seed, hop, frontier[i])
            _draw_row(row_start, degree, indices, frontier[i], k, key, edges, offsets[i], i)


@numba.njit(nogil=True, parallel=True, cache=True)
def draw_parallel(row_start, degree, indices, frontier, offsets, seed, hop, edges):  # type: ignore[no-untyped-def]
    """``draw_serial`` with frontier nodes spread over threads: identical output."""
    for i in numba.prange(frontier.shape[0]):
        _prefetch_ahead(row_start, degree, indices, frontier, i)
        k = offsets[i + 1] - offsets[i]
        if k:
            key = row_key(seed, hop, frontier[i])
            _draw_row(row_start, degree, indices, frontier[i], k, key, edges, offsets[i], i)


@numba.njit(nogil=True, cache=True)
def draw_fetched(row_start, degree, indices, frontier, offsets, seed, hop, edges):  # type: ignore[no-untyped-def]
    """``draw_serial`` over a fetched adjacency: frontier node i's neighbours are
    ``indices[row_start[i] : row_start[i] + degree[i]]`` (rows by position, not by node id) while
    the draws are keyed by its global id ``frontier[i]``: identical output to ``draw_serial`` on
    the whole graph (on-demand sampling of a remote store)."""
    for i in range(frontier.shape[0]):
        k = offsets[i + 1] - offsets[i]
        if k:
            key = row_key(seed, hop, frontier[i])
            _draw_row(row_start, degree, indices, i, k, key, edges, offsets[i], i)


@numba.njit(nogil=True, cache=True)
def relabel(edges: np.ndarray, nodes: np.ndarray, n_nodes: int, local_id: np.ndarray) -> int:
    """Replace global ids in ``edges[0]`` by local ids, appending unseen nodes to ``nodes``.

    ``local_id`` is a per-sampler scratch map (global id -> local id, -1 = unseen); returns the new
    node count.
    """
    sources = edges[0]
    for e in range(edges.shape[1]):
        if e + _IDS_AHEAD < edges.shape[1]:
            prefetch(local_id, sources[e + _IDS_AHEAD])
        u = edges[0, e]
        lid = local_id[u]
        if lid < 0:
            lid = n_nodes
            local_id[u] = lid
            nodes[n_nodes] = u
            n_nodes += 1
        edges[0, e] = lid
    return n_nodes


@numba.njit(nogil=True, cache=True)
def unique_seeds(seeds: np.ndarray, nodes: np.ndarray, local_id: np.ndarray) -> tuple:  # type: ignore[type-arg]
    """Dedupe seeds in first-seen order into ``nodes``; returns (count, row of each seed)."""
    rows = np.empty(seeds.shape[0], dtype=np.int64)
    n = 0
    for i in range(seeds.shape[0]):
        s = seeds[i]
        if local_id[s] < 0:
            local_id[s] = n
            nodes[n] = s
            n += 1
        rows[i] = local_id[s]
    return n, rows


@numba.njit(nogil=True, cache=True)
def reset_map(local_id: np.ndarray, nodes: np.ndarray, n_nodes: int) -> None:
    """Return the scratch map to all -1 by touching only the entries a sample used."""
    for i in range(n_nodes):
        local_id[nodes[i]] = -1


@numba.njit(inline="always")
def reserve(edges, nodes, start, n_nodes, extra):  # type: ignore[no-untyped-def]
    """Grow ``edges`` (kept: [:, :start]) and ``nodes`` (kept: [:n_nodes]) for ``extra`` more."""
    need = start + extra
    if need > edges.shape[1]:
        grown = np.empty((2, max(need, 2 * edges.shape[1])), dtype=np.int64)
        grown[:, :start] = edges[:, :start]
        edges = grown
    if n_nodes + extra > nodes.shape[0]:
        bigger = np.empty(n_nodes + extra + nodes.shape[0], dtype=np.int64)
        bigger[:n_nodes] = nodes[:n_nodes]
        nodes = bigger
    return edges, nodes


@numba.njit(nogil=True, cache=True)
def sample_inline(row_start, degree, indices, seeds, fanouts, seed, local_id):  # type: ignore[no-untyped-def]
    """Whole k-hop sample in one serial call: the low-latency path for small batches.

    Returns (nodes, seed_rows, num_seeds, edges [2, E_total] with local ids, hop_offsets
    [hops+1] into edges, layer_sizes [hops+1] node counts after each hop). ``local_id`` is left
    all -1 again.
    """
    nodes = np.empty(max(seeds.shape[0] * 4, 64), dtype=np.int64)
    n_nodes, seed_rows = unique_seeds(seeds, nodes, local_id)
    num_seeds = n_nodes
    hops = fanouts.shape[0]
    hop_offsets = np.zeros(hops + 1, dtype=np.int64)
    layer_sizes = np.empty(hops + 1, dtype=np.int64)
    layer_sizes[0] = n_nodes
    edges = np.empty((2, 256), dtype=np.int64)
    for hop in range(hops):
        frontier = nodes[:n_nodes].copy()
        offsets = hop_counts(degree, frontier, fanouts[hop])
        start = hop_offsets[hop]
        need = start + offsets[-1]
        edges, nodes = reserve(edges, nodes, start, n_nodes, offsets[-1])
        view = edges[:, start:need]
        draw_serial(row_start, degree, indices, frontier, offsets, seed, hop, view)
        n_nodes = relabel(view, nodes, n_nodes, local_id)
        hop_offsets[hop + 1] = need
        layer_sizes[hop + 1] = n_nodes
    reset_map(local_id, nodes, n_nodes)
    return nodes[:n_nodes].copy(), seed_rows, num_seeds, edges, hop_offsets, layer_sizes
