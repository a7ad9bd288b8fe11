"""The upload codec for continuous readings (issue 28 part 4). DAQ (:mod:`.codecs`) keeps an
offset and a scale per row, which at 8 bits costs a quarter of a 32-wide float32 row again, and
its widest rows are float32 or float64: on continuous float32 readings it saves little. Here
every column gets one linear range (offset = column min, span = max - min, over the blob's
rows) and each row a width of 2 to 16 bits by its degree quartile (:func:`column_bits`). The
codes are entropy coded where it pays: the top 8 bits of every code go to ZSTD as bytes (the
values of a bell-shaped column crowd the middle codes, so a byte of them costs about 7 bits),
the bits below (widths over 8) to LZ4 behind the bit shuffle, which stores each bit plane
together (those low bits are near uniform: nothing to entropy code). Framing: :mod:`.blobs`.

Blob format (version 1, little-endian): header ``<4sHHQQ15Q`` (magic ``b"GCQ1"``, version, 0,
N rows, F columns, row counts of the widths 2, 3, ..., 16), then sections: the widths
``uint8 [N]`` in row order (each group keeps ascending row order), the column ranges float32
``[F, 2]`` (offset, span), and per width q = 2..16 its top codes ``uint8 [n_q, F]`` (``code >>
(q - 8)`` for q > 8, the code itself otherwise) and, for q > 8, its low ``q - 8`` bits
``uint8 [n_q, F]`` (an empty group has no chunks); then the CRC-32 trailer.

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
from gnnserve.features.quantize import check_bits, degree_thresholds

MAGIC = b"GCQ1"
VERSION = 1
WIDTHS = tuple(range(2, 17))  # allowed bits per element, in the blob's group order
_HEADER = struct.Struct(f"<4sHHQQ{len(WIDTHS)}Q")


def check_column_bits(bits: np.ndarray, n: int) -> np.ndarray:
    """``bits`` as uint8 [n], each one of :data:`WIDTHS`; InvalidInputError naming the first
    bad entry otherwise."""
    return check_bits(bits, n, WIDTHS)


def column_bits(degrees: np.ndarray, widths: tuple[int, int, int, int]) -> np.ndarray:
    """Per-row widths, uint8 [N]: ``widths[i]`` for the rows whose degree falls in the i-th
    degree quartile (:func:`~.quantize.degree_thresholds`; low degrees first)."""
    if len(widths) != 4 or any(w not in WIDTHS for w in widths):
        raise InvalidInputError(f"widths must be 4 bit counts of 2-16, got {widths}", "widths")
    d = np.asarray(degrees, np.int64)
    quartile = np.searchsorted(np.asarray(degree_thresholds(d)), d, side="right")
    return np.asarray(widths, np.uint8)[quartile]


def _layout(n: int, f: int, counts: list[int]) -> Layout:
    pairs = zip(WIDTHS, counts, strict=True)
    codes = [("u1", (c, f)) for q, c in pairs for _ in range(1 + (q > 8))]
    return [("u1", (n,)), ("<f4", (f, 2)), *codes]


def _methods() -> list[str]:
    """Compression per section: the widths and ranges by LZ4, top codes by ZSTD, low bits
    by LZ4 (bit shuffled)."""
    return ["lz4", "lz4", *(m for q in WIDTHS for m in (("zstd", "lz4") if q > 8 else ("zstd",)))]


def _split(codes: np.ndarray, q: int) -> list[np.ndarray]:
    """A width's sections: [top 8 bits] (q <= 8: the codes) or [top 8 bits, low q-8 bits]."""
    if q <= 8:
        return [codes.astype(np.uint8)]
    low = q - 8
    return [(codes >> low).astype(np.uint8), (codes & ((1 << low) - 1)).astype(np.uint8)]


def _join(parts: list[np.ndarray], q: int) -> np.ndarray:
    if q <= 8:
        return parts[0]
    return (parts[0].astype(np.uint16) << (q - 8)) | parts[1]


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
    return codes.astype(np.uint16)


def _values(codes: np.ndarray, ranges: np.ndarray, q: int) -> np.ndarray:
    low, span = ranges[:, 0].astype(np.float64), ranges[:, 1].astype(np.float64)
    return (low + codes.astype(np.float64) * (span / ((1 << q) - 1))).astype(np.float32)


def pack_columns(features: np.ndarray, bits: np.ndarray, *, clevel: int = 5) -> bytes:
    """Quantize row ``v`` of ``features`` (float [N, F]) to ``bits[v]`` bits (2 to 16) on the
    columns' ranges, then compress. Returns the blob (format: module docstring)."""
    x = checked_features(features).astype(np.float64)
    b = check_column_bits(bits, x.shape[0])
    ranges = _ranges(x)
    n, f = x.shape
    counts = [int(np.count_nonzero(b == q)) for q in WIDTHS]
    codes = (part for q in WIDTHS for part in _split(_codes(x[b == q], ranges, q), q))
    header = _HEADER.pack(MAGIC, VERSION, 0, n, f, *counts)
    return write_blob(header, _layout(n, f, counts), [b, ranges, *codes], clevel, _methods())


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
        parts = iter(a[2:])
        for q in WIDTHS:
            codes = _join([next(parts) for _ in range(1 + (q > 8))], q)
            out[bits == q] = _values(codes, ranges, q)
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
