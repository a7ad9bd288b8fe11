"""GraphSAGE (PyG ``SAGEConv``, mean aggregation): ``out_i = W_l mean_j h_j + b_l + W_r h_i``.

Full graph: the PyG layer. Block: the mean as a sparse matmul, projected first when that is
cheaper. CGP: partial (sum, count) of the local messages, merged into the mean
(:class:`SAGEParams`); the sums are projected by ``W_l`` first when it narrows them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from gnnserve.errors import InvalidInputError
from gnnserve.models.arch import merge
from gnnserve.models.arch.base import Architecture, register
from gnnserve.models.arch.cgp import CGPLayer, LayerInputs, narrow, plain
from gnnserve.models.arch.ops import aggregate_first, weighted_sum
from gnnserve.types import Block

if TYPE_CHECKING:
    from gnnserve.models.zoo import ModelConfig

__all__ = ["SAGE", "SAGEParams"]


@dataclass(frozen=True)
class SAGEParams(CGPLayer):
    """A SAGEConv(aggr="mean") layer: ``out = W_l mean_j h_j + b_l + W_r h_i``."""

    weight_l: torch.Tensor  # float32 [out, in]
    bias_l: torch.Tensor | None  # float32 [out]
    weight_r: torch.Tensor  # float32 [out, in]

    def run(self, inputs: LayerInputs) -> torch.Tensor:
        """Partial (sum, count), merged into ``W_l mean + b_l + W_r h_i`` (the sums already
        projected by ``W_l`` when it narrows)."""
        block = inputs.block
        total, project = narrow(inputs.rows.aggregate(block), self.weight_l)
        count = torch.bincount(block.dst, minlength=block.n_dst).to(total.dtype)
        mean = merge.merge_mean(inputs.shuffle(merge.MeanPartial(total, count)))
        out = mean if project else F.linear(mean, self.weight_l)
        if self.bias_l is not None:
            out = out + self.bias_l
        return out + F.linear(inputs.h_self, self.weight_r)


def _plain_mean(conv: Any) -> bool:
    """Whether ``conv`` is ``W_l mean_j h_j + b_l + W_r h_i`` (no projection, normalisation)."""
    from torch_geometric.nn.aggr import MeanAggregation

    return (
        isinstance(conv.aggr_module, MeanAggregation)
        and not conv.project
        and not conv.normalize
        and conv.root_weight
    )


@register
class SAGE(Architecture):
    """GraphSAGE with mean aggregation and a root weight."""

    name = "sage"

    def make_layer(
        self, in_dim: int, out_dim: int, is_last: bool, config: ModelConfig
    ) -> torch.nn.Module:
        """``SAGEConv(in_dim, out_dim, aggr="mean")``."""
        from torch_geometric.nn import SAGEConv

        return SAGEConv(in_dim, out_dim, aggr="mean")

    def block_layer(
        self, conv: torch.nn.Module, h: torch.Tensor, block: Block, in_degree: torch.Tensor
    ) -> torch.Tensor:
        """``W_l mean_j h_j + b_l + W_r h_i`` over a block, the mean as a sparse matmul
        (projected first when that is cheaper; the bias is added after the mean)."""
        if not _plain_mean(conv):
            return super().block_layer(conv, h, block, in_degree)
        layer: Any = conv
        size = (block.n_src, block.n_dst)
        edge_index = block.edge_index
        count = torch.bincount(edge_index[1], minlength=block.n_dst).clamp(min=1)
        weight = 1.0 / count[edge_index[1]].to(h.dtype)
        lin_l = layer.lin_l
        if aggregate_first(edge_index.size(1), size, h.size(1), layer.out_channels):
            out = lin_l(weighted_sum(edge_index, weight, h, size))
        else:
            out = weighted_sum(edge_index, weight, F.linear(h, lin_l.weight), size)
            out = out + lin_l.bias if lin_l.bias is not None else out
        return out + layer.lin_r(h[: block.n_dst])

    def export(self, conv: torch.nn.Module) -> SAGEParams:
        """``W_l``, ``b_l``, ``W_r``; refuses projection, normalisation, other aggregations."""
        if not _plain_mean(conv):
            message = "CGP supports SAGE layers with mean aggregation and root weight only"
            raise InvalidInputError(message, "model")
        layer: Any = conv
        lin_l, lin_r = layer.lin_l, layer.lin_r
        return SAGEParams(plain(lin_l.weight), plain(lin_l.bias), plain(lin_r.weight))
