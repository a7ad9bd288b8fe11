"""Peak resident-memory measurement of this process: the kernel's high-water mark (Linux).

:func:`peak_memory` trims the heap, resets ``VmHWM`` to the current resident set through
``/proc/self/clear_refs`` and reads it back after running a function: the peak increase the
function caused. glibc's mmap threshold is fixed (:func:`configure_malloc`) so that freed tensors
leave the resident set at once and measurements do not mask each other.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from gnnserve.errors import GnnServeError

T = TypeVar("T")

CLEAR_REFS = Path("/proc/self/clear_refs")  # write "5": reset this process's VmHWM to VmRSS
STATUS = Path("/proc/self/status")
M_MMAP_THRESHOLD = -3  # glibc mallopt parameter
MMAP_THRESHOLD_BYTES = 64 * 1024
_FIELD = "memory"


class PeakMemoryUnavailableError(GnnServeError):
    """This system cannot reset the kernel's resident-memory high-water mark (not Linux, no
    /proc, or /proc/self/clear_refs not writable), so peak memory cannot be measured."""

    kind = "peak_memory_unavailable"


@functools.cache
def _glibc() -> ctypes.CDLL | None:
    """glibc, with its mmap threshold fixed (see :func:`configure_malloc`); None elsewhere."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        if not libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES):
            return None
        return libc
    except (OSError, AttributeError):
        return None


def configure_malloc() -> bool:
    """Fix glibc's mmap threshold at 64 KiB (once per process); False where libc is not glibc.

    glibc raises its threshold each time an mmapped block is freed (up to 32 MiB), after which
    blocks of that size come from the heap and stay resident once freed: a request's peak would
    hide in pages an earlier one left, and an evicted cache slab would not give its memory back.
    A fixed threshold keeps every block over 64 KiB mmapped, and unmapped when freed.
    """
    return _glibc() is not None


def _trim() -> None:
    """Give free heap pages back to the OS (glibc ``malloc_trim(0)``), where glibc is present."""
    libc = _glibc()
    if libc is not None:
        libc.malloc_trim(0)


def _status_bytes(key: str) -> int:
    try:
        with open(STATUS) as fh:
            for line in fh:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024  # kB
    except OSError as exc:
        raise PeakMemoryUnavailableError(f"cannot read {STATUS}: {exc}", _FIELD) from exc
    raise PeakMemoryUnavailableError(f"{STATUS} has no {key} line", _FIELD)


def resident_bytes() -> int:
    """This process's resident memory now (VmRSS), bytes."""
    return _status_bytes("VmRSS")


def peak_memory(fn: Callable[[], T]) -> tuple[T, int]:
    """``(fn(), peak)``: peak is the largest resident-memory increase of this process while
    ``fn`` ran, in bytes (>= 0; process-wide: other threads' allocations count too).

    Trims the heap, resets the high-water mark, reads VmRSS, runs ``fn``, reads VmHWM.
    PeakMemoryUnavailableError where the mark cannot be reset.
    """
    _trim()
    try:
        with open(CLEAR_REFS, "w") as fh:
            fh.write("5")
    except OSError as exc:
        raise PeakMemoryUnavailableError(
            f"cannot reset the resident-memory high-water mark: writing {CLEAR_REFS} failed "
            f"({exc.strerror or exc}); peak memory is measured on Linux >= 4.0 with /proc",
            _FIELD,
        ) from exc
    before = resident_bytes()
    result = fn()
    return result, max(0, _status_bytes("VmHWM") - before)
