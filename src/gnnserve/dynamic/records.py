"""The two record encodings of the update log (``dynamic.wal``), each with its own CRC-32.

- **JSON line** (the log's header record, and every batch in logs of versions before batches
  were logged as columns): ``<crc32 hex> {"version":seq,"ops":[...]}\\n``, the CRC over the
  JSON bytes. Readable with ``less``; about 40 bytes an edge operation.
- **Binary frame** (every batch: ``dynamic.columns``): a 20-byte header ``MAGIC`` (4 bytes),
  seq (uint64), payload length (uint32), CRC-32 of seq, length and payload (uint32), all
  little-endian, then the payload (``columns.encode``: 25 bytes an edge operation).

A JSON line starts with a hex digit and a frame with ``MAGIC[0]`` (0xFF, never a hex digit), so a
reader tells them apart by their first byte and one log may hold both. ``decode_at`` reads either
kind at an offset of a buffer (an mmap of the log); a record is intact only when complete and
its CRC and format check out.
"""

from __future__ import annotations

import json
import re
import struct
import zlib
from typing import Any

MAGIC = b"\xffGU1"  # first bytes of a binary frame
FRAME_HEADER = struct.Struct("<4sQII")  # magic, seq, payload length, crc32
JSON_START = re.compile(rb'[0-9a-f]{8} \{"version":')  # where a JSON line record can begin

Ops = list[dict[str, Any]] | bytes  # a JSON record's operations, or a frame's payload
Record = tuple[int, Ops]  # (seq, ops)


def encode_record(version: int, ops: list[dict[str, Any]]) -> bytes:
    """One JSON log line for a batch."""
    payload = json.dumps({"version": version, "ops": ops}, separators=(",", ":")).encode()
    return b"%08x %s\n" % (zlib.crc32(payload), payload)


def _frame_crc(seq: int, payload: bytes | memoryview) -> int:
    return zlib.crc32(payload, zlib.crc32(struct.pack("<QI", seq, len(payload))))


def encode_frame(seq: int, payload: bytes) -> bytes:
    """One binary log frame holding ``payload`` (a columnar batch)."""
    return FRAME_HEADER.pack(MAGIC, seq, len(payload), _frame_crc(seq, payload)) + payload


def decode_line(line: bytes) -> Record | None:
    """(seq, ops) of a complete, intact JSON line, or None when it is torn or damaged."""
    if not line.endswith(b"\n") or len(line) < 10 or line[8:9] != b" ":
        return None
    payload = line[9:-1]
    try:
        if int(line[:8], 16) != zlib.crc32(payload):
            return None
        record = json.loads(payload)
    except ValueError:
        return None
    if not isinstance(record, dict):
        return None
    version, ops = record.get("version"), record.get("ops")
    if type(version) is not int or version < 0 or not isinstance(ops, list):
        return None
    return version, ops


def frame_length(buf: Any, at: int) -> int | None:
    """Total bytes of the frame whose intact header starts at ``at``; None if there is none."""
    if len(buf) - at < FRAME_HEADER.size or buf[at : at + 4] != MAGIC:
        return None
    return FRAME_HEADER.size + int(FRAME_HEADER.unpack_from(buf, at)[2])


def decode_frame(buf: Any, at: int) -> tuple[Record, int] | None:
    """((seq, payload), frame bytes) of an intact frame at ``at`` of ``buf``, else None."""
    size = frame_length(buf, at)
    if size is None or at + size > len(buf):
        return None
    _, seq, _, crc = FRAME_HEADER.unpack_from(buf, at)
    payload = bytes(buf[at + FRAME_HEADER.size : at + size])
    if _frame_crc(seq, payload) != crc:
        return None
    return (int(seq), payload), size


def decode_at(buf: Any, at: int, end: int) -> tuple[Record, int] | None:
    """The intact record (either kind) starting at ``at`` and ending by ``end``, and its size."""
    if buf[at : at + 1] == MAGIC[:1]:
        return decode_frame(memoryview(buf)[:end], at)
    stop = buf.find(b"\n", at, end)
    line = bytes(buf[at : end if stop < 0 else stop + 1])
    record = decode_line(line)
    return None if record is None else (record, len(line))
