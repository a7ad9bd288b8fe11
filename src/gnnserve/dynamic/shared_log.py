"""One update log written by several server processes (``serve --workers N --update-log``).

The supervisor holds the log's writer lock for the deployment's life (:func:`hold_writer_lock`,
the ``flock`` that :class:`~gnnserve.dynamic.wal.UpdateLog` takes), so no other server and no
``log repair`` runs against it. Each worker appends through its own descriptor, inside
:func:`appending`: an open-file-description lock on a byte range no record reaches, which the
kernel drops when its holder dies. Inside it a worker first reads what the others appended
(:func:`read_tail` from the offset it has applied up to), so it validates a batch against the
newest state and gives it the next seq; every worker applies every batch in seq order, its own
as it appends it, the others' as it reads them from the log by offset, as DGS's workers do.

What ``read_tail`` finds after the last complete record is, outside the lock, a record being
appended right now (left for the next read); inside it, the torn tail of an appender that died
mid-write (never acknowledged: cut off) or corruption (refused, the file left as it is), judged
by the rule of ``dynamic.wal``.
"""

from __future__ import annotations

import fcntl
import os
import struct
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from gnnserve.dynamic.records import Ops, decode_at
from gnnserve.dynamic.wal import LogScan, UpdateLog, _classify, _lock, _make_dirs, _mapped
from gnnserve.errors import StoreFormatError

SHARED_LOG_ENV = "GNNSERVE_SHARED_LOG"  # "1" in a worker of a deployment that shares its log
APPEND_LOCK_AT = 1 << 62  # the appenders' lock: one byte far past any record
_FLOCK = struct.Struct("hhqqi4x")  # struct flock: type, whence, start, len, pid

TailRecord = tuple[int, Ops, int]  # (seq, operations, offset where the record ends)


def shares_log() -> bool:
    """True in a worker process whose update log other workers append to as well."""
    return os.environ.get(SHARED_LOG_ENV) == "1"


def hold_writer_lock(path: str | Path) -> int:
    """Create the log file if absent and take its writer lock for the caller's life (the
    supervisor's); the descriptor holding it. LogInUseError when a server already writes it."""
    path = Path(path)
    _make_dirs(path.parent)
    fd = os.open(path, os.O_RDONLY | os.O_CREAT, 0o644)
    try:
        _lock(fd, path)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _ofd_lock(fd: int, kind: int) -> None:
    request = _FLOCK.pack(kind, os.SEEK_SET, APPEND_LOCK_AT, 1, 0)
    fcntl.fcntl(fd, fcntl.F_OFD_SETLKW, request)


@contextmanager
def appending(log: UpdateLog) -> Iterator[None]:
    """Hold the append lock of the processes sharing ``log`` (waits for it)."""
    _ofd_lock(log.fileno(), fcntl.F_WRLCK)
    try:
        yield
    finally:
        _ofd_lock(log.fileno(), fcntl.F_UNLCK)


def read_tail(log: UpdateLog, offset: int, next_seq: int, locked: bool) -> list[TailRecord]:
    """The complete records from byte ``offset`` on, which must carry seqs ``next_seq``,
    ``next_seq + 1``, ... . Bytes after them are judged with the append lock held (``locked``:
    the caller holds it; else it is taken, which waits out an append in progress): a torn tail
    is cut off, corruption refused with StoreFormatError and the file left as it is."""
    if locked:  # no one appends or cuts the file meanwhile: it can be mapped
        with _mapped(log.path) as (buf, size):
            found, end = _records(buf, offset, size, next_seq)
            if end < size:
                last = next_seq + len(found) - 1
                scan = _classify(buf, LogScan(log.path, size, last + 1, last, end, "clean"))
                if scan.status == "corrupt":
                    raise StoreFormatError(scan.corruption_message(), "wal")
                log.truncate(end)
            return found
    size = os.stat(log.path).st_size
    with open(log.path, "rb") as fh:
        data = os.pread(fh.fileno(), max(size - offset, 0), offset)
    found, end = _records(data, 0, len(data), next_seq)
    if end < len(data):  # a record being appended, a torn tail or damage: judged under the lock
        with appending(log):
            return read_tail(log, offset, next_seq, locked=True)
    return [(seq, ops, offset + at) for seq, ops, at in found]


def _records(buf: Any, at: int, size: int, next_seq: int) -> tuple[list[TailRecord], int]:
    """The complete records of seqs ``next_seq``, ... in ``buf[at:size]`` (ending offsets in
    ``buf``) and where they end (at the first byte that is not the next of them)."""
    found: list[TailRecord] = []
    while at < size:
        record = decode_at(buf, at, size)
        if record is None or record[0][0] != next_seq + len(found):
            break
        (seq, ops), length = record
        at += length
        found.append((seq, ops, at))
    return found, at
