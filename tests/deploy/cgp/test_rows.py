"""Feature rows as they travel: dense or CSR, whichever is smaller, decoded exactly."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gnnserve.deploy.cgp.rows import encode_rows, encoded_nbytes, nonzeros

WIDTH = 300


def sparse_rows(rows: int, per_row: int, seed: int = 0) -> np.ndarray:
    """float32 [rows, WIDTH] with ``per_row`` non-zeros (one-hot-like when 1)."""
    rng = np.random.default_rng(seed)
    x = np.zeros((rows, WIDTH), np.float32)
    for i in range(rows):
        x[i, rng.choice(WIDTH, per_row, replace=False)] = rng.uniform(0.5, 2, per_row)
    return x


@pytest.mark.parametrize(
    ("x", "sparse"),
    [
        (sparse_rows(20, 1), True),
        (sparse_rows(20, 6), True),
        (np.random.default_rng(1).standard_normal((20, WIDTH)).astype(np.float32), False),
        (sparse_rows(5, WIDTH // 2), False),  # half full: dense is smaller
        (np.zeros((0, WIDTH), np.float32), False),
        (np.zeros((3, WIDTH), np.float32), True),
    ],
)
def test_encoding_roundtrip_and_size(x: np.ndarray, sparse: bool) -> None:
    enc = encode_rows(torch.from_numpy(x))
    assert (enc.dense is None) == sparse
    assert torch.equal(enc.decode(), torch.from_numpy(x))
    arrays = [enc.indptr, enc.columns, enc.values] + ([] if enc.dense is None else [enc.dense])
    assert enc.nbytes == sum(a.nbytes for a in arrays)  # what the Ray object carries
    dense = x.size * 4
    csr = (x.shape[0] + 1) * 8 + np.count_nonzero(x) * 8
    assert enc.nbytes == min(dense, csr)
    assert encoded_nbytes(nonzeros(x), WIDTH) == enc.nbytes


def test_one_hot_rows_shrink() -> None:
    """fb100-like rows (4,735 columns, 6 non-zeros): 18,940 bytes dense, 56 sparse."""
    x = np.zeros((10, 4735), np.float32)
    x[:, :6] = 1.0
    assert encode_rows(x).nbytes == 11 * 8 + 60 * 8
    assert encoded_nbytes(np.full(10, 6), 4735) == 11 * 8 + 60 * 8
