"""GAT (PyG ``GATConv``): per head, a softmax over the in-edges (self loop added) of learned
attention logits weighting the projected sources; hidden layers concatenate ``heads`` heads, the
last layer has one.

Full graph and block: the PyG layer. CGP (OMEGA §6.2, softmax-based aggregation): the owners
all-gather each destination's attention term, every worker builds softmax partials (max logit,
exp-sum, weighted sum) of its local non-loop edges, and the owner merges them with its self loop
by a log-sum-exp rescale (:class:`GATParams`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from gnnserve.errors import InvalidInputError
from gnnserve.models.arch import merge
from gnnserve.models.arch.base import Architecture, register
from gnnserve.models.arch.cgp import CGPLayer, LayerInputs, plain

if TYPE_CHECKING:
    from gnnserve.models.zoo import ModelConfig

__all__ = ["GAT", "GATParams"]


@dataclass(frozen=True)
class GATParams(CGPLayer):
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

    def run(self, inputs: LayerInputs) -> torch.Tensor:
        """Softmax partials over the local non-loop edges with the destination attention terms
        [n_dst, H] every owner broadcasts; the owner adds its self loop, merges, concats or
        averages the heads."""
        block, h_self = inputs.block, inputs.h_self
        alpha_dst = inputs.gather((self.project(h_self) * self.att_dst).sum(-1), "attention")
        x = self.project(inputs.rows.get(block.sources))
        keep = ~block.loop
        src, dst = block.src[keep], block.dst[keep]
        a_src = (x * self.att_src).sum(-1)
        logits = F.leaky_relu(a_src[src] + alpha_dst[dst], self.negative_slope)
        local = merge.partial_softmax(logits, x[src], dst, block.n_dst)
        x_self = self.project(h_self)
        self_logit = (x_self * self.att_src).sum(-1) + (x_self * self.att_dst).sum(-1)
        rows = torch.arange(x_self.size(0))
        loop_logit = F.leaky_relu(self_logit, self.negative_slope)
        loop = merge.partial_softmax(loop_logit, x_self, rows, x_self.size(0))
        out = merge.merge_softmax([*inputs.shuffle(local), loop])
        out = out.flatten(1) if self.concat else out.mean(dim=1)
        return out + self.bias if self.bias is not None else out


@register
class GAT(Architecture):
    """Graph attention: ``config.heads`` concatenated heads per hidden layer, one in the last."""

    name = "gat"

    def check_config(self, config: ModelConfig) -> None:
        """The hidden width must split evenly over the heads."""
        if config.hidden_dim % config.heads:
            raise InvalidInputError(
                f"GAT hidden_dim {config.hidden_dim} must be a multiple of heads {config.heads}",
                "hidden_dim",
            )

    def make_layer(
        self, in_dim: int, out_dim: int, is_last: bool, config: ModelConfig
    ) -> torch.nn.Module:
        """``GATConv``: one head in the last layer, else ``heads`` heads of ``out_dim / heads``."""
        from torch_geometric.nn import GATConv

        if is_last:
            return GATConv(in_dim, out_dim, heads=1, concat=False)
        return GATConv(in_dim, out_dim // config.heads, heads=config.heads, concat=True)

    def export(self, conv: torch.nn.Module) -> GATParams:
        """Projection, attention vectors and bias; refuses residual or edge features."""
        layer: Any = conv
        if layer.lin is None or layer.res is not None or layer.edge_dim is not None:
            raise InvalidInputError("CGP supports GAT layers without residual or edges", "model")
        heads, width = layer.heads, layer.out_channels
        return GATParams(
            weight=plain(layer.lin.weight),
            att_src=plain(layer.att_src).reshape(heads, width),
            att_dst=plain(layer.att_dst).reshape(heads, width),
            bias=plain(layer.bias),
            concat=bool(layer.concat),
            negative_slope=float(layer.negative_slope),
        )
