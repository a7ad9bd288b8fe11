"""FeatureStore ABC: node features by id, validated at the public boundary (PyG style)."""

from __future__ import annotations

import abc
from pathlib import Path

import numpy as np
import torch

from gnnserve.data import layout
from gnnserve.data.validate import check_node_ids
from gnnserve.registry import Registry
from gnnserve.urls import local_path


class FeatureStore(abc.ABC):
    """Node feature rows. ``get`` checks ids then calls ``_read``; caches wrap another store."""

    @property
    @abc.abstractmethod
    def num_nodes(self) -> int:
        """Number of rows N."""

    @property
    @abc.abstractmethod
    def dim(self) -> int:
        """Feature width F."""

    @abc.abstractmethod
    def _read(self, ids: np.ndarray) -> torch.Tensor:
        """float32 [len(ids), F] rows for valid, int64 ``ids``."""

    def get(self, ids: np.ndarray) -> torch.Tensor:
        """Feature rows of ``ids`` as a float32 tensor [len(ids), F]; InvalidInputError naming
        ``ids`` unless they are ids of this store."""
        return self._read(check_node_ids(ids, self.num_nodes, "ids"))

    def get_valid(self, ids: np.ndarray) -> torch.Tensor:
        """:meth:`get` for int64 ids already known valid (the nodes of a sampled computation
        graph, on the request path), without checking them again."""
        return self._read(ids)


FEATURE_STORES: Registry[FeatureStore] = Registry("feature_store")


def open_feature_store(
    store_dir: str | Path, backend: str = "memory", check_structure: bool = True
) -> FeatureStore:
    """Open the features of ``store_dir`` (a path or file URL) with the backend ``backend``.

    ``check_structure``: scan the table for NaN and inf first (see ``data.integrity``).
    """
    root = local_path(store_dir, "store")
    meta = layout.read_meta(root)
    from gnnserve.features import stores  # noqa: F401  (registers the backends)

    return FEATURE_STORES.create(backend, root, meta, check_structure=check_structure)
