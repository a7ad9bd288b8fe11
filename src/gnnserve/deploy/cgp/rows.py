"""Feature rows as they travel between processes: dense, or sparse when that is smaller.

One-hot or bag-of-words features (fb100: 4,735 columns, 6 non-zeros per row) are mostly zeros;
sent as dense float32 they cost ``4 * F`` bytes a row. :func:`encode_rows` sends a block of rows
as CSR (int64 row pointers, int32 column indices, float32 values) whenever that is smaller than
the dense block, and :func:`encoded_nbytes` gives the size of that encoding from the non-zero
counts alone (what the plain scheme would fetch, without building the payload).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

__all__ = ["EncodedRows", "encode_rows", "encoded_nbytes", "nonzeros"]

_PTR, _COL, _VAL = 8, 4, 4  # bytes per CSR row pointer, column index and value


def encoded_nbytes(nnz: np.ndarray, width: int) -> int:
    """Bytes :func:`encode_rows` sends for rows with ``nnz`` (int [r]) non-zeros of ``width``
    columns: the smaller of dense float32 and CSR."""
    rows = int(np.asarray(nnz).size)
    dense = rows * width * _VAL
    sparse = (rows + 1) * _PTR + int(np.sum(nnz, dtype=np.int64)) * (_COL + _VAL)
    return min(dense, sparse)


def nonzeros(x: np.ndarray) -> np.ndarray:
    """int64 [r] non-zero entries per row of ``x`` [r, F]."""
    return np.count_nonzero(x, axis=1).astype(np.int64)


@dataclass(frozen=True)
class EncodedRows:
    """float32 rows [r, width] as sent: ``dense`` [r, width], or CSR (``indptr`` int64 [r + 1],
    ``columns`` int32 [nnz], ``values`` float32 [nnz]) when ``dense`` is None."""

    num_rows: int
    width: int
    dense: np.ndarray | None
    indptr: np.ndarray
    columns: np.ndarray
    values: np.ndarray

    @property
    def nbytes(self) -> int:
        """Payload bytes: the arrays this object carries."""
        arrays = [self.indptr, self.columns, self.values]
        return sum(a.nbytes for a in arrays) + (0 if self.dense is None else self.dense.nbytes)

    def decode(self) -> torch.Tensor:
        """The float32 rows [r, width] (a new tensor)."""
        if self.dense is not None:
            return torch.from_numpy(np.array(self.dense, dtype=np.float32))
        out = np.zeros((self.num_rows, self.width), dtype=np.float32)
        row = np.repeat(np.arange(self.num_rows), np.diff(self.indptr))
        out[row, self.columns] = self.values
        return torch.from_numpy(out)


def encode_rows(x: np.ndarray | torch.Tensor) -> EncodedRows:
    """``x`` float32 [r, F] as dense or CSR rows, whichever is smaller (dense on a tie)."""
    rows = np.ascontiguousarray(x.numpy() if isinstance(x, torch.Tensor) else x, np.float32)
    r, width = rows.shape
    empty = np.empty(0, np.int64)
    if encoded_nbytes(nonzeros(rows), width) == r * width * _VAL:
        return EncodedRows(r, width, rows, empty, empty.astype(np.int32), empty.astype(np.float32))
    row, col = np.nonzero(rows)
    indptr = np.zeros(r + 1, dtype=np.int64)
    np.cumsum(np.bincount(row, minlength=r), out=indptr[1:])
    return EncodedRows(r, width, None, indptr, col.astype(np.int32), rows[row, col])
