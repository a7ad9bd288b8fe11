"""Fograph's communication optimizer (§III-D): rows quantized by DAQ
(:mod:`gnnserve.features.quantize`, step 1), then compressed with blosc2's LZ4 codec behind its
bit-shuffle filter (step 2) into one CRC-checked blob.

Blob format (version 1, little-endian):

* header ``<4sHHQQ4Q``: magic ``b"GDAQ"``, version, 0, N rows, F columns, row counts of the
  64/32/16/8-bit groups;
* 7 sections, each a run of blosc2 chunks (``<Q`` length, then the chunk; at most 64 MiB raw
  each; an empty section has none): the widths ``uint8 [N]`` in row order (which fixes the row
  order of every group: ascending row id), float64 ``[n64, F]``, float32 ``[n32, F]``, then for
  16 and for 8 bits float32 ``[n, 2]`` (offset, scale) and uint16 / uint8 codes ``[n, F]``;
* trailer ``<I``: CRC-32 of everything before it.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

import numpy as np

from gnnserve.features.blobs import (
    CHUNK_BYTES,
    CorruptBlobError,
    Layout,
    check_header,
    checked_features,
    corrupt,
    decode_section,
    layout_bytes,
    read_blob,
    write_blob,
)
from gnnserve.features.quantize import (
    WIDTHS,
    check_bits,
    linear_dequantize,
    linear_quantize,
)

__all__ = ["CHUNK_BYTES", "BlobInfo", "CorruptBlobError", "inspect_blob", "pack", "unpack"]
MAGIC = b"GDAQ"
VERSION = 1
_HEADER = struct.Struct("<4sHHQQ4Q")


@dataclass(frozen=True)
class BlobInfo:
    """What a packed blob holds, read from its header and chunk headers (nothing decoded)."""

    num_rows: int  # N
    dim: int  # F
    counts: dict[int, int]  # rows per bitwidth
    quantized_bytes: int  # bytes of the quantized values alone (see :func:`quantized_bytes`)
    serialized_bytes: int  # raw bytes of all sections (values, widths, offsets/scales)
    packed_bytes: int  # len(blob), header and trailer included
    chunks: tuple[bytes, ...] = field(repr=False)  # every blosc2 chunk, in blob order


def _layout(n: int, f: int, counts: list[int]) -> Layout:
    """(dtype, shape) of the 7 sections, in blob order."""
    n64, n32, n16, n8 = counts
    return [
        ("u1", (n,)), ("<f8", (n64, f)), ("<f4", (n32, f)),
        ("<f4", (n16, 2)), ("<u2", (n16, f)), ("<f4", (n8, 2)), ("u1", (n8, f)),
    ]  # fmt: skip


def pack(features: np.ndarray, bits: np.ndarray, *, clevel: int = 5) -> bytes:
    """DAQ-quantize each row of ``features`` (float [N, F]) to ``bits[v]`` bits, then compress
    with LZ4 + bit shuffle (``clevel`` 0-9). Returns the blob (format: module docstring)."""
    x = checked_features(features)
    b = check_bits(bits, x.shape[0])
    counts = [int(np.count_nonzero(b == q)) for q in WIDTHS]
    groups = [x[b == q] for q in WIDTHS]
    arrays = [b, groups[0].astype("<f8"), groups[1].astype("<f4")]
    for q, rows in zip((16, 8), groups[2:], strict=True):
        arrays += linear_quantize(rows, q)
    n, f = x.shape
    header = _HEADER.pack(MAGIC, VERSION, 0, n, f, *counts)
    return write_blob(header, _layout(n, f, counts), arrays, clevel)


def _layout_of(fields: tuple) -> Layout:
    n, f, counts = check_header(fields, MAGIC, VERSION, "DAQ")
    return _layout(n, f, counts)


def _read(blob: bytes) -> tuple[int, int, list[int], list[list[bytes]]]:
    """Check the blob; return N, F, group counts and each section's chunks (undecoded)."""
    (_, _, _, n, f, *counts), sections = read_blob(blob, _HEADER, _layout_of)
    return n, f, counts, sections


def unpack(blob: bytes) -> np.ndarray:
    """Decompress and dequantize a :func:`pack` blob: float32 ``[N, F]`` in the original row
    order. Raises :class:`CorruptBlobError` on a truncated, corrupted or foreign blob."""
    n, f, counts, sections = _read(blob)
    layout = _layout(n, f, counts)
    a = [decode_section(c, *spec) for c, spec in zip(sections, layout, strict=True)]
    bits = a[0]
    if [int(np.count_nonzero(bits == q)) for q in WIDTHS] != counts:
        raise corrupt("row widths disagree with the header's group counts")
    out = np.empty((n, f), dtype=np.float32)
    with np.errstate(over="ignore", invalid="ignore"):  # tampered values: refused below
        groups = [a[1], a[2], linear_dequantize(a[3], a[4]), linear_dequantize(a[5], a[6])]
        for q, rows in zip(WIDTHS, groups, strict=True):
            out[bits == q] = rows
    if not np.isfinite(out).all():
        raise corrupt("decoded values are not finite")
    return out


def inspect_blob(blob: bytes) -> BlobInfo:
    """Sizes and chunks of a :func:`pack` blob, checked like :func:`unpack` but not decoded."""
    n, f, counts, sections = _read(blob)
    by_width = dict(zip(WIDTHS, counts, strict=True))
    return BlobInfo(
        num_rows=n,
        dim=f,
        counts=by_width,
        quantized_bytes=sum(q // 8 * c for q, c in by_width.items()) * f,
        serialized_bytes=layout_bytes(_layout(n, f, counts)),
        packed_bytes=len(blob),
        chunks=tuple(c for chunks in sections for c in chunks),
    )
