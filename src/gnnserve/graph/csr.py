"""CSR graph backends: fully in memory, or memory-mapped from the store files."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from gnnserve.data import integrity, layout
from gnnserve.graph.base import GRAPH_STORES, GraphStore


class _FileCSR(GraphStore):
    """CSR read from a store directory; ``mmap`` decides whether pages stay on disk.

    ``check_structure`` (default on) scans the arrays at open for the CSR invariants the numba
    kernels rely on (:func:`gnnserve.data.integrity.check_csr`), and the labels and split masks
    (:func:`gnnserve.data.integrity.check_labels_and_masks`); off trusts a verified store.
    """

    use_mmap = False

    def __init__(
        self, store_dir: str | Path, meta: layout.StoreMeta, check_structure: bool = True
    ) -> None:
        super().__init__(meta)
        integrity.check_meta(store_dir, meta)
        n, e = meta.num_nodes, meta.num_edges
        self._indptr = layout.open_array(store_dir, layout.INDPTR, "int64", (n + 1,), self.use_mmap)
        self._indices = layout.open_array(
            store_dir, layout.INDICES, meta.indices_dtype, (e,), self.use_mmap
        )
        if check_structure:
            integrity.check_csr(store_dir, self._indptr, self._indices, n)
            integrity.check_labels_and_masks(store_dir, meta)
        self._row_start = self._indptr[:-1]
        self._degree = np.diff(self._indptr)
        self._degree.setflags(write=False)

    def _adjacency(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return self._row_start, self._degree, self._indices

    def csr(self) -> tuple[np.ndarray, np.ndarray]:
        """The stored CSR arrays themselves (no copy)."""
        return self._indptr, self._indices


@GRAPH_STORES.register("memory")
class InMemoryCSR(_FileCSR):
    """The whole CSR loaded into RAM: the fastest backend when it fits."""

    use_mmap = False


@GRAPH_STORES.register("mmap")
class MmapCSR(_FileCSR):
    """The CSR memory-mapped read-only: pages load on first touch, RAM holds the hot part."""

    use_mmap = True
