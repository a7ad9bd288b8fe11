"""EmbeddingStore ABC: every layer's precomputed embedding of every existing node.

Layer ``l`` (1..k) holds ``h^(l)``, the output of the model's ``l``-th layer (ReLU applied for
``l < k``; layer ``k`` is the logits) computed on the full graph. A store is tied to one model
(``model_version``) and one graph (``graph_version``): :meth:`EmbeddingStore.check` refuses a
mismatch instead of serving embeddings of another model or graph.
"""

from __future__ import annotations

import abc
from dataclasses import asdict, dataclass, field

import numpy as np
import torch

from gnnserve.data.validate import check_node_ids
from gnnserve.errors import InvalidInputError, StaleEmbeddingsError


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

    def layer(self, layer: int) -> np.ndarray:
        """The whole [N, dim] float array of ``layer`` (1..k); may be a read-only memmap."""
        if (
            isinstance(layer, bool)
            or not isinstance(layer, int)
            or not 1 <= layer <= self.num_layers
        ):
            raise InvalidInputError(
                f"layer must be in 1..{self.num_layers}, got {layer!r}", "layer"
            )
        return self._layer(layer)

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
