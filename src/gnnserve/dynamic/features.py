"""A mutable feature table: rows can be replaced and appended (node inserts).

Writers are serialised by the dynamic store and change only a copy no reader holds; see
``gnnserve.dynamic.leftright``.
"""

from __future__ import annotations

import copy

import numpy as np
import torch

from gnnserve.features.base import FeatureStore
from gnnserve.features.stores import gather_rows


class DynamicFeatures(FeatureStore):
    """float32 rows in a growable array (capacity doubles on append)."""

    def __init__(self, base: FeatureStore) -> None:
        n = base.num_nodes
        self._table = np.empty((max(n + n // 4, 16), base.dim), dtype=np.float32)
        chunk = 1 << 16
        for lo in range(0, n, chunk):
            ids = np.arange(lo, min(lo + chunk, n))
            self._table[lo : lo + ids.size] = base.get(ids).numpy()
        self._n = n

    def clone(self) -> DynamicFeatures:
        """An independent copy of the table."""
        twin = copy.copy(self)
        twin._table = self._table.copy()
        return twin

    @property
    def num_nodes(self) -> int:
        return self._n

    @property
    def dim(self) -> int:
        return int(self._table.shape[1])

    def _read(self, ids: np.ndarray) -> torch.Tensor:
        return gather_rows(self._table, ids)

    def upsert(self, node: int, values: list[float]) -> None:
        """Replace the features of an existing node."""
        self._table[node] = values

    def append(self, values: list[float]) -> int:
        """Add a row for a new node; returns its id."""
        if self._n == self._table.shape[0]:
            grown = np.empty((2 * self._n, self.dim), dtype=np.float32)
            grown[: self._n] = self._table[: self._n]
            self._table = grown
        self._table[self._n] = values
        self._n += 1
        return self._n - 1
