"""The framing both upload codecs share (:mod:`.codecs` for DAQ, :mod:`.column_codec` for
continuous readings): a fixed header, then sections, each a run of blosc2 chunks (``<Q`` length,
then the chunk; at most :data:`CHUNK_BYTES` raw each; an empty section has none), then a ``<I``
CRC-32 of everything before it. A codec gives the header and, from the header's fields, the
(dtype, shape) of each section. A section is compressed with LZ4 behind the bit-shuffle filter
(``lz4``: fast; planes of zero bits cost almost nothing) or with ZSTD on the bytes as they are
(``zstd``: its entropy coder takes bytes of a skewed distribution below 8 bits each); blosc2's
chunk header says which, so reading needs no flag.
"""

from __future__ import annotations

import math
import struct
import zlib
from collections.abc import Callable, Sequence

import blosc2
import numpy as np

from gnnserve.errors import InvalidInputError

CHUNK_BYTES = 1 << 26  # raw bytes per blosc2 chunk (blosc2 caps one buffer below 2 GiB)
_LEN = struct.Struct("<Q")
_CRC = struct.Struct("<I")

Layout = list[tuple[str, tuple[int, ...]]]  # (numpy dtype string, shape) per section


class CorruptBlobError(InvalidInputError):
    """A packed feature blob is truncated, corrupted or not a DAQ blob (field ``blob``)."""

    kind = "corrupt_blob"


def corrupt(message: str) -> CorruptBlobError:
    """The typed error for a bad blob, ``message`` saying what was wrong."""
    return CorruptBlobError(f"packed feature blob: {message}", "blob")


def check_header(
    fields: tuple, magic: bytes, version: int, name: str
) -> tuple[int, int, list[int]]:
    """(N, F, group counts) from the header ``fields`` ``(magic, version, 0, N, F, *counts)``;
    CorruptBlobError for another codec's or version's blob, or counts that do not sum to N."""
    got, got_version, _, n, f, *counts = fields
    if got != magic or got_version != version:
        raise corrupt(f"not a version-{version} {name} blob (magic {got!r}, version {got_version})")
    if sum(counts) != n:
        raise corrupt(f"inconsistent header: N={n}, F={f}, group counts {counts}")
    return n, f, counts


def checked_features(features: np.ndarray) -> np.ndarray:
    """``features`` as float32/float64 [N, F]; InvalidInputError for another shape, NaN, inf or
    a value past float32's range (decoding gives float32)."""
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


def _compress(arr: np.ndarray, clevel: int, method: str = "lz4") -> list[bytes]:
    raw = np.ascontiguousarray(arr).reshape(-1).view(np.uint8)
    lz4 = method == "lz4"
    cparams = blosc2.CParams(
        codec=blosc2.Codec.LZ4 if lz4 else blosc2.Codec.ZSTD, clevel=clevel,
        typesize=arr.dtype.itemsize,
        filters=[blosc2.Filter.BITSHUFFLE if lz4 else blosc2.Filter.NOFILTER], filters_meta=[0],
    )  # fmt: skip
    out: list[bytes] = []
    for start in range(0, len(raw), CHUNK_BYTES):
        chunk = blosc2.compress2(raw[start : start + CHUNK_BYTES], cparams=cparams)
        out += [_LEN.pack(len(chunk)), chunk]
    return out


def write_blob(
    header: bytes,
    layout: Layout,
    arrays: Sequence[np.ndarray],
    clevel: int,
    methods: Sequence[str] | None = None,
) -> bytes:
    """``header``, each array compressed as its section of ``layout`` (by ``methods``, one per
    section, ``lz4`` | ``zstd``; default all ``lz4``), and the CRC."""
    methods = methods or ["lz4"] * len(layout)
    pieces = [header]
    for (dtype, shape), arr, how in zip(layout, arrays, methods, strict=True):
        assert arr.shape == shape and arr.dtype.itemsize == np.dtype(dtype).itemsize
        pieces += _compress(arr.astype(dtype, copy=False), clevel, how)
    body = b"".join(pieces)
    return body + _CRC.pack(zlib.crc32(body))


def read_blob(
    blob: bytes, header: struct.Struct, layout_of: Callable[[tuple], Layout]
) -> tuple[tuple, list[list[bytes]]]:
    """Check the CRC and every chunk's framing; return the header's fields and each section's
    chunks (undecoded). ``layout_of(fields)`` raises :class:`CorruptBlobError` for fields it
    refuses (wrong magic or version, inconsistent counts)."""
    view = memoryview(blob)
    if len(view) < header.size + _CRC.size:
        raise corrupt(f"{len(view)} bytes is shorter than header and trailer")
    fields = header.unpack_from(view)
    layout = layout_of(fields)
    if _CRC.unpack_from(view, len(view) - _CRC.size)[0] != zlib.crc32(view[: -_CRC.size]):
        raise corrupt("CRC-32 mismatch (truncated or corrupted)")
    pos, end, sections = header.size, len(view) - _CRC.size, []
    for dtype, shape in layout:
        want, chunks = math.prod(shape) * np.dtype(dtype).itemsize, []
        while want > 0:
            if pos + _LEN.size > end:
                raise corrupt("ends inside a section")
            (clen,) = _LEN.unpack_from(view, pos)
            chunk = bytes(view[pos + _LEN.size : pos + _LEN.size + clen])
            pos += _LEN.size + clen
            raw, cbytes = _chunk_sizes(chunk) if len(chunk) == clen else (0, 0)
            if not 0 < raw <= min(want, CHUNK_BYTES) or cbytes != clen or pos > end:
                raise corrupt("bad chunk length")
            chunks.append(chunk)
            want -= raw
        sections.append(chunks)
    if pos != end:
        raise corrupt(f"{end - pos} unexpected bytes after the last section")
    return fields, sections


def _chunk_sizes(chunk: bytes) -> tuple[int, int]:
    """(raw bytes, compressed bytes) from a blosc2 chunk header; (0, 0) if it has none."""
    if len(chunk) < blosc2.MAX_OVERHEAD:
        return 0, 0
    try:
        nbytes, cbytes, _ = blosc2.get_cbuffer_sizes(chunk)
    except (ValueError, RuntimeError):
        return 0, 0
    return int(nbytes), int(cbytes)


def decode_section(chunks: list[bytes], dtype: str, shape: tuple[int, ...]) -> np.ndarray:
    """One section's array from its chunks; CorruptBlobError when they do not decompress to
    exactly ``shape``."""
    try:
        raw = b"".join(bytes(blosc2.decompress2(c)) for c in chunks)
    except (ValueError, RuntimeError) as exc:
        raise corrupt(f"blosc2 could not decompress a chunk ({exc})") from exc
    if len(raw) != math.prod(shape) * np.dtype(dtype).itemsize:
        raise corrupt("a section decompressed to the wrong size")
    return np.frombuffer(raw, dtype=dtype).reshape(shape)


def layout_bytes(layout: Layout) -> int:
    """Raw bytes of every section of ``layout``."""
    return sum(math.prod(shape) * np.dtype(dtype).itemsize for dtype, shape in layout)
