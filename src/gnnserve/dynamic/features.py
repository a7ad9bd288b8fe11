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

    def append_rows(self, rows: np.ndarray) -> None:
        """Add rows (float32 [k, F]) for k new nodes, ids N .. N + k - 1."""
        k = rows.shape[0]
        if self._n + k > self._table.shape[0]:
            grown = np.empty((max(2 * self._n, self._n + k), self.dim), dtype=np.float32)
            grown[: self._n] = self._table[: self._n]
            self._table = grown
        self._table[self._n : self._n + k] = rows
        self._n += k

    def upsert_rows(self, nodes: np.ndarray, rows: np.ndarray) -> None:
        """Replace the rows of ``nodes`` (in order: a node given twice keeps its last row)."""
        last = nodes.size - 1 - np.unique(nodes[::-1], return_index=True)[1]
        self._table[nodes[last]] = rows[last]
