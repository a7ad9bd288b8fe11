"""A writer-preferring readers-writer lock whose read side may be released by another thread."""

from __future__ import annotations

import threading


class ReadWriteLock:
    """Many readers or one writer; a waiting writer holds off new readers (no starvation).

    Unlike ``threading.Lock`` it tracks counts, not owners, so a read taken by the sampling
    thread can be released by the fetch thread once the batch has read everything it needs.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._readers = 0
        self._writer = False
        self._writers_waiting = 0

    def acquire_read(self) -> None:
        """Block while a writer holds or waits for the lock."""
        with self._cond:
            while self._writer or self._writers_waiting:
                self._cond.wait()
            self._readers += 1

    def release_read(self) -> None:
        """End one read."""
        with self._cond:
            self._readers -= 1
            if self._readers == 0:
                self._cond.notify_all()

    def acquire_write(self) -> None:
        """Block until no reader or writer holds the lock."""
        with self._cond:
            self._writers_waiting += 1
            while self._writer or self._readers:
                self._cond.wait()
            self._writers_waiting -= 1
            self._writer = True

    def release_write(self) -> None:
        """End the write."""
        with self._cond:
            self._writer = False
            self._cond.notify_all()
