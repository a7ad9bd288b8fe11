"""The per-stage split of gnnserve's sample + gather and the physical bound it is held against.

Stage split: the throughput path's kernels run one by one on a batch, each timed: ``prepare``
(dedupe the seeds, count each hop's draws), ``draw`` (the neighbour draws, serial or parallel as
served: ``PARALLEL_DRAW_EDGES``), ``relabel`` (global -> local ids) and ``gather`` (the input
features). The inline path fuses the first three in one call; the split says where its time goes.

Physical bound: what the same batch costs at the speed of memory. The draws are bounded by a
plain loop that reads one uniformly chosen neighbour per drawn edge (``plain_draws``: the same
frontiers and edge counts, no distinctness, no relabelling, no bookkeeping), the gather by the
bytes it moves over the bandwidth of a plain contiguous copy (``copy_gbps``). Both run with the
benchmark's thread count; both are optimistic (a gather of random rows cannot beat a sequential
copy), so gnnserve / bound >= 1 and smaller is closer to the limit.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numba
import numpy as np

from gnnserve.features.stores import gather_rows
from gnnserve.sampling import kernels
from gnnserve.sampling.sampler import PARALLEL_DRAW_EDGES

_LCG_MUL = np.uint64(6364136223846793005)
_LCG_ADD = np.uint64(1442695040888963407)


@numba.njit(parallel=True, nogil=True, cache=True)
def plain_draws(row_start, degree, indices, frontier, offsets, out):  # type: ignore[no-untyped-def]
    """out[offsets[i] + j] = a uniform neighbour of frontier[i], for j < offsets[i+1]-offsets[i]:
    one random read per edge (an LCG and a modulo pick it)."""
    for i in numba.prange(frontier.shape[0]):
        v = frontier[i]
        lo, deg = row_start[v], degree[v]
        h = np.uint64(v) * _LCG_MUL + _LCG_ADD
        for e in range(offsets[i], offsets[i + 1]):
            h = h * _LCG_MUL + _LCG_ADD
            out[e] = indices[lo + np.int64((h >> np.uint64(33)) % np.uint64(deg))]


@numba.njit(parallel=True, nogil=True, cache=True)
def _copy(src: np.ndarray, dst: np.ndarray) -> None:
    for i in numba.prange(src.shape[0]):
        dst[i] = src[i]


def copy_gbps(mib: int = 256, repeats: int = 5) -> float:
    """Bandwidth of a plain contiguous copy (GB/s of bytes copied), best of ``repeats``, with
    numba's current thread count."""
    src = np.ones(mib << 18, dtype=np.float32)  # mib MiB
    dst = np.empty_like(src)
    _copy(src, dst)
    best = np.inf
    for _ in range(repeats):
        start = time.perf_counter()
        _copy(src, dst)
        best = min(best, time.perf_counter() - start)
    return src.nbytes / best / 1e9


@dataclass
class StageTimes:
    """One batch on the throughput path's kernels, milliseconds, plus its sizes and bound."""

    prepare_ms: float
    draw_ms: float
    relabel_ms: float
    gather_ms: float
    plain_draw_ms: float  # the same draws as a plain loop (the bound of ``draw``)
    edges: int  # edges drawn, all hops
    nodes: int  # sampled nodes = feature rows gathered
    bytes: int  # feature bytes gathered


def _ms(start: float) -> float:
    return (time.perf_counter() - start) * 1e3


def stage_times(
    graph: object, table: np.ndarray, fanouts: list[int], seeds: np.ndarray, key: int = 1
) -> StageTimes:
    """Time each kernel of one batch (hop by hop, as the throughput path runs them, with draw
    key ``key``: the sample ``NeighborSampler.sample(seeds, rng_seed=key)`` draws)."""
    row_start, degree, indices = graph.adjacency()  # type: ignore[attr-defined]
    local_id = np.full(graph.num_nodes, -1, dtype=np.int32)  # type: ignore[attr-defined]
    nodes = np.empty(seeds.size, dtype=np.int64)
    t = {"prepare": 0.0, "draw": 0.0, "relabel": 0.0, "plain": 0.0}
    start = time.perf_counter()
    n_nodes, _ = kernels.unique_seeds(seeds, nodes, local_id)
    t["prepare"] += _ms(start)
    edges_total = 0
    for hop, fanout in enumerate(fanouts):
        frontier = nodes[:n_nodes]
        start = time.perf_counter()
        offsets = kernels.hop_counts(degree, frontier, fanout)
        total = int(offsets[-1])
        edges = np.empty((2, total), dtype=np.int64)
        if nodes.size < n_nodes + total:
            nodes = np.concatenate([nodes, np.empty(n_nodes + total - nodes.size, np.int64)])
        t["prepare"] += _ms(start)
        plain = np.empty(total, dtype=np.int64)
        start = time.perf_counter()
        plain_draws(row_start, degree, indices, frontier, offsets, plain)
        t["plain"] += _ms(start)
        draw = kernels.draw_parallel if total >= PARALLEL_DRAW_EDGES else kernels.draw_serial
        start = time.perf_counter()
        draw(row_start, degree, indices, frontier, offsets, np.uint64(key), hop, edges)
        t["draw"] += _ms(start)
        start = time.perf_counter()
        n_nodes = kernels.relabel(edges, nodes, n_nodes, local_id)
        t["relabel"] += _ms(start)
        edges_total += total
    sampled = nodes[:n_nodes]
    start = time.perf_counter()
    x = gather_rows(table, sampled)
    gather_ms = _ms(start)
    kernels.reset_map(local_id, nodes, n_nodes)
    return StageTimes(
        t["prepare"], t["draw"], t["relabel"], gather_ms, t["plain"],
        edges_total, n_nodes, int(x.numel() * x.element_size()),
    )  # fmt: skip


def split_and_bound(
    graph: object, table: np.ndarray, fanouts: list[int], batches: list[np.ndarray], gbps: float
) -> dict[str, float]:
    """Medians over ``batches`` (after one untimed) of every stage, the sizes, and the bound:
    plain draws + bytes / ``gbps``."""
    stage_times(graph, table, fanouts, batches[0])
    runs = [stage_times(graph, table, fanouts, b) for b in batches]
    out = {
        name: float(np.median([getattr(r, name) for r in runs]))
        for name in ("prepare_ms", "draw_ms", "relabel_ms", "gather_ms", "plain_draw_ms")
    }
    for name in ("edges", "nodes", "bytes"):
        out[name] = float(np.median([getattr(r, name) for r in runs]))
    out["plain_ns_per_edge"] = out["plain_draw_ms"] * 1e6 / max(out["edges"], 1.0)
    out["copy_gbps"] = gbps
    out["bound_ms"] = out["plain_draw_ms"] + out["bytes"] / (gbps * 1e9) * 1e3
    return out
