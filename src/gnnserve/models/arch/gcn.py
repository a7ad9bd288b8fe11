"""GCN (PyG ``GCNConv``): ``out_i = W sum_j h_j / sqrt((d_j + 1)(d_i + 1)) + h_i / (d_i + 1) + b``.

The layers are built with ``normalize=False``: every path supplies the symmetric normalisation
itself, with ``d`` the in-degree without self loops (one self loop per node added, as PyG's
``gcn_norm``). Full graph: ``gcn_norm``'s edge weights. Block: :func:`gcn_block_weights` (rescaled
for sampled neighbourhoods), aggregated by a sparse matmul before or after the bias-free linear
map, whichever is cheaper. CGP: partial sums of ``h_j / sqrt(d_j + 1)`` over the non-loop edges,
merged by a sum; the owner adds the self term (:class:`GCNParams`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from gnnserve.models.arch import merge
from gnnserve.models.arch.base import Architecture, register
from gnnserve.models.arch.cgp import CGPLayer, LayerInputs, narrow, plain
from gnnserve.models.arch.ops import aggregate_first, weighted_sum
from gnnserve.types import Block

if TYPE_CHECKING:
    from gnnserve.models.zoo import ModelConfig

__all__ = ["GCN", "GCNParams", "gcn_block_weights"]


def gcn_block_weights(block: Block, in_degree: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """GCN edges and weights of one block, self loops of the destinations included.

    Weight of ``j -> i``: ``(d_i / s_i) / sqrt((d_j + 1)(d_i + 1))`` with ``d`` the full-graph
    in-degree and ``s_i`` the number of sampled (non-loop) edges into ``i``; the self loop gets
    ``1 / (d_i + 1)``. With every neighbour sampled ``s_i = d_i`` and this is exactly PyG's
    ``gcn_norm`` when ``in_degree`` does not count self loops (gcn_norm keeps one loop per node);
    with sampling, ``d_i / s_i`` keeps the aggregate an unbiased estimate of the full one.
    """
    src, dst = block.edge_index[0], block.edge_index[1]
    keep = src != dst  # the self loop is added once below, as gcn_norm does
    src, dst = src[keep], dst[keep]
    deg = in_degree[: block.n_src].to(torch.float32)
    norm = (deg + 1.0).rsqrt()
    sampled = torch.bincount(dst, minlength=block.n_dst).to(torch.float32)
    scale = deg[: block.n_dst] / sampled.clamp(min=1.0)
    weight = norm[src] * norm[dst] * scale[dst]
    loops = torch.arange(block.n_dst, dtype=src.dtype, device=src.device)
    edge_index = torch.stack([torch.cat([src, loops]), torch.cat([dst, loops])])
    return edge_index, torch.cat([weight, norm[: block.n_dst].square()])


@dataclass(frozen=True)
class GCNParams(CGPLayer):
    """A GCNConv layer: ``out = W (A_hat h) + b``."""

    weight: torch.Tensor  # float32 [out, in]
    bias: torch.Tensor | None  # float32 [out]

    def run(self, inputs: LayerInputs) -> torch.Tensor:
        """Partial ``sum_j h_j / sqrt(d_j + 1)`` (self loops dropped), merged by the owner into
        ``W (norm_i * sum + norm_i^2 h_i) + b`` (the partials already projected when W
        narrows)."""
        block, rows = inputs.block, inputs.rows
        deg_src, deg_self = inputs.degree(block.sources), inputs.degree(inputs.dst_ids)
        keep = ~block.loop
        norm_src = (deg_src + 1.0).rsqrt()
        total, project = narrow(rows.aggregate(block, keep, norm_src[block.src[keep]]), self.weight)
        agg = merge.merge_sum(inputs.shuffle(merge.SumPartial(total)))
        norm = (deg_self + 1.0).rsqrt().unsqueeze(1)
        self_term = F.linear(inputs.h_self, self.weight) if project else inputs.h_self
        out = norm * agg + norm.square() * self_term
        out = out if project else F.linear(out, self.weight)
        return out + self.bias if self.bias is not None else out


@register
class GCN(Architecture):
    """Graph convolution (Kipf & Welling), symmetric normalisation with self loops."""

    name = "gcn"
    needs_degree = True

    def make_layer(
        self, in_dim: int, out_dim: int, is_last: bool, config: ModelConfig
    ) -> torch.nn.Module:
        """``GCNConv(in_dim, out_dim, normalize=False)``: the paths normalise themselves."""
        from torch_geometric.nn import GCNConv

        return GCNConv(in_dim, out_dim, normalize=False)

    def full_graph(
        self, x: torch.Tensor, edge_index: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """PyG's ``gcn_norm``: one self loop per node, symmetric weights."""
        from torch_geometric.nn.conv.gcn_conv import gcn_norm

        edge_index, weight = gcn_norm(edge_index, None, x.size(0), False, True, dtype=x.dtype)
        return edge_index, weight

    def block_layer(
        self, conv: torch.nn.Module, h: torch.Tensor, block: Block, in_degree: torch.Tensor
    ) -> torch.Tensor:
        """``A (h W) + b`` with :func:`gcn_block_weights`, aggregating first when cheaper (the
        aggregation and the bias-free linear map commute)."""
        size = (block.n_src, block.n_dst)
        edge_index, weight = gcn_block_weights(block, in_degree)
        layer: Any = conv
        if aggregate_first(edge_index.size(1), size, h.size(1), layer.out_channels):
            out = layer.lin(weighted_sum(edge_index, weight, h, size))
        else:
            out = weighted_sum(edge_index, weight, layer.lin(h), size)
        return out + layer.bias if layer.bias is not None else out

    def export(self, conv: torch.nn.Module) -> GCNParams:
        """``W`` and ``b`` of the layer."""
        layer: Any = conv
        return GCNParams(plain(layer.lin.weight), plain(layer.bias))
