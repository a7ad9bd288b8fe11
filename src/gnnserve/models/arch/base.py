"""The architecture entry: everything every execution path needs about one model architecture.

An architecture is one module of :mod:`gnnserve.models.arch` holding one :class:`Architecture`
subclass, added to :data:`MODELS` with :func:`register`. :class:`~gnnserve.models.zoo.GNN` (the
full-graph forward, the block forward of serving and training, the layer-wise forward of
precompute and SRPE) and the CGP master and workers dispatch through it; nothing outside
``models/arch`` branches on the architecture.

Architecture modules import torch_geometric only inside the methods that build or run PyG layers:
CGP workers unpickle the :class:`~gnnserve.models.arch.cgp.CGPLayer` an entry exports, which
imports its module, and must stay free of torch_geometric (seconds of start-up per process).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, ClassVar, TypeVar

import torch

from gnnserve.errors import InvalidInputError
from gnnserve.registry import Registry
from gnnserve.types import Block

if TYPE_CHECKING:
    from gnnserve.models.arch.cgp import CGPLayer
    from gnnserve.models.zoo import ModelConfig

__all__ = ["MODELS", "Architecture", "register"]


class Architecture(ABC):
    """One :data:`MODELS` entry. Stateless: ``MODELS.create(name)`` gives a fresh instance.

    A subclass sets :attr:`name` and implements :meth:`make_layer`; the other methods have the
    defaults of a PyG layer that takes ``(x, edge_index)`` and a bipartite ``(x_src, x_dst)``
    pair. :meth:`export` refuses CGP unless the architecture implements it.
    """

    name: ClassVar[str]  # the MODELS name, also ModelConfig.arch
    # block_layer reads in_degree (full-graph in-degree, self loops not counted); callers of the
    # block and layer-wise forwards (serving, training, precompute, SRPE) may pass an empty
    # tensor otherwise
    needs_degree: ClassVar[bool] = False

    def check_config(self, config: ModelConfig) -> None:
        """Raise InvalidInputError for a config this architecture cannot build (default: none)."""
        return None

    @abstractmethod
    def make_layer(
        self, in_dim: int, out_dim: int, is_last: bool, config: ModelConfig
    ) -> torch.nn.Module:
        """One layer of the stack, ``in_dim -> out_dim`` wide; ``is_last``: the output layer
        (no ReLU after it)."""

    def full_graph(
        self, x: torch.Tensor, edge_index: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Preparation of the full-graph forward: ``(edge_index, edge_weight or None)`` every
        layer then gets, from the features ``x`` [N, F] and int64 ``edge_index`` [2, E]
        (default: the edges as they are, unweighted)."""
        return edge_index, None

    def full_layer(
        self,
        conv: torch.nn.Module,
        h: torch.Tensor,
        edge_index: torch.Tensor,
        edge_weight: torch.Tensor | None,
    ) -> torch.Tensor:
        """One layer of the full-graph forward: [N, out] from ``h`` [N, in] (default: the PyG
        layer's own forward, with the weights of :meth:`full_graph` when there are some)."""
        if edge_weight is None:
            return conv(h, edge_index)
        return conv(h, edge_index, edge_weight)

    def block_layer(
        self, conv: torch.nn.Module, h: torch.Tensor, block: Block, in_degree: torch.Tensor
    ) -> torch.Tensor:
        """One layer over a sampled block (the block, training and layer-wise forwards):
        [n_dst, out] from ``h`` [n_src, in] in local order, destinations first; ``in_degree``
        float32 [n_src] (only read when :attr:`needs_degree`). Default: the PyG layer on the
        bipartite pair ``(h, h[:n_dst])``."""
        size = (block.n_src, block.n_dst)
        return conv((h, h[: block.n_dst]), block.edge_index, size=size)

    def export(self, conv: torch.nn.Module) -> CGPLayer:
        """``conv``'s parameters as plain tensors, with the partial aggregation and merge a CGP
        worker runs (OMEGA §6); InvalidInputError (field ``model``) where CGP cannot run it."""
        raise InvalidInputError(f"CGP does not support the {self.name!r} architecture", "model")


MODELS: Registry[Architecture] = Registry("model")

A = TypeVar("A", bound=type[Architecture])


def register(cls: A) -> A:
    """Class decorator: add the architecture ``cls`` to :data:`MODELS` under ``cls.name``
    (``MODELS.unregister(cls.name)`` takes it out again)."""
    MODELS.register(cls.name)(cls)
    return cls
