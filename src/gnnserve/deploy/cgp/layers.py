"""The layers of a CGP worker: model weights as plain tensors and one function per layer type.

Each function aggregates the messages of the worker's own sources into partials, hands them to
``shuffle`` (the all-to-all to the destinations' owners) and merges what it receives for the
destinations it owns (:mod:`gnnserve.deploy.cgp.merge`). GCN and SAGE aggregate source rows in
place (a sparse matmul per row table, no per-edge message tensor) and project the partial when
the layer narrows it, so the exchange carries ``min(in, out)`` columns.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from gnnserve.deploy.cgp import merge

__all__ = [
    "GATParams",
    "GCNParams",
    "LayerParams",
    "LocalBlock",
    "SAGEParams",
    "Shuffle",
    "SourceRows",
    "gat_layer",
    "gcn_layer",
    "narrow",
    "sage_layer",
]


@dataclass(frozen=True)
class GCNParams:
    """A GCNConv layer: ``out = W (A_hat h) + b``."""

    weight: torch.Tensor  # float32 [out, in]
    bias: torch.Tensor | None  # float32 [out]


@dataclass(frozen=True)
class SAGEParams:
    """A SAGEConv(aggr="mean") layer: ``out = W_l mean_j h_j + b_l + W_r h_i``."""

    weight_l: torch.Tensor  # float32 [out, in]
    bias_l: torch.Tensor | None  # float32 [out]
    weight_r: torch.Tensor  # float32 [out, in]


@dataclass(frozen=True)
class GATParams:
    """A GATConv layer (shared source/destination projection, self loops added)."""

    weight: torch.Tensor  # float32 [heads * width, in]
    att_src: torch.Tensor  # float32 [heads, width]
    att_dst: torch.Tensor  # float32 [heads, width]
    bias: torch.Tensor | None  # float32 [heads * width] (concat) or [width]
    concat: bool  # concatenate the heads (else average them)
    negative_slope: float  # LeakyReLU slope of the attention logits

    @property
    def heads(self) -> int:
        """Number of attention heads H."""
        return int(self.att_src.size(0))

    def project(self, h: torch.Tensor) -> torch.Tensor:
        """``W h`` split per head: [n, H, width]."""
        width = self.weight.size(0) // self.heads
        return F.linear(h, self.weight).view(h.size(0), self.heads, width)


LayerParams = GCNParams | SAGEParams | GATParams


@dataclass(frozen=True)
class LocalBlock:
    """One layer's edges whose source is owned here, into that layer's destinations."""

    sources: np.ndarray  # int64 [n_src] distinct global source ids
    src: torch.Tensor  # int64 [E] row of each edge's source in ``sources``
    dst: torch.Tensor  # int64 [E] position of each edge's destination in C
    loop: torch.Tensor  # bool [E] the edge is a self loop (source == destination)
    n_dst: int  # destinations of the layer: |C| (layers 1..k-1) or m (layer k)


Shuffle = Callable[[merge.Partial], list[merge.Partial]]


@dataclass(frozen=True)
class SourceRows:
    """Where the input rows of owned nodes live at one layer: two tables, and ``locate`` giving
    each id's table (True = ``first``) and row. Layer 1: stored features | query features;
    layers >= 2: rows computed here for C | PEs."""

    first: torch.Tensor  # float32 [t1, width]
    second: torch.Tensor  # float32 [t2, width]
    locate: Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]  # ids -> (in first, row)

    def get(self, ids: np.ndarray) -> torch.Tensor:
        """float32 [len(ids), width] rows of owned global ``ids`` (a copy)."""
        in_first, row = (torch.from_numpy(a) for a in self.locate(ids))
        out = torch.empty(ids.size, self.second.size(1))
        out[in_first] = self.first[row[in_first]]
        out[~in_first] = self.second[row[~in_first]]
        return out

    def aggregate(
        self,
        block: LocalBlock,
        keep: torch.Tensor | None = None,
        weight: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """[n_dst, width] sum over the block's edges (those of ``keep``) of ``weight[e]`` times
        the source row, read from the tables by sparse matmuls (no per-edge message tensor)."""
        in_first, row = (torch.from_numpy(a) for a in self.locate(block.sources))
        src, dst = (block.src, block.dst) if keep is None else (block.src[keep], block.dst[keep])
        first, rows = in_first[src], row[src]
        total = torch.zeros(block.n_dst, self.second.size(1))
        for table, pick in ((self.first, first), (self.second, ~first)):
            w = None if weight is None else weight[pick]
            total += merge.partial_sum_rows(table, rows[pick], dst[pick], block.n_dst, w).total
        return total


def narrow(total: torch.Tensor, weight: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """(``total`` projected by ``weight`` [out, in] when that narrows it, whether it was): the
    exchange then carries ``out`` columns (linear maps commute with the partial sums)."""
    project = weight.size(0) < weight.size(1)
    return (F.linear(total, weight) if project else total), project


def gcn_layer(
    params: GCNParams,
    rows: SourceRows,
    block: LocalBlock,
    h_self: torch.Tensor,
    deg_src: torch.Tensor,
    deg_self: torch.Tensor,
    shuffle: Shuffle,
) -> torch.Tensor:
    """GCN: partial ``sum_j h_j / sqrt(d_j + 1)`` (self loops dropped), merged by the owner into
    ``W (norm_i * sum + norm_i^2 h_i) + b`` (the partials already projected when W narrows)."""
    keep = ~block.loop
    norm_src = (deg_src + 1.0).rsqrt()
    total, project = narrow(rows.aggregate(block, keep, norm_src[block.src[keep]]), params.weight)
    agg = merge.merge_sum(shuffle(merge.SumPartial(total)))
    norm = (deg_self + 1.0).rsqrt().unsqueeze(1)
    self_term = F.linear(h_self, params.weight) if project else h_self
    out = norm * agg + norm.square() * self_term
    out = out if project else F.linear(out, params.weight)
    return out + params.bias if params.bias is not None else out


def sage_layer(
    params: SAGEParams,
    rows: SourceRows,
    block: LocalBlock,
    h_self: torch.Tensor,
    shuffle: Shuffle,
) -> torch.Tensor:
    """SAGE (mean): partial (sum, count), merged into ``W_l mean + b_l + W_r h_i`` (the sums
    already projected by ``W_l`` when it narrows)."""
    total, project = narrow(rows.aggregate(block), params.weight_l)
    count = torch.bincount(block.dst, minlength=block.n_dst).to(total.dtype)
    mean = merge.merge_mean(shuffle(merge.MeanPartial(total, count)))
    out = mean if project else F.linear(mean, params.weight_l)
    if params.bias_l is not None:
        out = out + params.bias_l
    return out + F.linear(h_self, params.weight_r)


def gat_layer(
    params: GATParams,
    h_src: torch.Tensor,
    block: LocalBlock,
    h_self: torch.Tensor,
    alpha_dst: torch.Tensor,
    shuffle: Shuffle,
) -> torch.Tensor:
    """GAT: softmax partials over the local non-loop edges with ``alpha_dst`` [n_dst, H] of
    every destination; the owner adds its self loop, merges, concats or averages the heads."""
    x = params.project(h_src)
    keep = ~block.loop
    src, dst = block.src[keep], block.dst[keep]
    a_src = (x * params.att_src).sum(-1)
    logits = F.leaky_relu(a_src[src] + alpha_dst[dst], params.negative_slope)
    local = merge.partial_softmax(logits, x[src], dst, block.n_dst)
    x_self = params.project(h_self)
    self_logit = (x_self * params.att_src).sum(-1) + (x_self * params.att_dst).sum(-1)
    rows = torch.arange(x_self.size(0))
    loop_logit = F.leaky_relu(self_logit, params.negative_slope)
    loop = merge.partial_softmax(loop_logit, x_self, rows, x_self.size(0))
    out = merge.merge_softmax([*shuffle(local), loop])
    out = out.flatten(1) if params.concat else out.mean(dim=1)
    return out + params.bias if params.bias is not None else out
