"""EmbeddingStore ABC: every layer's precomputed embedding of every existing node.

Layer ``l`` (1..k) holds ``h^(l)``, the output of the model's ``l``-th layer (ReLU applied for
``l < k``; layer ``k`` is the logits) computed on the full graph. A store is tied to one model
(``model_version``) and one graph (``graph_version``): :meth:`EmbeddingStore.check` refuses a
mismatch instead of serving embeddings of another model or graph.
"""

from __future__ import annotations

import abc
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import torch

from gnnserve.data.validate import check_node_ids
from gnnserve.errors import InvalidInputError, StaleEmbeddingsError

if TYPE_CHECKING:  # CGP workers import this module: keep torch_geometric (models.zoo) out
    from gnnserve.features.base import FeatureStore
    from gnnserve.models.zoo import ModelConfig


@dataclass
class EmbeddingMeta:
    """What a set of PEs was computed from: model, graph and per-layer widths."""

    model_version: str  # checkpoint identity name@sha256[:12]
    graph_version: str  # GraphStore.version at computation time
    num_nodes: int  # N: rows per layer
    dims: list[int] = field(default_factory=list)  # width of layer 1..k (index 0 = layer 1)
    dtype: str = "float32"  # on-disk dtype

    def to_dict(self) -> dict[str, object]:
        """Plain JSON-able dict."""
        return asdict(self)


class EmbeddingStore(abc.ABC):
    """Read access to per-layer embeddings; subclasses implement ``_layer``."""

    def __init__(self, meta: EmbeddingMeta) -> None:
        self.meta = meta

    @property
    def num_layers(self) -> int:
        """k: the number of stored layers."""
        return len(self.meta.dims)

    @abc.abstractmethod
    def _layer(self, layer: int) -> np.ndarray:
        """The [N, dims[layer-1]] array of ``layer`` (1-based), no checks."""

    def check_layer(self, layer: object) -> int:
        """``layer`` when it is one of 1..k, else InvalidInputError naming ``layer``."""
        if (
            isinstance(layer, bool)
            or not isinstance(layer, int)
            or not 1 <= layer <= self.num_layers
        ):
            raise InvalidInputError(
                f"layer must be in 1..{self.num_layers}, got {layer!r}", "layer"
            )
        return layer

    def layer(self, layer: int) -> np.ndarray:
        """The whole [N, dim] float array of ``layer`` (1..k); may be a read-only memmap."""
        return self._layer(self.check_layer(layer))

    def get(self, layer: int, ids: np.ndarray) -> torch.Tensor:
        """float32 [len(ids), dim] rows of ``layer`` for existing node ``ids``."""
        ids = check_node_ids(ids, self.meta.num_nodes, "ids")
        rows = np.asarray(self.layer(layer)[ids], dtype=np.float32)
        return torch.from_numpy(rows)

    def check(self, model_version: str, graph_version: str) -> None:
        """Raise StaleEmbeddingsError unless these PEs belong to this model and graph version."""
        if self.meta.model_version != model_version:
            raise StaleEmbeddingsError(
                f"precomputed embeddings are for model {self.meta.model_version}, "
                f"the served model is {model_version}; run `gnnserve precompute` again",
                "model",
            )
        if self.meta.graph_version != graph_version:
            raise StaleEmbeddingsError(
                f"precomputed embeddings are for graph version {self.meta.graph_version}, "
                f"the store is at {graph_version}; run `gnnserve precompute` again",
                "graph_version",
            )


class ArrayEmbeddings(EmbeddingStore):
    """PEs held as in-memory arrays (tests, and the result of an in-process precompute)."""

    def __init__(self, meta: EmbeddingMeta, layers: list[np.ndarray]) -> None:
        super().__init__(meta)
        if len(layers) != len(meta.dims):
            raise InvalidInputError(f"{len(layers)} layers for {len(meta.dims)} dims", "layers")
        for i, (arr, dim) in enumerate(zip(layers, meta.dims, strict=True), start=1):
            if arr.shape != (meta.num_nodes, dim):
                raise InvalidInputError(
                    f"layer {i} has shape {arr.shape}, expected {(meta.num_nodes, dim)}", "layers"
                )
        self._layers = layers

    def _layer(self, layer: int) -> np.ndarray:
        return self._layers[layer - 1]


def check_serving_stores(
    config: ModelConfig, num_nodes: int, features: FeatureStore, embeddings: EmbeddingStore
) -> None:
    """InvalidInputError unless ``features`` and the PEs (layers 1..k-1) fit a graph of
    ``num_nodes`` nodes and a model of ``config``: what new-node inference reads."""
    n, k = num_nodes, config.num_layers
    if features.num_nodes != n or features.dim != config.in_dim:
        raise InvalidInputError(
            f"features are [{features.num_nodes}, {features.dim}], the graph has "
            f"{n} nodes and the model reads {config.in_dim} features",
            "features",
        )
    meta = embeddings.meta
    if meta.num_nodes != n:
        raise InvalidInputError(
            f"precomputed embeddings have {meta.num_nodes} rows, the graph has {n} nodes",
            "embeddings",
        )
    if embeddings.num_layers < k - 1:
        raise InvalidInputError(
            f"precomputed embeddings hold {embeddings.num_layers} layers, a {k}-layer "
            f"model needs {k - 1}",
            "embeddings",
        )
    for layer in range(1, k):
        if meta.dims[layer - 1] != config.hidden_dim:
            raise InvalidInputError(
                f"precomputed layer {layer} has width {meta.dims[layer - 1]}, the model's "
                f"hidden width is {config.hidden_dim}",
                "embeddings",
            )


def check_importance(importance: object, num_nodes: int) -> np.ndarray:
    """``importance`` as float64 [num_nodes], or InvalidInputError naming the shape."""
    out = np.asarray(importance, dtype=np.float64)
    if out.shape != (num_nodes,):
        raise InvalidInputError(
            f"importance must have shape [{num_nodes}], got {list(out.shape)}", "importance"
        )
    return out
