"""A test-only architecture, GIN (Xu et al., PyG ``GINConv``), in one file: what adding an
architecture to gnnserve takes.

``out_i = MLP((1 + eps) h_i + sum_j h_j)`` with a learnable ``eps`` and a two-layer MLP. The full
graph and block forwards are the :class:`Architecture` defaults (the PyG layer); the CGP form is
a sum partial of the local source rows (self loops included, as PyG sums every edge), merged by
a sum, then the self term and the MLP on the owner. Not registered on import: the tests add it
with ``register(GIN)`` and take it out with ``MODELS.unregister(GIN.name)``. Like the built-in
modules it imports torch_geometric only in ``make_layer``: CGP workers unpickle
:class:`GINParams`, which imports this module.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from gnnserve.models.arch import merge
from gnnserve.models.arch.base import Architecture
from gnnserve.models.arch.cgp import CGPLayer, LayerInputs, plain

if TYPE_CHECKING:
    from gnnserve.models.zoo import ModelConfig

INITIAL_EPS = 0.25  # eps at initialisation (non-zero: the self term is not a plain sum term)


@dataclass(frozen=True)
class GINParams(CGPLayer):
    """A GINConv layer as plain tensors: ``eps`` and the MLP ``W2 relu(W1 x + b1) + b2``."""

    eps: torch.Tensor  # float32 [1]
    weight1: torch.Tensor  # float32 [out, in]
    bias1: torch.Tensor  # float32 [out]
    weight2: torch.Tensor  # float32 [out, out]
    bias2: torch.Tensor  # float32 [out]

    def run(self, inputs: LayerInputs) -> torch.Tensor:
        """Sum partials of the local source rows, merged by a sum; then the MLP of
        ``(1 + eps) h_i + sum`` on the owner."""
        total = inputs.rows.aggregate(inputs.block)
        agg = merge.merge_sum(inputs.shuffle(merge.SumPartial(total)))
        h = agg + (1 + self.eps) * inputs.h_self
        return F.linear(F.relu(F.linear(h, self.weight1, self.bias1)), self.weight2, self.bias2)


class GIN(Architecture):
    """Graph isomorphism network: sum aggregation, ``(1 + eps)`` self term, MLP update."""

    name = "gin"

    def make_layer(
        self, in_dim: int, out_dim: int, is_last: bool, config: ModelConfig
    ) -> torch.nn.Module:
        """``GINConv(Linear, ReLU, Linear)`` with a trainable ``eps``."""
        from torch_geometric.nn import GINConv

        mlp = torch.nn.Sequential(
            torch.nn.Linear(in_dim, out_dim), torch.nn.ReLU(), torch.nn.Linear(out_dim, out_dim)
        )
        return GINConv(mlp, eps=INITIAL_EPS, train_eps=True)

    def export(self, conv: torch.nn.Module) -> GINParams:
        """``eps`` and the two linear maps of the MLP."""
        layer: Any = conv
        first, second = layer.nn[0], layer.nn[2]
        return GINParams(
            plain(layer.eps),
            plain(first.weight),
            plain(first.bias),
            plain(second.weight),
            plain(second.bias),
        )
