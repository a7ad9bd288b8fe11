"""Append-only update log: an accepted batch of graph updates is durable before it is acknowledged.

One record per batch, one line each: ``<crc32 hex> <json>\\n`` where the JSON holds the batch's
graph version (its sequence number, "seq") and its operations. The first record is the header,
seq 0; every later record's seq is the previous one + 1, so a replay applies each batch once and
a gap means lost data.

What a crash can leave, and what replay does with it. ``append`` appends one record
(``O_APPEND``) and, with ``fsync=always``, syncs it before the batch is acknowledged, so only the
final append can be incomplete: a process crash leaves a prefix of it without its newline; a
power loss can also leave it zero-filled (the size reached the disk, the data did not) or partly
written. (With ``fsync=never`` a power loss can take more than one record; what is left is judged
by the same rule.) The bytes after the last good record form a **torn tail** when they

- hold no complete valid record, neither at a line start nor inside a damaged line, and
- hold at most one newline, as their final byte (a single record's worth of damage).

A torn tail was never acknowledged: replay drops it (truncating the file, unless read-only: a
reader beside a live writer reads the file as it was when it began, and a record being written
right then is a torn tail).
Anything else after the last good record -- a bad record followed by valid ones, a bad header
followed by records, a seq gap or reordering, two damaged lines -- is **corruption**: replay
raises :class:`~gnnserve.errors.StoreFormatError` naming the byte offset, the expected seq and
how many valid records follow, and leaves the file untouched. ``gnnserve log verify LOG`` reports
the same; ``gnnserve log repair LOG --keep-good-prefix`` keeps the good prefix and moves the
damaged file aside (see :mod:`gnnserve.dynamic.logtool`).

One writer at a time: :class:`UpdateLog` holds an exclusive ``flock`` on the file while it is
open, and ``log repair`` takes the same lock (:func:`locked`), so neither a second server nor a
repair can run against a live writer. Readers (replay, verify) take no lock.
"""

from __future__ import annotations

import enum
import fcntl
import json
import logging
import os
import re
import threading
import zlib
from collections.abc import Generator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, BinaryIO

from gnnserve.errors import GnnServeError, StoreFormatError

log = logging.getLogger(__name__)

Record = tuple[int, list[dict[str, Any]]]  # (seq, ops)
_RECORD_START = re.compile(rb'[0-9a-f]{8} \{"version":')  # where an encoded record can begin


class LogInUseError(GnnServeError):
    """Another process (a running server) writes this update log."""

    http_status = 409
    kind = "log_in_use"


def _lock(fd: int, path: Path) -> None:
    """Take the exclusive writer lock of the log open as ``fd``; LogInUseError when held."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise LogInUseError(
            f"update log {path} is in use by another process (a running server writes it); "
            "stop that server first",
            "log",
        ) from None


@contextmanager
def locked(path: str | Path) -> Iterator[None]:
    """Hold the writer lock of the existing log ``path`` (LogInUseError when a writer has it)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        _lock(fd, Path(path))
        yield
    finally:
        os.close(fd)  # releases the lock


def record_offset(path: str | Path, seq: int) -> int:
    """Byte offset where record ``seq`` of the good prefix starts (records are lines)."""
    with open(path, "rb") as fh:
        for _ in range(seq):
            fh.readline()
        return fh.tell()


class FsyncPolicy(str, enum.Enum):
    """When the log is forced to disk."""

    ALWAYS = "always"  # fsync before every acknowledgement: survives power loss
    NEVER = "never"  # leave it to the OS: survives a process crash (kill -9), not power loss


def encode_record(version: int, ops: list[dict[str, Any]]) -> bytes:
    """One log line for a batch."""
    payload = json.dumps({"version": version, "ops": ops}, separators=(",", ":")).encode()
    return b"%08x %s\n" % (zlib.crc32(payload), payload)


def _decode_line(line: bytes) -> Record | None:
    """(seq, ops) of a complete, intact line, or None when it is torn or damaged."""
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


def _records_in(line: bytes) -> list[int]:
    """Seqs of the valid records in ``line``: at its start, or starting inside it (a record whose
    preceding newline was damaged)."""
    found = []
    for match in _RECORD_START.finditer(line):
        record = _decode_line(line[match.start() :])
        if record is not None:
            found.append(record[0])
    return found


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


@dataclass(frozen=True)
class LogScan:
    """What a scan of an update log found (offsets and sizes in bytes)."""

    path: Path
    size: int  # file size when the scan began
    records: int  # good records, header included
    last_seq: int  # seq of the last good record; -1 when there is none
    good_end: int  # where the good prefix ends
    status: str  # "clean" | "torn" | "corrupt"
    problem: str = ""  # what is wrong at good_end
    seqs_after: tuple[int, ...] = ()  # seqs of the valid records found after good_end

    @property
    def tail_bytes(self) -> int:
        """Bytes after the good prefix."""
        return self.size - self.good_end

    def describe(self) -> str:
        """One line: clean / torn tail of N bytes / corrupt at offset O (seq S) and why."""
        if self.status == "clean":
            return "clean"
        if self.status == "torn":
            return (
                f"torn tail of {self.tail_bytes} bytes at offset {self.good_end} (an incomplete "
                "final append, never acknowledged: start-up drops it)"
            )
        return f"corrupt at offset {self.good_end} (seq {self.last_seq + 1}): {self.problem}"

    def _last_good(self) -> str:
        return f"last good seq {self.last_seq}" if self.records else "no good record before it"

    def corruption_message(self) -> str:
        """The refusal of a corrupt log, with the commands that inspect and repair it."""
        return (
            f"update log {self.path} is corrupt at byte offset {self.good_end} (expected seq "
            f"{self.last_seq + 1}; {self._last_good()}): {self.problem}. This is not a torn final "
            "write: dropping the rest would lose acknowledged updates, so the log was left "
            f"unchanged. Inspect it with `gnnserve log verify {self.path}`; to keep only the good "
            f"prefix ({_plural(self.records, 'record')}) and move the damaged file aside, run "
            f"`gnnserve log repair {self.path} --keep-good-prefix`"
        )


def _what_is_wrong(line: bytes) -> str:
    """Why ``line``, where the next record should start, is not that record."""
    record = _decode_line(line)
    if record is not None:
        return f"a record with seq {record[0]} is there (records missing or out of order)"
    if not line.endswith(b"\n"):
        return "an incomplete record (no line end)"
    return "a damaged record (checksum or format)"


def _classify(fh: BinaryIO, good: LogScan, first_bad: bytes) -> LogScan:
    """Torn tail or corruption, from the bytes at ``good.good_end`` onwards (see module doc)."""
    seqs: list[int] = []
    newlines, line, offset = 0, first_bad, good.good_end
    while True:
        seqs += _records_in(line)
        newlines += line.endswith(b"\n")
        offset += len(line)
        if offset >= good.size:
            break
        line = fh.readline(good.size - offset)
    problem = _what_is_wrong(first_bad)
    if not seqs and (newlines == 0 or (newlines == 1 and line.endswith(b"\n"))):
        return replace(good, status="torn", problem=problem)
    if seqs:
        follow = "follows" if len(seqs) == 1 else "follow"
        problem += f"; {_plural(len(seqs), 'valid record')} {follow} it (seq {seqs[0]}"
        problem += f" to {seqs[-1]})" if len(seqs) > 1 else ")"
    else:
        problem += f"; the damage spans {newlines} lines, more than one final record"
    return replace(good, status="corrupt", problem=problem, seqs_after=tuple(seqs))


def _scan(path: Path) -> Generator[Record, None, LogScan]:
    """Yield the good records in order; return what the scan found. Reads the file as it was
    when the scan began (a live writer may go on appending)."""
    if not path.exists():
        return LogScan(path, 0, 0, -1, 0, "clean")
    with open(path, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        seq, end = -1, 0  # the last good record's seq and where it ends
        while end < size:
            line = fh.readline(size - end)
            record = _decode_line(line)
            if record is None or record[0] != seq + 1:
                return _classify(fh, LogScan(path, size, seq + 1, seq, end, "clean"), line)
            yield record
            seq, end = record[0], end + len(line)
        return LogScan(path, size, seq + 1, seq, end, "clean")


def scan_log(path: str | Path) -> LogScan:
    """Check a whole log without changing it (``gnnserve log verify``)."""
    scan = _scan(Path(path))
    while True:
        try:
            next(scan)
        except StopIteration as done:
            result: LogScan = done.value
            return result


def replay(path: str | Path, truncate: bool = True) -> Iterator[Record]:
    """Yield (seq, ops) of every good record in order; drop a torn tail (see module doc).

    Corruption raises StoreFormatError after the good records were yielded; the caller must then
    discard what it built. ``truncate=False`` leaves a torn tail in place (a reader beside a live
    writer, whose last record may be half-written right now); it still refuses corruption.
    """
    p = Path(path)
    result = yield from _scan(p)
    if result.status == "corrupt":
        raise StoreFormatError(result.corruption_message(), "wal")
    if result.status == "torn" and truncate:
        log.warning("%s: dropping a %s", p, result.describe())
        with open(p, "r+b") as fh:
            fh.truncate(result.good_end)
            os.fsync(fh.fileno())


def fsync_dir(path: Path) -> None:
    """Make the directory entries in ``path`` (a new or renamed file) durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _make_dirs(path: Path) -> None:
    """``mkdir -p path``, making each new directory's entry in its parent durable."""
    missing = [p for p in (path, *path.parents) if not p.exists()]
    path.mkdir(parents=True, exist_ok=True)
    for new in reversed(missing):
        fsync_dir(new.parent)


class UpdateLog:
    """The writer side of the log; thread-safe ``append``."""

    def __init__(self, path: str | Path, fsync: FsyncPolicy | str = FsyncPolicy.ALWAYS) -> None:
        self.path = Path(path)
        _make_dirs(self.path.parent)
        self.fsync = FsyncPolicy(fsync)
        flags = os.O_WRONLY | os.O_APPEND
        try:
            self._fd = os.open(self.path, flags | os.O_CREAT | os.O_EXCL, 0o644)
            fsync_dir(self.path.parent)  # a new file: its name must survive power loss too
        except FileExistsError:
            self._fd = os.open(self.path, flags)
        try:
            _lock(self._fd, self.path)
        except LogInUseError:
            os.close(self._fd)
            raise
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
