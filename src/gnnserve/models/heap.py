"""Give the C heap's free pages back after a burst of traffic (glibc ``malloc_trim``).

A forward's activations are freed when it ends, but glibc keeps the pages in the heap of the
thread that ran it (one heap per thread): a server of two 3x2048 models held ~24 MB more after
traffic than once ready, for as long as it ran. :class:`IdleHeapTrimmer` trims once the process
has run no forward for ``idle_s`` after running some, so the hot path pays nothing and an idle
server holds what its models and graph need.
"""

from __future__ import annotations

import ctypes
import threading
import time
from pathlib import Path

import torch

from gnnserve.models.checkpoint import release_freed_heap
from gnnserve.models.runner import forwards_run


def _mkl_free_buffers() -> None:
    """Free the buffers MKL's memory manager keeps (per thread that ran a GEMM), where torch
    links MKL; nothing elsewhere."""
    try:
        lib = ctypes.CDLL(str(Path(torch.__file__).parent / "lib" / "libtorch_cpu.so"))
        lib.mkl_serv_free_buffers()
    except (OSError, AttributeError):
        pass


class IdleHeapTrimmer:
    """A daemon thread: ``malloc_trim`` once forwards ran and then none for ``idle_s`` seconds."""

    def __init__(self, idle_s: float = 1.0) -> None:
        self.idle_s = idle_s
        self.trims = 0  # how many times it gave pages back
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="heap-trimmer", daemon=True)

    def start(self) -> IdleHeapTrimmer:
        """Start watching; returns self."""
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the thread (waits for it)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(5)

    def _run(self) -> None:
        trimmed = seen = forwards_run()
        quiet_since = time.monotonic()
        while not self._stop.wait(self.idle_s / 4):
            now, count = time.monotonic(), forwards_run()
            if count != seen:
                seen, quiet_since = count, now
            elif count != trimmed and now - quiet_since >= self.idle_s:
                _mkl_free_buffers()
                release_freed_heap()
                trimmed, self.trims = count, self.trims + 1
