"""The continuous readings' codec: per-column ranges, 16/8/4-bit rows, CRC-checked blobs."""

from __future__ import annotations

import numpy as np
import pytest

from gnnserve.errors import InvalidInputError
from gnnserve.features.blobs import CorruptBlobError
from gnnserve.features.codecs import pack
from gnnserve.features.column_codec import (
    column_bits,
    column_round_trip,
    pack_columns,
    unpack_columns,
)
from gnnserve.features.quantize import degree_thresholds


def _gaussian(n: int = 3000, f: int = 33, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    scale = rng.uniform(0.1, 10.0, f)  # columns of very different ranges
    return (rng.standard_normal((n, f)) * scale + rng.normal(0, 5, f)).astype(np.float32)


def _plain_decode(x: np.ndarray, bits: np.ndarray) -> np.ndarray:
    """An independent reference: per-column min and span (stored as float32, as the format
    says), nearest code, back (float64)."""
    low = x.min(axis=0).astype(np.float64)
    span = (x.max(axis=0).astype(np.float64) - low).astype(np.float32).astype(np.float64)
    out = np.empty(x.shape)
    for i, q in enumerate(bits):
        step = span / (2.0 ** int(q) - 1)
        code = np.round((x[i] - low) / np.where(step > 0, step, 1))
        out[i] = low + code * step
    return out


@pytest.mark.parametrize("f", [1, 32, 33])  # an odd width exercises the nibble padding
def test_mixed_widths_decode_to_the_nearest_code_of_each_column(f: int) -> None:
    x = _gaussian(f=f)
    bits = np.random.default_rng(1).choice([16, 8, 4], x.shape[0]).astype(np.uint8)
    got = unpack_columns(pack_columns(x, bits))
    assert got.dtype == np.float32 and got.shape == x.shape
    want = _plain_decode(x, bits)
    span = x.max(axis=0).astype(np.float64) - x.min(axis=0)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * np.abs(x).max())
    for q in (16, 8, 4):  # within half a step of the reading
        rows = bits == q
        err = np.abs(got[rows] - x[rows]).max(axis=0)
        assert (err <= span / (2 * (2**q - 1)) + 1e-5 * np.abs(x).max()).all()
    np.testing.assert_array_equal(column_round_trip(x, bits), got)  # the calibration's view


def test_extreme_values_and_constant_columns_decode_exactly() -> None:
    x = np.array([[0.0, 7.5, -2.0], [1.0, 7.5, 3.0], [0.0, 7.5, 0.5]], np.float32)
    got = unpack_columns(pack_columns(x, np.array([4, 8, 16], np.uint8)))
    np.testing.assert_array_equal(got[:, :2], x[:, :2])  # two-valued and constant columns
    assert got[0, 2] == -2.0 and got[1, 2] == 3.0  # each column's min and max


def test_continuous_readings_shrink_at_least_four_times_at_8_bits() -> None:
    x = _gaussian(n=5000, f=32)
    raw = x.nbytes
    for q, at_least in ((16, 1.9), (8, 3.9), (4, 7.5)):
        blob = pack_columns(x, np.full(x.shape[0], q, np.uint8))
        assert raw / len(blob) >= at_least, (q, raw / len(blob))
    daq = pack(x, np.full(x.shape[0], 8, np.uint8))  # per-row offset and scale: more bytes
    assert len(pack_columns(x, np.full(x.shape[0], 8, np.uint8))) < len(daq)


def test_column_bits_follow_the_degree_quartiles() -> None:
    degrees = np.random.default_rng(2).integers(0, 50, 1000)
    bits = column_bits(degrees, (16, 8, 8, 4))
    d1, d2, d3 = degree_thresholds(degrees)
    want = np.where(degrees < d1, 16, np.where(degrees < d2, 8, np.where(degrees < d3, 8, 4)))
    np.testing.assert_array_equal(bits, want)
    with pytest.raises(InvalidInputError, match="widths"):
        column_bits(degrees, (32, 8, 8, 4))  # type: ignore[arg-type]


def test_bad_input_is_refused_with_the_field_named() -> None:
    x = _gaussian(n=10, f=4)
    with pytest.raises(InvalidInputError, match=r"bits\[3\] = 32"):
        pack_columns(x, np.array([8, 8, 8, 32, 8, 8, 8, 8, 8, 8]))
    with pytest.raises(InvalidInputError, match="one per row"):
        pack_columns(x, np.full(9, 8))
    x[2, 1] = np.nan
    with pytest.raises(InvalidInputError, match="NaN"):
        pack_columns(x, np.full(10, 8))


def test_corrupted_truncated_and_foreign_blobs_raise_the_typed_error() -> None:
    x = _gaussian(n=200, f=8)
    blob = pack_columns(x, np.full(200, 8, np.uint8))
    flipped = bytearray(blob)
    flipped[len(blob) // 2] ^= 0xFF
    for bad, reason in (
        (blob[:-5], "CRC|section|bytes"),
        (bytes(flipped), "CRC"),
        (pack(x, np.full(200, 8, np.uint8)), "not a version-1 column blob"),
        (b"", "shorter"),
    ):
        with pytest.raises(CorruptBlobError, match=reason):
            unpack_columns(bad)
