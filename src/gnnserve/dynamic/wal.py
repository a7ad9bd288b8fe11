"""Append-only update log: an accepted batch of graph updates is durable before it is acknowledged.

One record per batch: a binary frame (a header with the batch's graph version, its sequence
number "seq", the length and a CRC-32, then the columnar batch), or a JSON line
``<crc32 hex> <json>\\n`` holding the seq and the operations (the header record, and batches of
older logs); see ``dynamic.records``. The
first record is the header, seq 0; every later record's seq is the previous one + 1, so a replay
applies each batch once and a gap means lost data.

What a crash can leave, and what replay does with it. ``append`` appends one record
(``O_APPEND``) and, with ``fsync=always``, syncs it before the batch is acknowledged, so only the
final append can be incomplete: a process crash leaves a prefix of it without its newline; a
power loss can also leave it zero-filled (the size reached the disk, the data did not) or partly
written. (With ``fsync=never`` a power loss can take more than one record; what is left is judged
by the same rule.) The bytes after the last good record form a **torn tail** when they

- hold no complete valid record of either kind, at a record start or inside damaged bytes, and
- are a single record's worth of damage: the start of one frame (no more bytes than its intact
  header announces, or less than a header), or else at most one newline, as their final byte.

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
import logging
import mmap
import os
import threading
from collections.abc import Generator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from gnnserve.dynamic.records import (
    FRAME_HEADER,
    JSON_START,
    MAGIC,
    Record,
    decode_at,
    decode_frame,
    encode_frame,
    encode_record,
    frame_length,
)
from gnnserve.errors import GnnServeError, StoreFormatError

log = logging.getLogger(__name__)

__all__ = ["FsyncPolicy", "LogScan", "UpdateLog", "encode_record", "replay", "scan_log"]


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


@contextmanager
def _mapped(path: Path) -> Iterator[tuple[Any, int]]:
    """(read-only mmap of the file as it is now, its size); an empty buffer for an empty file."""
    with open(path, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        if size == 0:
            yield b"", 0
            return
        with mmap.mmap(fh.fileno(), size, access=mmap.ACCESS_READ) as buf:
            yield buf, size


def record_offset(path: str | Path, seq: int) -> int:
    """Byte offset where record ``seq`` of the good prefix starts."""
    with _mapped(Path(path)) as (buf, size):
        at = 0
        for _ in range(seq):
            found = decode_at(buf, at, size)
            assert found is not None, "record_offset reads the good prefix only"
            at += found[1]
        return at


class FsyncPolicy(str, enum.Enum):
    """When the log is forced to disk."""

    ALWAYS = "always"  # fsync before every acknowledgement: survives power loss
    NEVER = "never"  # leave it to the OS: survives a process crash (kill -9), not power loss


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


def _what_is_wrong(buf: Any, at: int, size: int) -> str:
    """Why the bytes at ``at``, where the next record should start, are not that record."""
    found = decode_at(buf, at, size)
    if found is not None:
        return f"a record with seq {found[0][0]} is there (records missing or out of order)"
    if buf[at : at + 1] == MAGIC[:1]:
        length = frame_length(buf, at)
        if length is None or at + length > size:
            return "an incomplete record (a frame shorter than its header)"
        return "a damaged record (checksum or format)"
    if buf.find(b"\n", at, size) < 0:
        return "an incomplete record (no line end)"
    return "a damaged record (checksum or format)"


def _records_after(buf: Any, at: int, size: int) -> list[int]:
    """Seqs of the intact records of either kind starting anywhere in ``buf[at:size]`` (inside
    damaged bytes too), in file order."""
    found = []
    for match in JSON_START.finditer(buf, at, size):
        record = decode_at(buf, match.start(), size)
        if record is not None:
            found.append((match.start(), record[0][0]))
    p = buf.find(MAGIC, at, size)
    while p >= 0:
        frame = decode_frame(memoryview(buf)[:size], p)
        if frame is not None:
            found.append((p, frame[0][0]))
        p = buf.find(MAGIC, p + 1, size)
    return [seq for _, seq in sorted(found)]


def _one_record_of_damage(buf: Any, at: int, size: int) -> bool:
    """True when the bytes from ``at`` are at most one record's worth (module docstring)."""
    tail = size - at
    length = frame_length(buf, at)
    if length is not None:
        return tail <= length
    if tail < FRAME_HEADER.size and MAGIC.startswith(bytes(buf[at : at + min(tail, len(MAGIC))])):
        return True  # a frame cut inside its header (its magic included)
    newline = buf.find(b"\n", at, size)
    return newline < 0 or newline == size - 1


def _classify(buf: Any, good: LogScan) -> LogScan:
    """Torn tail or corruption, from the bytes at ``good.good_end`` onwards (see module doc)."""
    at, size = good.good_end, good.size
    seqs = _records_after(buf, at, size)
    problem = _what_is_wrong(buf, at, size)
    if not seqs and _one_record_of_damage(buf, at, size):
        return replace(good, status="torn", problem=problem)
    if seqs:
        follow = "follows" if len(seqs) == 1 else "follow"
        problem += f"; {_plural(len(seqs), 'valid record')} {follow} it (seq {seqs[0]}"
        problem += f" to {seqs[-1]})" if len(seqs) > 1 else ")"
    else:
        lines = _count_newlines(buf, at, size)
        problem += f"; the damage spans {lines} lines, more than one final record"
    return replace(good, status="corrupt", problem=problem, seqs_after=tuple(seqs))


def _count_newlines(buf: Any, at: int, size: int) -> int:
    count, p = 0, buf.find(b"\n", at, size)
    while p >= 0:
        count, p = count + 1, buf.find(b"\n", p + 1, size)
    return count


def _scan(path: Path) -> Generator[Record, None, LogScan]:
    """Yield the good records in order; return what the scan found. Reads the file as it was
    when the scan began (a live writer may go on appending)."""
    if not path.exists():
        return LogScan(path, 0, 0, -1, 0, "clean")
    with _mapped(path) as (buf, size):
        seq, end = -1, 0  # the last good record's seq and where it ends
        while end < size:
            found = decode_at(buf, end, size)
            if found is None or found[0][0] != seq + 1:
                return _classify(buf, LogScan(path, size, seq + 1, seq, end, "clean"))
            yield found[0]
            seq, end = found[0][0], end + found[1]
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
    """The writer side of the log; thread-safe ``append``.

    ``shared``: one of several server processes appending to the log (``serve --workers N``):
    the supervisor holds the writer lock (:func:`hold_writer_lock`), and this process appends
    only inside :meth:`exclusive` (see ``dynamic.shared_log``)."""

    def __init__(
        self, path: str | Path, fsync: FsyncPolicy | str = FsyncPolicy.ALWAYS, shared: bool = False
    ) -> None:
        self.path = Path(path)
        self.shared = shared
        _make_dirs(self.path.parent)
        self.fsync = FsyncPolicy(fsync)
        flags = os.O_WRONLY | os.O_APPEND
        try:
            self._fd = os.open(self.path, flags | os.O_CREAT | os.O_EXCL, 0o644)
            fsync_dir(self.path.parent)  # a new file: its name must survive power loss too
        except FileExistsError:
            self._fd = os.open(self.path, flags)
        try:
            if not shared:
                _lock(self._fd, self.path)
        except LogInUseError:
            os.close(self._fd)
            raise
        self._lock = threading.Lock()
        self.bytes_written = 0

    def append(self, version: int, ops: list[dict[str, Any]]) -> int:
        """Write one batch as a JSON line; returns (its length in bytes) once it is as durable
        as the policy says."""
        return self._write(encode_record(version, ops))

    def append_frame(self, version: int, payload: bytes) -> int:
        """Write one bulk batch (``columns.encode``) as a binary frame; durable as ``append``;
        its length in bytes."""
        return self._write(encode_frame(version, payload))

    def _write(self, data: bytes) -> int:
        with self._lock:
            view = memoryview(data)
            while view:
                view = view[os.write(self._fd, view) :]
            if self.fsync is FsyncPolicy.ALWAYS:
                os.fsync(self._fd)
            self.bytes_written += len(data)
            return len(data)

    def fileno(self) -> int:
        """The descriptor this process appends through."""
        return self._fd

    def truncate(self, size: int) -> None:
        """Cut the file to ``size`` bytes (a torn tail), durably."""
        with self._lock:
            os.ftruncate(self._fd, size)
            os.fsync(self._fd)

    def close(self) -> None:
        """Flush and close the file."""
        with self._lock:
            if self._fd >= 0:
                os.fsync(self._fd)
                os.close(self._fd)
                self._fd = -1
