"""What an Arrow IPC stream expands to, read from its messages' metadata before anything is
decoded: the rows of its record batches and the bytes of their buffers once decompressed.

A compressed stream (zstd, LZ4) is small on the wire and large in memory: 5 MB of zstd can
carry 10 million update rows. The server's body limit bounds the bytes it reads; this bounds
what those bytes become. Each IPC message is a flatbuffer ``Message`` (Arrow's Message.fbs)
followed by its body; the ``RecordBatch`` header lists the batch's row count and every buffer's
offset and length in the body, and in a compressed body each buffer starts with its
uncompressed length (int64; -1: stored uncompressed). Only those fields are read here.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

from gnnserve.errors import InvalidInputError

_DICTIONARY_BATCH, _RECORD_BATCH = 2, 3  # Message.fbs MessageHeader union tags
_BUFFER = struct.Struct("<qq")  # Buffer { offset: long; length: long }


@dataclass(frozen=True)
class StreamSize:
    """``rows``: record-batch rows in the stream; ``decoded_bytes``: its batches' and
    dictionaries' buffers once decompressed."""

    rows: int
    decoded_bytes: int


def _field(meta: bytes, table: int, slot: int) -> int | None:
    """Position of field ``slot`` of the flatbuffer table at ``table`` (None: absent)."""
    vtable = table - struct.unpack_from("<i", meta, table)[0]
    at = 4 + 2 * slot
    if at + 2 > struct.unpack_from("<H", meta, vtable)[0]:
        return None
    offset = struct.unpack_from("<H", meta, vtable + at)[0]
    return None if offset == 0 else table + offset


def _follow(meta: bytes, at: int) -> int:
    """The target of the uoffset stored at ``at``."""
    return at + struct.unpack_from("<I", meta, at)[0]


def _batch_header(meta: bytes) -> tuple[int, int | None]:
    """(message kind, position of its RecordBatch table): a record batch's own, a dictionary
    batch's data; None for other messages (the schema)."""
    message = _follow(meta, 0)
    kind_at, header_at = _field(meta, message, 1), _field(meta, message, 2)
    kind = meta[kind_at] if kind_at is not None else 0
    if kind not in (_DICTIONARY_BATCH, _RECORD_BATCH) or header_at is None:
        return kind, None
    header = _follow(meta, header_at)
    if kind == _RECORD_BATCH:
        return kind, header
    data_at = _field(meta, header, 1)  # DictionaryBatch { id; data: RecordBatch; isDelta }
    return kind, None if data_at is None else _follow(meta, data_at)


def _batch_size(meta: bytes, body: Any) -> tuple[int, int]:
    """(rows, decoded bytes) of one batch message (a dictionary's values are bytes, not
    rows); ``body``: any buffer (a pyarrow Buffer is read in place)."""
    kind, batch = _batch_header(meta)
    if batch is None:
        return 0, 0
    length_at = _field(meta, batch, 0)
    rows = 0 if length_at is None else struct.unpack_from("<q", meta, length_at)[0]
    rows = rows if kind == _RECORD_BATCH else 0
    compressed = _field(meta, batch, 3) is not None
    buffers_at, total = _field(meta, batch, 2), 0
    if buffers_at is not None:
        vector = _follow(meta, buffers_at)
        for i in range(struct.unpack_from("<I", meta, vector)[0]):
            offset, length = _BUFFER.unpack_from(meta, vector + 4 + _BUFFER.size * i)
            if compressed and length >= 8:
                plain = struct.unpack_from("<q", body, offset)[0]
                total += length - 8 if plain == -1 else plain
            else:
                total += length
    if rows < 0 or total < 0:
        raise ValueError("negative sizes")
    return rows, total


def stream_size(pa: Any, data: bytes) -> StreamSize:
    """Rows and decoded bytes of the Arrow IPC stream ``data`` (``pa``: pyarrow), without
    decoding it; InvalidInputError when its messages are malformed."""
    reader = pa.ipc.MessageReader.open_stream(data)
    rows = decoded = 0
    try:
        while True:
            try:
                message = reader.read_next_message()
            except StopIteration:
                break
            if message is None:
                break
            body = b"" if message.body is None else message.body  # read in place: no copy
            batch_rows, batch_bytes = _batch_size(message.metadata.to_pybytes(), body)
            rows, decoded = rows + batch_rows, decoded + batch_bytes
    except (pa.ArrowException, OSError, struct.error, IndexError, ValueError) as exc:
        raise InvalidInputError(f"the body is not an Arrow IPC stream: {exc}", "body") from None
    return StreamSize(rows, decoded)
