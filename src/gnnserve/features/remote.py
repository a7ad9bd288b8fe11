"""RemoteFeatures: feature rows read by byte ranges from a published store (FaaS-GNN §4.2).

Row ``v`` of ``features.bin`` is the ``F * itemsize`` bytes at ``v * F * itemsize``. A read
fetches the rows of the distinct ids asked for, rows of consecutive ids merged into one range,
all ranges issued together. Per-call request and byte counts go to :attr:`last_fetch`'s caller
through :meth:`read_counted`; the blob store keeps the running totals.
"""

from __future__ import annotations

import numpy as np
import torch

from gnnserve.data import layout
from gnnserve.data.blobs import BlobStore, coalesce
from gnnserve.errors import StoreFormatError
from gnnserve.features.base import FeatureStore


class RemoteFeatures(FeatureStore):
    """The feature table of the published store behind ``blobs`` (its ``meta``), read on demand;
    ``gap``: merge row ranges at most this many bytes apart (0: adjacent rows only)."""

    def __init__(self, blobs: BlobStore, meta: layout.StoreMeta, gap: int = 0) -> None:
        self.blobs = blobs
        self.meta = meta
        self.gap = int(gap)
        self._dtype = np.dtype(meta.feature_dtype).newbyteorder("<")
        self._row_bytes = meta.feature_dim * self._dtype.itemsize
        size = blobs.size(layout.FEATURES)
        if size != meta.num_nodes * self._row_bytes:
            raise StoreFormatError(
                f"{blobs.url}/{layout.FEATURES}: {size} bytes, expected "
                f"{meta.num_nodes * self._row_bytes} for {meta.num_nodes} x {meta.feature_dim} "
                f"{meta.feature_dtype}",
                "remote",
            )

    @property
    def num_nodes(self) -> int:
        return self.meta.num_nodes

    @property
    def dim(self) -> int:
        return self.meta.feature_dim

    def _read(self, ids: np.ndarray) -> torch.Tensor:
        return self.read_counted(ids)[0]

    def read_counted(self, ids: np.ndarray) -> tuple[torch.Tensor, int, int]:
        """Rows of valid int64 ``ids`` (float32 [len(ids), F]) plus the range requests issued
        and the bytes read for them."""
        unique, inverse = np.unique(ids, return_inverse=True)
        if unique.size == 0:
            return torch.empty((0, self.dim), dtype=torch.float32), 0, 0
        lo, hi, _ = coalesce(unique * self._row_bytes, (unique + 1) * self._row_bytes, self.gap)
        parts = self.blobs.get_ranges(layout.FEATURES, lo, hi)
        buf = np.frombuffer(b"".join(parts), dtype=self._dtype)
        # row positions in buf: merged range starts (in rows) map to their offsets in buf
        range_rows = (hi - lo) // self._row_bytes
        buf_row = np.zeros(lo.size, dtype=np.int64)
        np.cumsum(range_rows[:-1], out=buf_row[1:])
        group = np.searchsorted(lo // self._row_bytes, unique, side="right") - 1
        at = buf_row[group] + unique - lo[group] // self._row_bytes
        table = buf.reshape(-1, self.dim)
        rows = table[at].astype(np.float32)[inverse.ravel()]
        return torch.from_numpy(np.ascontiguousarray(rows)), int(lo.size), int(buf.nbytes)
