"""Model zoo: the GNN stack over any registered architecture, full-graph and block forwards.

The layers and everything architecture-specific come from the config's :data:`MODELS` entry
(:mod:`gnnserve.models.arch`: GCN, GraphSAGE, GAT on PyG layers); this module branches on no
architecture. The same parameters serve both forward paths. ``forward(x, edge_index)`` is the
ordinary PyG full-graph forward (training reference); ``forward_blocks`` runs layer by layer over
the sampled blocks of a :class:`~gnnserve.types.SampledSubgraph` and, with every neighbour
sampled, gives the full-graph result on the seeds.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any

import torch
import torch.nn.functional as F

from gnnserve.errors import InvalidInputError
from gnnserve.models.arch import MODELS, Architecture
from gnnserve.models.arch.cgp import CGPLayer
from gnnserve.types import Block

__all__ = [
    "GNN",
    "MAX_DIM",
    "MAX_HEADS",
    "MAX_LAYERS",
    "MAX_PARAMETERS",
    "MODELS",
    "ModelConfig",
    "skeleton",
]


# Bounds of every ModelConfig field; checkpoints and `gnnserve train` flags beyond them are refused
# before anything is allocated (a config.json with hidden_dim 10^9 or num_layers 10^6 would
# otherwise allocate terabytes or build layers for hours).
MAX_DIM = 1 << 20  # in_dim, hidden_dim, out_dim
MAX_LAYERS = 16  # num_layers (= sampled hops; the fanouts product explodes long before)
MAX_HEADS = 64  # GAT heads
MAX_PARAMETERS = 1 << 31  # parameters of the whole model (8 GiB of float32)
_BOUNDS = {
    "in_dim": MAX_DIM,
    "hidden_dim": MAX_DIM,
    "out_dim": MAX_DIM,
    "num_layers": MAX_LAYERS,
    "heads": MAX_HEADS,
}


@dataclass(frozen=True)
class ModelConfig:
    """Architecture and sizes of a GNN; validated on construction (bounds: ``MAX_*`` above)."""

    arch: str  # a MODELS name (gnnserve.models.arch): "gcn" | "sage" | "gat" | registered ones
    in_dim: int  # input feature width F, 1..MAX_DIM
    hidden_dim: int  # width of every hidden representation (GAT: heads * per-head width)
    out_dim: int  # number of classes C (logit width), 1..MAX_DIM
    num_layers: int = 2  # message-passing layers = sampled hops, 1..MAX_LAYERS
    heads: int = 4  # GAT attention heads of the hidden layers (the last layer uses 1), 1..64
    dropout: float = 0.5  # feature dropout probability before every layer, training only, [0, 1)

    def __post_init__(self) -> None:
        if not isinstance(self.arch, str) or self.arch not in MODELS.names():
            raise InvalidInputError(
                f"unknown architecture {self.arch!r}; choose one of {MODELS.names()}", "arch"
            )
        for name, limit in _BOUNDS.items():
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= limit:
                raise InvalidInputError(
                    f"{name} must be an int in [1, {limit}], got {value!r}", name
                )
        dropout = self.dropout
        if isinstance(dropout, bool) or not isinstance(dropout, int | float):
            raise InvalidInputError(f"dropout must be a number, got {dropout!r}", "dropout")
        if not 0.0 <= float(dropout) < 1.0:
            raise InvalidInputError(f"dropout must be in [0, 1), got {dropout!r}", "dropout")
        MODELS.create(self.arch).check_config(self)
        if self.num_parameters() > MAX_PARAMETERS:
            raise InvalidInputError(
                f"this config has {self.num_parameters():,} parameters, more than the limit "
                f"{MAX_PARAMETERS:,} (in_dim {self.in_dim}, hidden_dim {self.hidden_dim}, "
                f"out_dim {self.out_dim}, num_layers {self.num_layers})",
                "hidden_dim",
            )

    def num_parameters(self) -> int:
        """Number of parameters (elements) of ``GNN(self)``, counted without allocating them."""
        return sum(p.numel() for p in skeleton(self).parameters())

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able dict."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelConfig:
        """Inverse of :meth:`to_dict`; unknown or missing keys raise InvalidInputError."""
        if not isinstance(data, dict):
            raise InvalidInputError("model config must be a JSON object", "model")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise InvalidInputError(f"unknown model config keys {unknown}", unknown[0])
        try:
            return cls(**data)
        except TypeError as exc:
            raise InvalidInputError(f"incomplete model config: {exc}", "model") from exc


class GNN(torch.nn.Module):
    """A stack of ``num_layers`` PyG convolutions with ReLU (and training-time dropout) between."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.architecture: Architecture = MODELS.create(config.arch)
        dims = [config.in_dim] + [config.hidden_dim] * (config.num_layers - 1) + [config.out_dim]
        last = config.num_layers - 1
        self.convs = torch.nn.ModuleList(
            self.architecture.make_layer(dims[i], dims[i + 1], i == last, config)
            for i in range(config.num_layers)
        )

    @property
    def needs_degree(self) -> bool:
        """Whether the block forwards read ``in_degree`` (else an empty tensor will do)."""
        return self.architecture.needs_degree

    def _drop(self, h: torch.Tensor) -> torch.Tensor:
        return F.dropout(h, p=self.config.dropout, training=self.training)

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        """Full-graph forward: logits float32 [N, out_dim] of every node of ``x`` [N, in_dim]."""
        arch = self.architecture
        edge_index, weight = arch.full_graph(x, edge_index)
        h = x
        for i, conv in enumerate(self.convs):
            h = arch.full_layer(conv, self._drop(h), edge_index, weight)
            if i < len(self.convs) - 1:
                h = F.relu(h)
        return h

    def layer_forward(
        self, index: int, h: torch.Tensor, block: Block, in_degree: torch.Tensor
    ) -> torch.Tensor:
        """Layer ``index`` (0-based) over one block, ReLU after every layer but the last.

        ``h``: float32 [block.n_src, width] inputs in local order (destinations first);
        ``in_degree``: float32 [block.n_src] in-degrees of the same nodes, self loops not counted
        (read only when :attr:`needs_degree`). Returns [block.n_dst, out width]. The building
        block of layer-wise inference with precomputed embeddings (precompute, SRPE), where each
        layer's inputs are assembled from several sources.
        """
        h = self.architecture.block_layer(self.convs[index], self._drop(h), block, in_degree)
        return F.relu(h) if index < len(self.convs) - 1 else h

    def forward_blocks(
        self, x: torch.Tensor, blocks: Sequence[Block], in_degree: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer-wise forward over sampled blocks (input layer first).

        ``x``: float32 [blocks[0].n_src, in_dim] input features in local order; ``in_degree``:
        float32 [blocks[0].n_src] full-graph in-degrees of the same nodes, self loops not counted
        (read only when :attr:`needs_degree`; on a loop-free graph this is the store's
        in-degree).
        Returns (logits [n_seeds, out_dim], embedding [n_seeds, hidden_dim]) where n_seeds is the
        last block's ``n_dst`` and the embedding is the representation fed to the last layer.
        """
        self._check_blocks(x, blocks, in_degree)
        h = x
        embedding = x[: blocks[-1].n_dst]
        for i, (conv, block) in enumerate(zip(self.convs, blocks, strict=True)):
            if i == len(blocks) - 1:
                embedding = h[: block.n_dst]
            h = self.architecture.block_layer(conv, self._drop(h), block, in_degree)
            if i < len(blocks) - 1:
                h = F.relu(h)
        return h, embedding

    def cgp_layers(self) -> list[CGPLayer]:
        """Every layer's parameters as the plain-tensor layers a CGP worker runs (input layer
        first); InvalidInputError (field ``model``) where the architecture has no CGP form."""
        return [self.architecture.export(conv) for conv in self.convs]

    def _check_blocks(self, x: torch.Tensor, blocks: Sequence[Block], deg: torch.Tensor) -> None:
        if len(blocks) != len(self.convs):
            raise InvalidInputError(
                f"model has {len(self.convs)} layers but got {len(blocks)} blocks", "blocks"
            )
        if x.dim() != 2 or x.size(0) != blocks[0].n_src or x.size(1) != self.config.in_dim:
            raise InvalidInputError(
                f"x must be [{blocks[0].n_src}, {self.config.in_dim}], got {list(x.shape)}", "x"
            )
        if self.needs_degree and deg.numel() < blocks[0].n_src:
            raise InvalidInputError(
                f"in_degree has {deg.numel()} entries, need {blocks[0].n_src}", "in_degree"
            )
        for prev, nxt in zip(blocks[:-1], blocks[1:], strict=True):
            if prev.n_dst != nxt.n_src:
                raise InvalidInputError("block n_dst must equal the next block's n_src", "blocks")


@functools.lru_cache(maxsize=64)
def skeleton(config: ModelConfig) -> GNN:
    """``GNN(config)`` on the meta device: parameter shapes, no storage. Shared: do not modify."""
    with torch.device("meta"):
        return GNN(config)
