"""Append-only update log: an accepted batch of graph updates is durable before it is acknowledged.

One record per batch, one line each: ``<crc32 hex> <json>\\n`` where the JSON holds the batch's
graph version and its operations. A crash can leave at most one torn record at the tail (no
newline, or a CRC that does not match): replay stops there and truncates it, since that batch was
never acknowledged. Versions are strictly increasing, so a replay applies each record once.
"""

from __future__ import annotations

import enum
import json
import logging
import os
import threading
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from gnnserve.errors import StoreFormatError

log = logging.getLogger(__name__)


class FsyncPolicy(str, enum.Enum):
    """When the log is forced to disk."""

    ALWAYS = "always"  # fsync before every acknowledgement: survives power loss
    NEVER = "never"  # leave it to the OS: survives a process crash (kill -9), not power loss


def encode_record(version: int, ops: list[dict[str, Any]]) -> bytes:
    """One log line for a batch."""
    payload = json.dumps({"version": version, "ops": ops}, separators=(",", ":")).encode()
    return b"%08x %s\n" % (zlib.crc32(payload), payload)


def _decode_line(line: bytes) -> dict[str, Any] | None:
    """The record of a complete line, or None when it is torn or corrupt."""
    if not line.endswith(b"\n") or len(line) < 10 or line[8:9] != b" ":
        return None
    payload = line[9:-1]
    try:
        if int(line[:8], 16) != zlib.crc32(payload):
            return None
        record: dict[str, Any] = json.loads(payload)
    except ValueError:
        return None
    return record


def replay(path: str | Path, truncate: bool = True) -> Iterator[tuple[int, list[dict[str, Any]]]]:
    """Yield (version, ops) of every intact record in order; truncate a torn tail.

    ``truncate=False`` leaves the file as it is (a reader beside a live writer, whose last
    record may be half-written right now).
    """
    p = Path(path)
    if not p.exists():
        return
    good_end = 0
    last_version = -1  # the header record is version 0
    with open(p, "rb") as fh:
        for line in fh:
            record = _decode_line(line)
            if record is None:
                break
            version = int(record["version"])
            if version <= last_version:
                raise StoreFormatError(f"{p}: version {version} after {last_version}", "wal")
            last_version = version
            good_end += len(line)
            yield version, record["ops"]
    if truncate and p.stat().st_size > good_end:
        log.warning("%s: dropping %d bytes of a torn record", p, p.stat().st_size - good_end)
        with open(p, "r+b") as fh:
            fh.truncate(good_end)


class UpdateLog:
    """The writer side of the log; thread-safe ``append``."""

    def __init__(self, path: str | Path, fsync: FsyncPolicy | str = FsyncPolicy.ALWAYS) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.fsync = FsyncPolicy(fsync)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self._lock = threading.Lock()
        self.bytes_written = 0

    def append(self, version: int, ops: list[dict[str, Any]]) -> None:
        """Write one batch; returns once it is as durable as the policy promises."""
        data = encode_record(version, ops)
        with self._lock:
            view = memoryview(data)
            while view:
                view = view[os.write(self._fd, view) :]
            if self.fsync is FsyncPolicy.ALWAYS:
                os.fsync(self._fd)
            self.bytes_written += len(data)

    def close(self) -> None:
        """Flush and close the file."""
        with self._lock:
            if self._fd >= 0:
                os.fsync(self._fd)
                os.close(self._fd)
                self._fd = -1
