"""The upload codec for continuous readings (issue 28 part 4). DAQ (:mod:`.codecs`) keeps an
offset and a scale per row, which at 8 bits costs a quarter of a 32-wide float32 row again, and
its widest rows are float32 or float64: on continuous float32 readings it saves little. Here
every column gets one linear range (offset = column min, span = max - min, over the blob's
rows), each row a width from :data:`WIDTHS` by its degree (fewer bits on high-degree vertices,
whose errors their aggregation averages out), and 4-bit codes are packed two to a byte; then
the same LZ4 + bit-shuffle framing (:mod:`.blobs`).

Blob format (version 1, little-endian): header ``<4sHHQQ3Q`` (magic ``b"GCQ1"``, version, 0,
N rows, F columns, row counts of the 16/8/4-bit groups), 5 sections: the widths ``uint8 [N]``
in row order (each group keeps ascending row order), the column ranges float32 ``[F, 2]``
(offset, span), codes uint16 ``[n16, F]``, uint8 ``[n8, F]``, uint8 ``[n4, ceil(F/2)]`` (column
``2c`` in the low nibble, ``2c+1`` in the high one); then the CRC-32 trailer.

A value decodes to ``offset + code * span / (2^q - 1)``: the error is at most half a step,
``span / (2 (2^q - 1))`` per column.
"""

from __future__ import annotations

import struct

import numpy as np

from gnnserve.errors import InvalidInputError
from gnnserve.features.blobs import (
    Layout,
    checked_features,
    corrupt,
    decode_section,
    read_blob,
    write_blob,
)
from gnnserve.features.quantize import degree_thresholds

MAGIC = b"GCQ1"
VERSION = 1
WIDTHS = (16, 8, 4)  # allowed bits per element, in the blob's group order
_HEADER = struct.Struct("<4sHHQQ3Q")


def check_column_bits(bits: np.ndarray, n: int) -> np.ndarray:
    """``bits`` as uint8 [n], each one of :data:`WIDTHS`; InvalidInputError naming the first
    bad entry otherwise."""
    b = np.asarray(bits)
    if b.ndim != 1 or b.shape[0] != n or (b.size and not np.issubdtype(b.dtype, np.integer)):
        raise InvalidInputError(
            f"bits must be 1-D integers, one per row ({n}), got {b.shape}", "bits"
        )
    bad = ~np.isin(b, WIDTHS)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise InvalidInputError(f"bits[{i}] = {b[i]} is not one of {WIDTHS}", "bits")
    return b.astype(np.uint8)


def column_bits(degrees: np.ndarray, widths: tuple[int, int, int, int]) -> np.ndarray:
    """Per-row widths, uint8 [N]: ``widths[i]`` for the rows whose degree falls in the i-th
    degree quartile (:func:`~.quantize.degree_thresholds`; low degrees first)."""
    if len(widths) != 4 or any(w not in WIDTHS for w in widths):
        raise InvalidInputError(f"widths must be 4 of {WIDTHS}, got {widths}", "widths")
    d = np.asarray(degrees, np.int64)
    quartile = np.searchsorted(np.asarray(degree_thresholds(d)), d, side="right")
    return np.asarray(widths, np.uint8)[quartile]


def _layout(n: int, f: int, counts: list[int]) -> Layout:
    n16, n8, n4 = counts
    return [("u1", (n,)), ("<f4", (f, 2)), ("<u2", (n16, f)), ("u1", (n8, f)),
            ("u1", (n4, (f + 1) // 2))]  # fmt: skip


def _ranges(x: np.ndarray) -> np.ndarray:
    """float32 [F, 2]: each column's (min, max - min); zeros for no rows."""
    if x.shape[0] == 0:
        return np.zeros((x.shape[1], 2), np.float32)
    low = x.min(axis=0).astype(np.float32)
    span = (x.max(axis=0).astype(np.float64) - low.astype(np.float64)).astype(np.float32)
    return np.stack([low, np.maximum(span, 0)], axis=1)


def _codes(x: np.ndarray, ranges: np.ndarray, q: int) -> np.ndarray:
    levels = (1 << q) - 1
    low, span = ranges[:, 0].astype(np.float64), ranges[:, 1].astype(np.float64)
    safe = np.where(span > 0, span, 1.0)
    codes = np.clip(np.rint((x - low) / safe * levels), 0, levels)
    return codes.astype(np.uint16 if q == 16 else np.uint8)


def _nibbles(codes: np.ndarray) -> np.ndarray:
    """uint8 [n, F] codes < 16 packed two to a byte: [n, ceil(F/2)]."""
    n, f = codes.shape
    padded = np.zeros((n, f + f % 2), np.uint8)
    padded[:, :f] = codes
    return padded[:, 0::2] | (padded[:, 1::2] << 4)


def _unnibble(packed: np.ndarray, f: int) -> np.ndarray:
    out = np.empty((packed.shape[0], packed.shape[1] * 2), np.uint8)
    out[:, 0::2], out[:, 1::2] = packed & 0x0F, packed >> 4
    return out[:, :f]


def _values(codes: np.ndarray, ranges: np.ndarray, q: int) -> np.ndarray:
    low, span = ranges[:, 0].astype(np.float64), ranges[:, 1].astype(np.float64)
    return (low + codes.astype(np.float64) * (span / ((1 << q) - 1))).astype(np.float32)


def pack_columns(features: np.ndarray, bits: np.ndarray, *, clevel: int = 5) -> bytes:
    """Quantize row ``v`` of ``features`` (float [N, F]) to ``bits[v]`` bits (16, 8 or 4) on
    the columns' ranges, then compress. Returns the blob (format: module docstring)."""
    x = checked_features(features).astype(np.float64)
    b = check_column_bits(bits, x.shape[0])
    ranges = _ranges(x)
    n, f = x.shape
    counts = [int(np.count_nonzero(b == q)) for q in WIDTHS]
    codes = [_codes(x[b == q], ranges, q) for q in WIDTHS]
    arrays = [b, ranges, codes[0], codes[1], _nibbles(codes[2])]
    header = _HEADER.pack(MAGIC, VERSION, 0, n, f, *counts)
    return write_blob(header, _layout(n, f, counts), arrays, clevel)


def _layout_of(fields: tuple) -> Layout:
    magic, version, _, n, f, *counts = fields
    if magic != MAGIC or version != VERSION:
        raise corrupt(f"not a version-{VERSION} column blob (magic {magic!r}, version {version})")
    if sum(counts) != n:
        raise corrupt(f"inconsistent header: N={n}, F={f}, group counts {counts}")
    return _layout(n, f, counts)


def unpack_columns(blob: bytes) -> np.ndarray:
    """Decode a :func:`pack_columns` blob: float32 ``[N, F]`` in the original row order.
    Raises :class:`~.blobs.CorruptBlobError` on a truncated, corrupted or foreign blob."""
    (_, _, _, n, f, *counts), sections = read_blob(blob, _HEADER, _layout_of)
    layout = _layout(n, f, counts)
    a = [decode_section(c, *spec) for c, spec in zip(sections, layout, strict=True)]
    bits, ranges = a[0], a[1]
    if [int(np.count_nonzero(bits == q)) for q in WIDTHS] != counts:
        raise corrupt("row widths disagree with the header's group counts")
    out = np.empty((n, f), np.float32)
    with np.errstate(over="ignore", invalid="ignore"):  # tampered ranges: refused below
        out[bits == 16] = _values(a[2], ranges, 16)
        out[bits == 8] = _values(a[3], ranges, 8)
        out[bits == 4] = _values(_unnibble(a[4], f), ranges, 4)
    if not np.isfinite(out).all():
        raise corrupt("decoded values are not finite")
    return out


def column_round_trip(features: np.ndarray, bits: np.ndarray) -> np.ndarray:
    """What the fog receives for ``features`` packed at ``bits``, without compressing:
    float32 [N, F] (the accuracy calibration's input)."""
    x = checked_features(features).astype(np.float64)
    b = check_column_bits(bits, x.shape[0])
    ranges = _ranges(x)
    out = np.empty(x.shape, np.float32)
    for q in WIDTHS:
        out[b == q] = _values(_codes(x[b == q], ranges, q), ranges, q)
    return out
