"""numba-cuda kernels of one sampling hop on the GPU (Quiver §4.2): a handful of launches per
hop, whatever the frontier's size.

A hop is: ``scan_counts`` (the edges each frontier node draws, scanned in the same launch; one
more level of scan per 256x more nodes), ``draw`` (Floyd's selection, one thread per frontier
node, the same counter-based splitmix64 keys as :mod:`.kernels`, so the draws are bit-identical
to the CPU samplers), then the relabel that appends unseen sources in order of first
occurrence, as ``kernels.relabel`` does: ``mark_first`` (atomic min of each unseen node's first
edge), ``scan_first_flags`` (flags of first occurrences, scanned in the same launch), ``assign``
(new local ids; a flag is its rank's step) and ``to_local``. The host reads two scalars per hop
(edges drawn, nodes added) to size the next arrays. Every launch costs tens of microseconds of
host time whatever its work, so the flags and counts are never launched on their own.

Kernels are compiled lazily on first launch, so importing this module needs no GPU; numba's CUDA
simulator (``NUMBA_ENABLE_CUDASIM=1``) runs them on the CPU in tests.
"""

from __future__ import annotations

import numpy as np
from numba import config as numba_config
from numba import cuda

GOLDEN = np.uint64(0x9E3779B97F4A7C15)
MIX1 = np.uint64(0xBF58476D1CE4E5B9)
MIX2 = np.uint64(0x94D049BB133111EB)
# Threads per block of the scan (a power of two) and of the element-wise kernels; the simulator
# runs each thread as a Python thread, so tests there use small blocks (and more scan levels).
SIMULATED = bool(getattr(numba_config, "ENABLE_CUDASIM", 0))  # numba's CUDA simulator is on
SCAN_BLOCK = 16 if SIMULATED else 256
THREADS = 32 if SIMULATED else 256
UNSEEN_EDGE = np.iinfo(np.int64).max  # ``first`` entry of a node no edge of this hop reached


@cuda.jit(device=True)
def _mix(z):  # type: ignore[no-untyped-def]
    z = (z ^ (z >> np.uint64(30))) * MIX1
    z = (z ^ (z >> np.uint64(27))) * MIX2
    return z ^ (z >> np.uint64(31))


@cuda.jit(device=True)
def _row_key(seed, hop, node):  # type: ignore[no-untyped-def]
    return _mix(seed ^ _mix(np.uint64(node) * GOLDEN + np.uint64(hop + 1)))


@cuda.jit(device=True)
def _scan_tile(value, n, out, block_sums):  # type: ignore[no-untyped-def]
    """This thread's ``value`` into the inclusive scan of its SCAN_BLOCK-long chunk
    (Hillis-Steele in shared memory), written to ``out`` (``n`` entries); each chunk's total
    into ``block_sums``. Every thread of the block calls it."""
    tile = cuda.shared.array(SCAN_BLOCK, dtype=np.int64)
    t = cuda.threadIdx.x
    i = cuda.blockIdx.x * SCAN_BLOCK + t
    tile[t] = value
    cuda.syncthreads()
    step = 1
    while step < SCAN_BLOCK:
        add = tile[t - step] if t >= step else 0
        cuda.syncthreads()
        tile[t] += add
        cuda.syncthreads()
        step *= 2
    if i < n:
        out[i] = tile[t]
    if t == SCAN_BLOCK - 1:
        block_sums[cuda.blockIdx.x] = tile[t]


@cuda.jit
def scan_blocks(values, out, block_sums):  # type: ignore[no-untyped-def]
    """Inclusive scan of each SCAN_BLOCK-long chunk of ``values`` into ``out``; each chunk's
    total into ``block_sums``."""
    i = cuda.blockIdx.x * SCAN_BLOCK + cuda.threadIdx.x
    n = values.shape[0]
    _scan_tile(values[i] if i < n else 0, n, out, block_sums)


@cuda.jit
def scan_counts(degree, frontier, fanout, out, block_sums):  # type: ignore[no-untyped-def]
    """:func:`scan_blocks` of the edges each frontier node draws: min(degree, fanout), every
    one when fanout < 0."""
    i = cuda.blockIdx.x * SCAN_BLOCK + cuda.threadIdx.x
    n = frontier.shape[0]
    count = 0
    if i < n:
        deg = degree[frontier[i]]
        count = deg if fanout < 0 or deg <= fanout else fanout
    _scan_tile(count, n, out, block_sums)


@cuda.jit
def add_block_offsets(out, scanned_sums):  # type: ignore[no-untyped-def]
    """Add the inclusive scan of the previous chunks' totals to every chunk after the first."""
    i = cuda.grid(1)
    block = i // SCAN_BLOCK
    if i < out.shape[0] and block > 0:
        out[i] += scanned_sums[block - 1]


@cuda.jit
def draw(row_start, degree, indices, frontier, ends, seed, hop, edges):  # type: ignore[no-untyped-def]
    """edges[:, start:end] = (global source, local destination i) of frontier node i's draws,
    where ``ends`` is the inclusive scan of the counts: ``kernels._draw_row`` per thread."""
    i = cuda.grid(1)
    if i >= frontier.shape[0]:
        return
    end = ends[i]
    start = ends[i - 1] if i > 0 else 0
    k = end - start
    v = frontier[i]
    lo = row_start[v]
    deg = degree[v]
    for q in range(k):
        edges[1, start + q] = i
    if k == deg:
        for q in range(k):
            edges[0, start + q] = indices[lo + q]
        return
    state = _row_key(seed, hop, v)
    for filled in range(k):
        j = deg - k + filled
        state += GOLDEN
        t = np.int64(_mix(state) % np.uint64(j + 1))
        for q in range(filled):  # t taken already -> take j, which cannot be
            if edges[0, start + q] == t:
                t = j
                break
        edges[0, start + filled] = t
    for q in range(k):
        edges[0, start + q] = indices[lo + edges[0, start + q]]


@cuda.jit
def mark_first(sources, local_id, first):  # type: ignore[no-untyped-def]
    """first[u] = the lowest index e with sources[e] == u, for every u not numbered yet."""
    e = cuda.grid(1)
    if e < sources.shape[0]:
        u = sources[e]
        if local_id[u] < 0:
            cuda.atomic.min(first, u, np.int64(e))


@cuda.jit
def scan_first_flags(sources, local_id, first, out, block_sums):  # type: ignore[no-untyped-def]
    """:func:`scan_blocks` of the flags: 1 where edge e is the first occurrence of an
    unnumbered node, else 0."""
    e = cuda.blockIdx.x * SCAN_BLOCK + cuda.threadIdx.x
    n = sources.shape[0]
    flag = 0
    if e < n:
        u = sources[e]
        flag = 1 if local_id[u] < 0 and first[u] == e else 0
    _scan_tile(flag, n, out, block_sums)


@cuda.jit
def assign(sources, ranks, n_nodes, local_id, first, nodes):  # type: ignore[no-untyped-def]
    """Number each first occurrence ``n_nodes + rank`` (ranks: inclusive scan of the flags, so
    an edge's flag is its rank's step), append it to ``nodes``, and clear its ``first`` entry
    for the next hop."""
    e = cuda.grid(1)
    if e < sources.shape[0] and ranks[e] > (ranks[e - 1] if e > 0 else 0):
        u = sources[e]
        lid = n_nodes + ranks[e] - 1
        local_id[u] = lid
        nodes[lid] = u
        first[u] = UNSEEN_EDGE


@cuda.jit
def to_local(sources, local_id, out):  # type: ignore[no-untyped-def]
    """out[e] = local_id[sources[e]] (``out`` may be ``sources`` itself)."""
    e = cuda.grid(1)
    if e < sources.shape[0]:
        out[e] = local_id[sources[e]]


@cuda.jit
def forget(nodes, n_nodes, local_id):  # type: ignore[no-untyped-def]
    """local_id[nodes[:n_nodes]] = -1: the scratch map back to unseen, touching only those."""
    i = cuda.grid(1)
    if i < n_nodes:
        local_id[nodes[i]] = -1
