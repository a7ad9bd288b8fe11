"""Computation graphs of new-node inference with precomputed embeddings (SRPE).

With queries Q (global ids N..N+m-1), recomputed nodes S and C = Q + S (Q in index order, then S
ascending), a k-layer SRPE computation has k blocks: layers 1..k-1 compute C from the G+
in-edges of C, layer k computes Q from the G+ in-edges of Q. Each block lists its destinations
first, then the other distinct in-neighbours in ascending id order. A source outside C reads its
features at layer 1 and its precomputed embedding of layer l-1 at layer l >= 2.
"""

from __future__ import annotations

from dataclasses import dataclass

import numba
import numpy as np
import torch

from gnnserve.models.zoo import GNN
from gnnserve.types import Block


@numba.njit(nogil=True, cache=True)
def _gather(row_start, degree, indices, dst):  # type: ignore[no-untyped-def]
    total = 0
    for i in range(dst.shape[0]):
        total += degree[dst[i]]
    src = np.empty(total, np.int64)
    dst_local = np.empty(total, np.int64)
    e = 0
    for i in range(dst.shape[0]):
        lo = row_start[dst[i]]
        for j in range(degree[dst[i]]):
            src[e] = indices[lo + j]
            dst_local[e] = i
            e += 1
    return src, dst_local


@numba.njit(nogil=True, cache=True)
def _relabel(dst_nodes, src, local_id):  # type: ignore[no-untyped-def]
    """(sources, local src ids): dst_nodes first, then the other sources ascending.
    ``local_id`` is an all -1 scratch map over global ids, left all -1 again."""
    n_dst = dst_nodes.shape[0]
    for i in range(n_dst):
        local_id[dst_nodes[i]] = i
    others = np.empty(src.shape[0], np.int64)
    n_other = 0
    for e in range(src.shape[0]):
        if local_id[src[e]] == -1:
            local_id[src[e]] = -2
            others[n_other] = src[e]
            n_other += 1
    others = np.sort(others[:n_other])
    for j in range(n_other):
        local_id[others[j]] = n_dst + j
    local = np.empty(src.shape[0], np.int64)
    for e in range(src.shape[0]):
        local[e] = local_id[src[e]]
    for i in range(n_dst):
        local_id[dst_nodes[i]] = -1
    for j in range(n_other):
        local_id[others[j]] = -1
    return np.concatenate((dst_nodes, others)), local


def gather_in_edges(
    row_start: np.ndarray, degree: np.ndarray, indices: np.ndarray, dst: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Every in-edge of ``dst`` in a (row_start, degree, indices) adjacency.

    Returns (src int64 global ids, dst_local int64 positions in ``dst``), grouped by destination.
    """
    return _gather(row_start, degree, indices, np.asarray(dst, dtype=np.int64))  # type: ignore[no-any-return]


def relabel_block(
    dst_nodes: np.ndarray,
    src: np.ndarray,
    dst_local: np.ndarray,
    local_id: np.ndarray | None = None,
) -> tuple[np.ndarray, Block]:
    """Local ids of one block: ``dst_nodes`` (distinct) first, then the other sources ascending.

    ``local_id``: an all -1 scratch map covering every id (left all -1), or None to allocate one.
    Returns (global ids of the block's sources, the Block).
    """
    dst_nodes = np.asarray(dst_nodes, dtype=np.int64)
    if local_id is None:
        top = max(int(dst_nodes.max(initial=-1)), int(src.max(initial=-1)))
        local_id = np.full(top + 1, -1, dtype=np.int64)
    sources, local = _relabel(dst_nodes, src, local_id)
    edge_index = torch.from_numpy(np.stack([local, dst_local]))
    return sources, Block(edge_index, n_src=int(sources.size), n_dst=int(dst_nodes.size))


@dataclass(frozen=True)
class SrpePlan:
    """The blocks of one SRPE computation and where each block's input rows come from."""

    num_layers: int  # k
    num_nodes: int  # N: ids >= N are queries
    queries: np.ndarray  # int64 [m] global ids N..N+m-1
    recomputed: np.ndarray  # int64 [s] S ascending
    computed: np.ndarray  # int64 [m + s] C = Q then S
    c_block: Block | None  # layers 1..k-1 (None when k == 1)
    c_sources: np.ndarray  # int64 global ids of c_block's sources ([0] when k == 1)
    q_block: Block  # layer k
    q_sources: np.ndarray  # int64 global ids of q_block's sources
    q_prev_rows: np.ndarray  # int64 [n_src(q_block)]: row of the layer k-1 output, -1 = a PE

    def block(self, layer: int) -> Block:
        """Block of ``layer`` (0-based)."""
        if layer == self.num_layers - 1:
            return self.q_block
        assert self.c_block is not None
        return self.c_block

    def sources(self, layer: int) -> np.ndarray:
        """Global ids of the sources of ``layer`` (0-based)."""
        return self.q_sources if layer == self.num_layers - 1 else self.c_sources

    def pe_ids(self, layer: int) -> np.ndarray:
        """Existing ids whose PE of layer ``layer`` (1-based, < k) the block of ``layer`` + 1
        reads: every source of that block that is not computed."""
        if layer == self.num_layers - 1:
            return self.q_sources[self.q_prev_rows < 0]
        return self.c_sources[self.computed.size :]

    def sees_request_edges(self, ids: np.ndarray) -> np.ndarray:
        """bool per id: True for queries and recomputed nodes, whose in-edges in G' include
        the request's (the others keep their stored in-edges)."""
        s = self.recomputed
        if s.size == 0:
            return ids >= self.num_nodes
        pos = np.minimum(np.searchsorted(s, ids), s.size - 1)
        return (s[pos] == ids) | (ids >= self.num_nodes)

    def edges_per_layer(self) -> list[int]:
        """Number of edges of each layer's block, layer 1 first."""
        return [int(self.block(i).edge_index.size(1)) for i in range(self.num_layers)]


def build_srpe_plan(
    row_start: np.ndarray,
    degree: np.ndarray,
    indices: np.ndarray,
    num_nodes: int,
    num_new: int,
    recomputed: np.ndarray,
    num_layers: int,
    local_id: np.ndarray | None = None,
) -> SrpePlan:
    """The SRPE blocks from an adjacency holding the G+ rows of Q and of ``recomputed``.

    ``local_id``: optional all -1 scratch map over N + m ids (the overlay's), left all -1.
    """
    queries = num_nodes + np.arange(num_new, dtype=np.int64)
    recomputed = np.asarray(recomputed, dtype=np.int64)
    computed = np.concatenate([queries, recomputed])
    if num_layers > 1:
        src, dst_local = gather_in_edges(row_start, degree, indices, computed)
        c_sources, c_block = relabel_block(computed, src, dst_local, local_id)
        into_q = dst_local < num_new  # Q comes first in C: its in-edges are a prefix
        q_src, q_dst = src[into_q], dst_local[into_q]
    else:
        c_sources, c_block = computed, None
        q_src, q_dst = gather_in_edges(row_start, degree, indices, queries)
    q_sources, q_block = relabel_block(queries, q_src, q_dst, local_id)
    q_prev_rows = np.full(q_sources.size, -1, dtype=np.int64)
    q_prev_rows[:num_new] = np.arange(num_new)
    if num_layers > 1 and recomputed.size:
        others = q_sources[num_new:]
        pos = np.minimum(np.searchsorted(recomputed, others), recomputed.size - 1)
        in_s = recomputed[pos] == others
        q_prev_rows[num_new:][in_s] = num_new + pos[in_s]
    return SrpePlan(
        num_layers=num_layers,
        num_nodes=num_nodes,
        queries=queries,
        recomputed=recomputed,
        computed=computed,
        c_block=c_block,
        c_sources=c_sources,
        q_block=q_block,
        q_sources=q_sources,
        q_prev_rows=q_prev_rows,
    )


def block_to(block: Block, device: torch.device) -> Block:
    """``block`` with its edges on ``device``."""
    if block.edge_index.device == device:
        return block
    return Block(block.edge_index.to(device), block.n_src, block.n_dst)


def srpe_forward(
    model: GNN,
    plan: SrpePlan,
    x: torch.Tensor,
    pes: dict[int, torch.Tensor],
    degrees: dict[str, torch.Tensor] | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Run ``plan``: (logits [m, C], layer-k inputs [m, H]) of the queries, on the CPU.

    ``x``: layer-1 inputs of ``plan.sources(0)``; ``pes[l]``: PEs of ``plan.pe_ids(l)``;
    ``degrees`` (GCN only): G' degrees of the C block (``"c"``) and Q block (``"q"``) sources.
    """
    k, m, device = plan.num_layers, plan.queries.size, x.device
    empty = torch.empty(0, device=device)
    h = prev = x
    embedding = h[:m]
    for i in range(k):
        last = i == k - 1
        if i > 0 and not last:
            h = torch.cat([prev, pes[i].to(device)])
        elif i > 0:
            # rows >= 0 index the layer k-1 output, -1 marks the next PE row, in order
            rows = plan.q_prev_rows
            pe_row = prev.size(0) + np.cumsum(rows < 0) - 1
            index = torch.from_numpy(np.where(rows >= 0, rows, pe_row)).to(device)
            h = torch.cat([prev, pes[i].to(device)]).index_select(0, index)
        if last:
            embedding = h[:m]
        deg = empty if degrees is None else degrees["q" if last else "c"]
        prev = model.layer_forward(i, h, block_to(plan.block(i), device), deg)
    return prev.cpu(), embedding.cpu()
