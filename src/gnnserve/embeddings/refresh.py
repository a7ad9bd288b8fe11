"""Incremental PE refresh (issue 29, part 2, the computation): after a committed batch,
recompute only the affected rows of each layer (:mod:`.affected`), layer by layer, with the same
one-hop blocks and ``layer_forward`` as the full precompute (:mod:`.precompute`), so the result
equals a full precompute on the new graph.

Layer ``l``'s rows ``A_l`` are computed from layer ``l - 1`` of the new graph (its rows in
``A_{l-1}`` refreshed just before, the others unchanged by construction), in chunks of at most
``chunk_edges`` in-edges. The layers are updated in place; arrays grow for added nodes.
Publishing the refreshed version atomically to readers is the caller's (the refresher's).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from gnnserve.embeddings.precompute import chunk_bounds, layer_dims
from gnnserve.features.base import FeatureStore
from gnnserve.graph.base import GraphStore
from gnnserve.models.zoo import GNN
from gnnserve.sampling import kernels
from gnnserve.types import Block


def rows_block(
    row_start: np.ndarray, degree: np.ndarray, indices: np.ndarray, dsts: np.ndarray
) -> tuple[Block, np.ndarray]:
    """The one-hop block of destinations ``dsts`` (distinct ids) with all their in-neighbours
    (adjacency as ``GraphStore.adjacency()`` gives it): ``(block, src_ids)``, the destinations
    first in ``dsts`` order, then the other sources in first-seen order; edges destination by
    destination, each in its adjacency order (the order a full precompute aggregates in).
    Linear in the rows' in-edges (one pass, a scratch map of the graph's size)."""
    dsts = np.asarray(dsts, np.int64)
    starts, counts = np.asarray(row_start[dsts], np.int64), np.asarray(degree[dsts], np.int64)
    offsets = np.repeat(starts - np.cumsum(counts) + counts, counts)
    src = np.asarray(indices[np.arange(counts.sum()) + offsets], np.int64)
    edges = np.stack([src, np.repeat(np.arange(dsts.size, dtype=np.int64), counts)])
    # the sampler's first-seen relabelling over a scratch map: destinations first, then sources
    local = np.full(max(int(row_start.shape[0]), int(dsts.max(initial=-1)) + 1), -1, np.int64)
    nodes = np.empty(dsts.size + src.size, np.int64)
    n, _ = kernels.unique_seeds(dsts, nodes, local)
    n = kernels.relabel(edges, nodes, n, local)
    kernels.reset_map(local, nodes, n)
    src_ids = nodes[:n].copy()
    edge_index = torch.from_numpy(edges)
    return Block(edge_index, int(src_ids.size), int(dsts.size)), src_ids


def _chunks(degree: np.ndarray, rows: np.ndarray, chunk_edges: int) -> list[np.ndarray]:
    """``rows`` cut as :func:`chunk_bounds` cuts a graph: consecutive pieces of at most
    ``chunk_edges`` in-edges (and rows), at least one row each."""
    row_edges = np.zeros(rows.size + 1, np.int64)
    np.cumsum(degree[rows], out=row_edges[1:])
    bounds = chunk_bounds(row_edges, chunk_edges)
    return [rows[lo:hi] for lo, hi in zip(bounds[:-1], bounds[1:], strict=True)]


Rows = tuple[np.ndarray, np.ndarray]  # (int64 sorted ids, float32 [len, dim] values)
ReadLayer = Callable[[int, np.ndarray], np.ndarray]  # (layer index 0..k-1, ids) -> old rows


@dataclass
class Piece:
    """One chunk of a layer's rows with what its computation reads from the graph: the block
    of their in-edges, the source ids, the sources' GCN degrees and (layer 1) features."""

    rows: np.ndarray  # int64 destination ids
    block: Block
    src_ids: np.ndarray  # int64, destinations first
    degree: torch.Tensor  # float32 [n_src] (zeros when the model reads none)
    features: torch.Tensor | None  # [n_src, F] for layer 1, else None


RefreshPlan = list[tuple[np.ndarray, list[Piece]]]  # per layer: (rows, pieces)


def plan_refresh(
    model: GNN,
    graph: GraphStore,
    features: FeatureStore,
    affected: list[np.ndarray],
    chunk_edges: int = 2_000_000,
) -> RefreshPlan:
    """Everything a refresh of the rows ``affected[l]`` reads from ``graph``/``features``, so
    that a reader pinning a version needs the pin for this part only (:func:`run_refresh`
    computes from the plan)."""
    adjacency = graph.adjacency()  # no CSR copy: a refresh costs its rows, not the graph
    plan: RefreshPlan = []
    for index in range(len(layer_dims(model))):
        rows = np.asarray(affected[index], np.int64)
        pieces = []
        for part in _chunks(adjacency[1], rows, chunk_edges) if rows.size else []:
            block, src_ids = rows_block(*adjacency, part)
            if model.needs_degree:
                degree = torch.from_numpy(np.asarray(graph.gcn_degree(src_ids)))
            else:  # the graph's degree array costs a pass over every edge the first time
                degree = torch.zeros(src_ids.size)
            h = features.get_valid(src_ids) if index == 0 else None
            pieces.append(Piece(part, block, src_ids, degree, h))
        plan.append((rows, pieces))
    return plan


@torch.inference_mode()
def run_refresh(model: GNN, plan: RefreshPlan, previous: ReadLayer) -> list[Rows]:
    """The new values of the planned rows, layer by layer. ``previous(l, ids)`` reads layer
    ``l``'s rows from before (only ids of nodes that existed then, and only rows outside the
    planned rows of layer ``l``)."""
    model.eval()
    out: list[Rows] = []
    for index, (dim, (rows, pieces)) in enumerate(zip(layer_dims(model), plan, strict=True)):
        values = np.empty((rows.size, dim), np.float32)
        done = 0
        for piece in pieces:
            if piece.features is not None:
                h = piece.features
            else:
                h = torch.from_numpy(_inputs(previous, index - 1, piece.src_ids, out[-1]))
            result = model.layer_forward(index, h, piece.block, piece.degree)
            values[done : done + piece.rows.size] = result.numpy()
            done += piece.rows.size
        out.append((rows, values))
    return out


def refresh_rows(
    model: GNN,
    graph: GraphStore,
    features: FeatureStore,
    previous: ReadLayer,
    affected: list[np.ndarray],
    chunk_edges: int = 2_000_000,
) -> list[Rows]:
    """The new values of the rows ``affected[l]`` of every layer on ``graph``/``features``
    (after the batches): :func:`plan_refresh`, then :func:`run_refresh`."""
    plan = plan_refresh(model, graph, features, affected, chunk_edges)
    return run_refresh(model, plan, previous)


def _inputs(previous: ReadLayer, index: int, ids: np.ndarray, fresh: Rows) -> np.ndarray:
    """Layer ``index``'s rows of ``ids``: refreshed ones from ``fresh``, the others from
    ``previous``."""
    rows, values = fresh
    pos = np.minimum(np.searchsorted(rows, ids), max(rows.size - 1, 0))
    new = (rows[pos] == ids) if rows.size else np.zeros(ids.size, bool)
    out = np.empty((ids.size, values.shape[1]), np.float32)
    out[new] = values[pos[new]]
    if (~new).any():
        out[~new] = previous(index, ids[~new])
    return out


def refresh_layers(
    model: GNN,
    graph: GraphStore,
    features: FeatureStore,
    layers: list[np.ndarray],
    affected: list[np.ndarray],
    chunk_edges: int = 2_000_000,
) -> list[np.ndarray]:
    """``layers`` (PEs before the batch, one [rows, d_l] array per layer) with the rows of
    ``affected[l]`` recomputed on ``graph``/``features`` (after the batch); arrays with fewer
    rows than the graph has nodes are grown first. Returns the (possibly new) arrays."""
    n = graph.num_nodes
    for index, (dim, old) in enumerate(zip(layer_dims(model), layers, strict=True)):
        if old.shape != (old.shape[0], dim) or old.shape[0] > n:
            raise ValueError(f"layer {index + 1} is {old.shape}, expected [<= {n}, {dim}]")
    fresh = refresh_rows(
        model, graph, features, lambda i, ids: layers[i][ids], affected, chunk_edges
    )
    out = []
    for old, (rows, values) in zip(layers, fresh, strict=True):
        layer = old
        if old.shape[0] < n:
            layer = np.zeros((n, old.shape[1]), np.float32)
            layer[: old.shape[0]] = old
        layer[rows] = values
        out.append(layer)
    return out
