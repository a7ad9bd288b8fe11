"""Feature backends over the store's raw feature file: in memory or memory-mapped."""

from __future__ import annotations

from pathlib import Path

import numba
import numpy as np
import torch

from gnnserve.data import integrity, layout
from gnnserve.features.base import FEATURE_STORES, FeatureStore
from gnnserve.prefetch import prefetch

# bytes gathered from which the rows are copied on every thread: below, waking the pool (~18 us
# with OMP_WAIT_POLICY=PASSIVE) costs more than it saves (equal at ~1,500 rows of 512 B, 2 cores)
_PARALLEL_BYTES = 1 << 20
_ROWS_AHEAD = 8  # rows ahead whose first cache line the gather prefetches (random rows)

# Explicit element loops: numba's slice assignment ``out[i, :] = table[r, :]`` was 6x slower
# (1.0 ms vs 0.17 ms for 3,000 rows of 128 floats); so was copying through flat views (1.5x).


@numba.njit(parallel=True, nogil=True, cache=True)
def _gather_parallel(table: np.ndarray, ids: np.ndarray, out: np.ndarray) -> None:
    width, n = table.shape[1], ids.shape[0]
    flat = table.reshape(-1)
    for i in numba.prange(n):
        if i + _ROWS_AHEAD < n:
            prefetch(flat, ids[i + _ROWS_AHEAD] * width)
        row = ids[i]
        for j in range(width):
            out[i, j] = table[row, j]


@numba.njit(nogil=True, cache=True)
def _gather_serial(table: np.ndarray, ids: np.ndarray, out: np.ndarray) -> None:
    width, n = table.shape[1], ids.shape[0]
    flat = table.reshape(-1)
    for i in range(n):
        if i + _ROWS_AHEAD < n:
            prefetch(flat, ids[i + _ROWS_AHEAD] * width)
        row = ids[i]
        for j in range(width):
            out[i, j] = table[row, j]


def parallel_gather_rows(width: int, itemsize: int = 4) -> int:
    """Rows of ``width`` values (``itemsize`` bytes each) from which a gather runs in parallel."""
    return -(-_PARALLEL_BYTES // max(width * itemsize, 1))


def gather_rows(table: np.ndarray, ids: np.ndarray) -> torch.Tensor:
    """Rows ``table[ids]`` as float32 torch tensor; numba kernel, parallel for large batches."""
    out = np.empty((ids.shape[0], table.shape[1]), dtype=np.float32)
    if table.dtype != np.float32:
        out[:] = table[ids]  # float16 storage: numpy fancy-index then widen
    elif out.nbytes >= _PARALLEL_BYTES:
        _gather_parallel(table, ids, out)
    else:
        _gather_serial(table, ids, out)
    return torch.from_numpy(out)


class _FileFeatures(FeatureStore):
    """Features from the store's ``features.bin``; ``use_mmap`` keeps them on disk.

    ``check_structure`` (default on) scans the table at open for NaN and inf
    (:func:`gnnserve.data.integrity.check_finite`); off trusts a verified store.
    """

    use_mmap = False

    def __init__(
        self, store_dir: str | Path, meta: layout.StoreMeta, check_structure: bool = True
    ) -> None:
        integrity.check_meta(store_dir, meta)
        shape = (meta.num_nodes, meta.feature_dim)
        table = layout.open_array(
            store_dir, layout.FEATURES, meta.feature_dtype, shape, self.use_mmap
        )
        if check_structure:
            integrity.check_finite(store_dir, table)
        self.table = table
        self._n, self._dim = shape

    @property
    def num_nodes(self) -> int:
        return self._n

    @property
    def dim(self) -> int:
        return self._dim

    def _read(self, ids: np.ndarray) -> torch.Tensor:
        return gather_rows(self.table, ids)


@FEATURE_STORES.register("memory")
class InMemoryFeatures(_FileFeatures):
    """The feature table loaded into RAM."""

    use_mmap = False


@FEATURE_STORES.register("mmap")
class MmapFeatures(_FileFeatures):
    """The feature table memory-mapped read-only from the store."""

    use_mmap = True
