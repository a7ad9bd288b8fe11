"""Memory cgroups (v1) for function instances: a capacity enforced as Docker enforces one.

An instance process joins ``/sys/fs/cgroup/memory/<root>/<name>`` with ``memory.limit_in_bytes``
set to its capacity (and ``memory.memsw.limit_in_bytes`` where the kernel accounts swap, so swap
cannot absorb the excess). Past the limit the kernel reclaims, then OOM-kills the process, as a
FaaS platform kills a container over its memory. ``move_charge_at_immigrate`` is set, where the
kernel allows it, so pages the process already holds (the interpreter, torch) count against the
capacity too; elsewhere (``moves_charges`` False, as on this project's VM) only pages touched
after joining are charged, so callers size budgets from :attr:`MemoryCgroup.usage_bytes`.
"""

from __future__ import annotations

import contextlib
import os
import re
from pathlib import Path

from gnnserve.errors import InvalidInputError

MEMORY_ROOT = Path("/sys/fs/cgroup/memory")
_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
_MIN_LIMIT = 4 << 20  # below this the kernel kills before anything useful runs


def cgroup_support(root: str = "gnnserve") -> str | None:
    """None when memory cgroups can be made here; else why not (for logs and test skips)."""
    if not (MEMORY_ROOT / "memory.limit_in_bytes").is_file():
        if Path("/sys/fs/cgroup/cgroup.controllers").is_file():
            return "only cgroup v2 is mounted; gnnserve's instance limits use cgroup v1"
        return f"no cgroup v1 memory controller at {MEMORY_ROOT}"
    try:
        (MEMORY_ROOT / root).mkdir(exist_ok=True)
    except OSError as exc:
        return f"cannot create memory cgroups under {MEMORY_ROOT} ({exc.strerror}): run as root"
    return None


class MemoryCgroup:
    """A memory cgroup ``<root>/<name>`` limited to ``limit_bytes`` (created on construction)."""

    def __init__(self, name: str, limit_bytes: int, root: str = "gnnserve") -> None:
        if not _NAME.match(name) or set(name) <= {"."}:
            raise InvalidInputError(f"bad cgroup name {name!r}", "name")
        if isinstance(limit_bytes, bool) or not isinstance(limit_bytes, int):
            raise InvalidInputError(
                f"limit_bytes must be an int, got {limit_bytes!r}", "limit_bytes"
            )
        if limit_bytes < _MIN_LIMIT:
            raise InvalidInputError(
                f"limit_bytes must be >= {_MIN_LIMIT} (4 MiB), got {limit_bytes}", "limit_bytes"
            )
        reason = cgroup_support(root)
        if reason is not None:
            raise OSError(reason)
        self.path = MEMORY_ROOT / root / name
        self.moves_charges = True  # pages held before joining count against the limit
        self.path.mkdir(exist_ok=True)
        self._write("memory.limit_in_bytes", limit_bytes)
        if (self.path / "memory.memsw.limit_in_bytes").exists():
            self._write("memory.memsw.limit_in_bytes", limit_bytes)
        self._write("memory.swappiness", 0)
        try:
            self._write("memory.move_charge_at_immigrate", 3)
        except OSError:
            self.moves_charges = False  # kernels without it (EINVAL): only new pages count

    def _write(self, key: str, value: int) -> None:
        (self.path / key).write_text(str(value))

    def _read(self, key: str) -> str:
        return (self.path / key).read_text()

    def add(self, pid: int) -> None:
        """Move process ``pid`` into this cgroup."""
        try:
            self._write("cgroup.procs", pid)
        except ProcessLookupError:
            raise InvalidInputError(f"no process {pid}", "pid") from None

    @property
    def limit_bytes(self) -> int:
        """The enforced limit (the kernel rounds it down to whole pages)."""
        return int(self._read("memory.limit_in_bytes"))

    @property
    def usage_bytes(self) -> int:
        """Memory charged now."""
        return int(self._read("memory.usage_in_bytes"))

    @property
    def max_usage_bytes(self) -> int:
        """Peak memory charged since creation or :meth:`reset_peak`."""
        return int(self._read("memory.max_usage_in_bytes"))

    def reset_peak(self) -> None:
        """Restart peak tracking from the current usage."""
        self._write("memory.max_usage_in_bytes", 0)

    @property
    def failcnt(self) -> int:
        """How often usage hit the limit."""
        return int(self._read("memory.failcnt"))

    @property
    def oom_kills(self) -> int:
        """Processes the OOM killer killed in this cgroup (``oom_kill`` of memory.oom_control,
        kernels >= 4.13)."""
        for line in self._read("memory.oom_control").splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
        raise OSError("this kernel's memory.oom_control has no oom_kill counter")

    def pids(self) -> list[int]:
        """Processes in the cgroup."""
        return [int(p) for p in self._read("cgroup.procs").split()]

    def remove(self) -> None:
        """Move any remaining process to the parent, then delete the cgroup (idempotent)."""
        if not self.path.exists():
            return
        for pid in self.pids():
            with contextlib.suppress(ProcessLookupError):
                (self.path.parent / "cgroup.procs").write_text(str(pid))
        self.path.rmdir()

    def __enter__(self) -> MemoryCgroup:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()


def join_memory_cgroup(name: str, limit_bytes: int, root: str = "gnnserve") -> MemoryCgroup:
    """Put this process into a new memory cgroup ``name`` limited to ``limit_bytes``."""
    group = MemoryCgroup(name, limit_bytes, root)
    group.add(os.getpid())
    return group


def cleanup_stale(root: str = "gnnserve") -> int:
    """Remove the empty child cgroups under ``root`` (left by instances that died); returns how
    many were removed."""
    base = MEMORY_ROOT / root
    removed = 0
    if not base.is_dir():
        return 0
    for child in base.iterdir():
        if child.is_dir() and not (child / "cgroup.procs").read_text().split():
            try:
                child.rmdir()
                removed += 1
            except OSError:
                pass
    return removed
