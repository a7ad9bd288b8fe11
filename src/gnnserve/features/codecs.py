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

import math
import struct
import zlib
from dataclasses import dataclass, field

import blosc2
import numpy as np

from gnnserve.errors import InvalidInputError
from gnnserve.features.quantize import (
    WIDTHS,
    check_bits,
    linear_dequantize,
    linear_quantize,
)

MAGIC = b"GDAQ"
VERSION = 1
CHUNK_BYTES = 1 << 26  # raw bytes per blosc2 chunk (blosc2 caps one buffer below 2 GiB)
_HEADER = struct.Struct("<4sHHQQ4Q")
_LEN = struct.Struct("<Q")
_CRC = struct.Struct("<I")


class CorruptBlobError(InvalidInputError):
    """A packed feature blob is truncated, corrupted or not a DAQ blob (field ``blob``)."""

    kind = "corrupt_blob"


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


def _features(features: np.ndarray) -> np.ndarray:
    x = np.asarray(features)
    if x.ndim != 2 or not np.issubdtype(x.dtype, np.floating):
        raise InvalidInputError(
            f"features must be a float [N, F] array, got {x.dtype} {x.shape}", "features"
        )
    finite = np.isfinite(x).all(axis=1)
    if not finite.all():
        bad = np.flatnonzero(~finite)
        raise InvalidInputError(
            f"features hold NaN or inf in {bad.size} rows (first: row {bad[0]})", "features"
        )
    if x.size and np.abs(x).max() > np.finfo(np.float32).max:
        raise InvalidInputError(
            "features exceed the float32 range (unpack gives float32)", "features"
        )
    return x if x.dtype in (np.float32, np.float64) else x.astype(np.float32)


def _layout(n: int, f: int, counts: list[int]) -> list[tuple[str, tuple[int, ...]]]:
    """(dtype, shape) of the 7 sections, in blob order."""
    n64, n32, n16, n8 = counts
    return [
        ("u1", (n,)), ("<f8", (n64, f)), ("<f4", (n32, f)),
        ("<f4", (n16, 2)), ("<u2", (n16, f)), ("<f4", (n8, 2)), ("u1", (n8, f)),
    ]  # fmt: skip


def _compress(arr: np.ndarray, clevel: int) -> list[bytes]:
    raw = np.ascontiguousarray(arr).reshape(-1).view(np.uint8)
    cparams = blosc2.CParams(
        codec=blosc2.Codec.LZ4, clevel=clevel, typesize=arr.dtype.itemsize,
        filters=[blosc2.Filter.BITSHUFFLE], filters_meta=[0],
    )  # fmt: skip
    out: list[bytes] = []
    for start in range(0, len(raw), CHUNK_BYTES):
        chunk = blosc2.compress2(raw[start : start + CHUNK_BYTES], cparams=cparams)
        out += [_LEN.pack(len(chunk)), chunk]
    return out


def pack(features: np.ndarray, bits: np.ndarray, *, clevel: int = 5) -> bytes:
    """DAQ-quantize each row of ``features`` (float [N, F]) to ``bits[v]`` bits, then compress
    with LZ4 + bit shuffle (``clevel`` 0-9). Returns the blob (format: module docstring)."""
    x = _features(features)
    b = check_bits(bits, x.shape[0])
    counts = [int(np.count_nonzero(b == q)) for q in WIDTHS]
    groups = [x[b == q] for q in WIDTHS]
    arrays = [b, groups[0].astype("<f8"), groups[1].astype("<f4")]
    for q, rows in zip((16, 8), groups[2:], strict=True):
        arrays += linear_quantize(rows, q)
    n, f = x.shape
    pieces = [_HEADER.pack(MAGIC, VERSION, 0, n, f, *counts)]
    for (dtype, shape), arr in zip(_layout(n, f, counts), arrays, strict=True):
        assert arr.shape == shape and arr.dtype.itemsize == np.dtype(dtype).itemsize
        pieces += _compress(arr.astype(dtype, copy=False), clevel)
    body = b"".join(pieces)
    return body + _CRC.pack(zlib.crc32(body))


def _corrupt(message: str) -> CorruptBlobError:
    return CorruptBlobError(f"packed feature blob: {message}", "blob")


def _read(blob: bytes) -> tuple[int, int, list[int], list[list[bytes]]]:
    """Check the blob; return N, F, group counts and each section's chunks (undecoded)."""
    view = memoryview(blob)
    if len(view) < _HEADER.size + _CRC.size:
        raise _corrupt(f"{len(view)} bytes is shorter than header and trailer")
    magic, version, _, n, f, *counts = _HEADER.unpack_from(view)
    if magic != MAGIC or version != VERSION:
        raise _corrupt(f"not a version-{VERSION} DAQ blob (magic {magic!r}, version {version})")
    if _CRC.unpack_from(view, len(view) - _CRC.size)[0] != zlib.crc32(view[: -_CRC.size]):
        raise _corrupt("CRC-32 mismatch (truncated or corrupted)")
    if sum(counts) != n:
        raise _corrupt(f"inconsistent header: N={n}, F={f}, group counts {counts}")
    pos, end, sections = _HEADER.size, len(view) - _CRC.size, []
    for dtype, shape in _layout(n, f, counts):
        want, chunks = math.prod(shape) * np.dtype(dtype).itemsize, []
        while want > 0:
            if pos + _LEN.size > end:
                raise _corrupt("ends inside a section")
            (clen,) = _LEN.unpack_from(view, pos)
            chunk = bytes(view[pos + _LEN.size : pos + _LEN.size + clen])
            pos += _LEN.size + clen
            raw, cbytes = _chunk_sizes(chunk) if len(chunk) == clen else (0, 0)
            if not 0 < raw <= min(want, CHUNK_BYTES) or cbytes != clen or pos > end:
                raise _corrupt("bad chunk length")
            chunks.append(chunk)
            want -= raw
        sections.append(chunks)
    if pos != end:
        raise _corrupt(f"{end - pos} unexpected bytes after the last section")
    return n, f, counts, sections


def _chunk_sizes(chunk: bytes) -> tuple[int, int]:
    """(raw bytes, compressed bytes) from a blosc2 chunk header; (0, 0) if it has none."""
    if len(chunk) < blosc2.MAX_OVERHEAD:
        return 0, 0
    try:
        nbytes, cbytes, _ = blosc2.get_cbuffer_sizes(chunk)
    except (ValueError, RuntimeError):
        return 0, 0
    return int(nbytes), int(cbytes)


def _decode(chunks: list[bytes], dtype: str, shape: tuple[int, ...]) -> np.ndarray:
    try:
        raw = b"".join(bytes(blosc2.decompress2(c)) for c in chunks)
    except (ValueError, RuntimeError) as exc:
        raise _corrupt(f"blosc2 could not decompress a chunk ({exc})") from exc
    if len(raw) != math.prod(shape) * np.dtype(dtype).itemsize:
        raise _corrupt("a section decompressed to the wrong size")
    return np.frombuffer(raw, dtype=dtype).reshape(shape)


def unpack(blob: bytes) -> np.ndarray:
    """Decompress and dequantize a :func:`pack` blob: float32 ``[N, F]`` in the original row
    order. Raises :class:`CorruptBlobError` on a truncated, corrupted or foreign blob."""
    n, f, counts, sections = _read(blob)
    a = [_decode(c, *spec) for c, spec in zip(sections, _layout(n, f, counts), strict=True)]
    bits = a[0]
    if [int(np.count_nonzero(bits == q)) for q in WIDTHS] != counts:
        raise _corrupt("row widths disagree with the header's group counts")
    out = np.empty((n, f), dtype=np.float32)
    with np.errstate(over="ignore", invalid="ignore"):  # tampered values: refused below
        groups = [a[1], a[2], linear_dequantize(a[3], a[4]), linear_dequantize(a[5], a[6])]
        for q, rows in zip(WIDTHS, groups, strict=True):
            out[bits == q] = rows
    if not np.isfinite(out).all():
        raise _corrupt("decoded values are not finite")
    return out


def inspect_blob(blob: bytes) -> BlobInfo:
    """Sizes and chunks of a :func:`pack` blob, checked like :func:`unpack` but not decoded."""
    n, f, counts, sections = _read(blob)
    by_width = dict(zip(WIDTHS, counts, strict=True))
    serialized = sum(
        math.prod(shape) * np.dtype(dtype).itemsize for dtype, shape in _layout(n, f, counts)
    )
    return BlobInfo(
        num_rows=n,
        dim=f,
        counts=by_width,
        quantized_bytes=sum(q // 8 * c for q, c in by_width.items()) * f,
        serialized_bytes=serialized,
        packed_bytes=len(blob),
        chunks=tuple(c for chunks in sections for c in chunks),
    )
