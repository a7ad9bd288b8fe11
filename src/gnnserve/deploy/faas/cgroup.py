"""Memory cgroups for function instances: a capacity enforced as Docker enforces one.

An instance process joins ``<mount>/<root>/<name>`` whose limit is its capacity; past it the kernel
reclaims, then OOM-kills the process, as a FaaS platform kills a container over its memory.
cgroup v1 (the memory controller's own mount, used where it exists): ``memory.limit_in_bytes``,
``memory.memsw.limit_in_bytes`` = the same value where the kernel accounts swap (so swap cannot
absorb the excess) and ``memory.swappiness`` 0. cgroup v2 (unified mount with the memory
controller): ``memory.max`` and ``memory.swap.max`` 0. The OOM killer stays enabled.

v1 only: ``move_charge_at_immigrate`` is set where the kernel allows it, so pages a process already
holds count against the capacity too; elsewhere (``moves_charges`` False: v2 always, and recent
v1 kernels) only pages touched after joining are charged, so callers size budgets from
:attr:`MemoryCgroup.usage_bytes`.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import time
from pathlib import Path

from gnnserve.errors import InvalidInputError
from gnnserve.tempdirs import owner_alive

MIN_LIMIT_BYTES = 4 << 20  # below this the kernel kills before anything useful runs
MAX_LIMIT_BYTES = (1 << 63) - 1  # larger values the kernel clamps silently (or refuses)
_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
_DENIED = (errno.EACCES, errno.EPERM, errno.EROFS)


def _mounts() -> tuple[Path | None, Path | None]:
    """(the cgroup v1 memory controller's mount, the cgroup2 mount), each None when absent."""
    v1 = v2 = None
    with open("/proc/self/mounts") as f:
        for line in f:
            _, where, fstype, options, *_ = line.split()
            if fstype == "cgroup" and "memory" in options.split(",") and v1 is None:
                v1 = Path(where)
            elif fstype == "cgroup2" and v2 is None:
                v2 = Path(where)
    return v1, v2


def _check_name(value: object, field: str) -> str:
    """One path component: letters, digits, ``_ . -``; not starting with a dot."""
    if not isinstance(value, str) or not _NAME.match(value):
        raise InvalidInputError(
            f"{field} must be 1-128 letters, digits, '_', '.' or '-' not starting with '.' "
            f"(no '/'), got {value!r}",
            field,
        )
    return value


def _check_root(root: object) -> str:
    """``root``: one or more valid names joined by '/' (a relative path under the mount)."""
    if not isinstance(root, str) or not root:
        raise InvalidInputError(f"root must be a relative cgroup path, got {root!r}", "root")
    for part in root.split("/"):
        _check_name(part, "root")
    return root


def _locate(root: str) -> tuple[int, Path]:
    """(cgroup version, the directory ``root`` maps to), creating it (OSError when refused)."""
    v1, v2 = _mounts()
    if v1 is not None:
        base = v1 / root
        base.mkdir(parents=True, exist_ok=True)
        return 1, base
    if v2 is not None and "memory" in (v2 / "cgroup.controllers").read_text().split():
        base = v2
        for part in [*root.split("/"), ""]:  # each level hands the memory controller down
            control = base / "cgroup.subtree_control"
            if "memory" not in control.read_text().split():
                control.write_text("+memory")
            if part:
                base = base / part
                base.mkdir(exist_ok=True)
        return 2, base
    if v2 is not None:
        raise OSError(f"only cgroup v2 is mounted ({v2}), without the memory controller")
    raise OSError("no cgroup filesystem with a memory controller is mounted")


def cgroup_support(root: str = "gnnserve") -> str | None:
    """None when memory cgroups can be made under ``root`` here; else why not (for logs and test
    skips). Creates ``root`` as a side effect."""
    _check_root(root)
    try:
        _locate(root)
    except OSError as exc:
        hint = " (needs root and a rw mount)" if exc.errno in _DENIED else ""
        return f"cannot create memory cgroups under {root!r}: {exc.strerror or exc}{hint}"
    return None


class _Files:
    """One cgroup's control files; subclasses name them for a cgroup version."""

    limit_file = usage_file = peak_file = ""

    def __init__(self, path: Path) -> None:
        self.path = path

    def read(self, key: str) -> str:
        return (self.path / key).read_text()

    def write(self, key: str, value: int | str) -> None:
        (self.path / key).write_text(str(value))

    def counter(self, key: str, name: str) -> int | None:
        """The ``name value`` line of flat-keyed file ``key`` (None when it has none)."""
        for line in self.read(key).splitlines():
            k, _, v = line.partition(" ")
            if k == name:
                return int(v)
        return None

    def peak(self) -> int:
        return int(self.read(self.peak_file))

    def escape(self) -> Path:
        """Where remaining processes go before the cgroup is removed."""
        return self.path.parent

    def close(self) -> None:
        pass


class _V1(_Files):
    limit_file = "memory.limit_in_bytes"
    usage_file = "memory.usage_in_bytes"
    peak_file = "memory.max_usage_in_bytes"

    def configure(self, limit: int) -> bool:
        """Set the limit (memory and memory+swap); returns whether charges move with a process."""
        memsw = (self.path / "memory.memsw.limit_in_bytes").exists()
        if memsw:  # memsw must stay >= the limit at every step, also for a reused group
            self.write("memory.memsw.limit_in_bytes", -1)
        self.write(self.limit_file, limit)
        if memsw:
            self.write("memory.memsw.limit_in_bytes", limit)
        with contextlib.suppress(OSError):  # refused by some old kernels; memsw still holds
            self.write("memory.swappiness", 0)
        self.write("memory.oom_control", 0)  # OOM killer enabled
        try:
            self.write("memory.move_charge_at_immigrate", 3)
        except OSError:  # EINVAL where deprecated: only pages touched after joining count
            return False
        return True

    def reset_peak(self) -> None:
        self.write(self.peak_file, 0)

    def failcnt(self) -> int:
        # with memsw accounted the memory+swap counter is charged first and refuses first
        keys = ["memory.failcnt", "memory.memsw.failcnt"]
        return sum(int(self.read(k)) for k in keys if (self.path / k).exists())

    def oom_kills(self) -> int | None:
        return self.counter("memory.oom_control", "oom_kill")  # kernels >= 4.13


class _V2(_Files):
    limit_file = "memory.max"
    usage_file = "memory.current"
    peak_file = "memory.peak"  # kernels >= 5.19
    _peak_fd: int | None = None

    def configure(self, limit: int) -> bool:
        self.write(self.limit_file, limit)
        if (self.path / "memory.swap.max").exists():
            self.write("memory.swap.max", 0)
        return False  # v2 never moves charges with a process

    def reset_peak(self) -> None:
        # the reset (kernels >= 6.12) holds only for reads through the same file descriptor
        if self._peak_fd is None:
            self._peak_fd = os.open(self.path / self.peak_file, os.O_RDWR | os.O_CLOEXEC)
        os.write(self._peak_fd, b"reset")

    def peak(self) -> int:
        if self._peak_fd is None:
            return super().peak()
        return int(os.pread(self._peak_fd, 64, 0))

    def failcnt(self) -> int:
        return self.counter("memory.events", "max") or 0  # times usage ran into memory.max

    def oom_kills(self) -> int | None:
        return self.counter("memory.events", "oom_kill")

    def escape(self) -> Path:
        # no internal processes: the parent hands memory down, so only the mount root may hold them
        path = self.path
        while (path.parent / "cgroup.procs").exists():
            path = path.parent
        return path

    def close(self) -> None:
        if self._peak_fd is not None:
            os.close(self._peak_fd)
            self._peak_fd = None


class OomEvents:
    """Counts OOM events of a v1 memory cgroup through an eventfd registered on its
    ``memory.oom_control`` (the notification API every v1 kernel has). With the OOM killer on,
    each event selects a victim, so this is the kill count on kernels whose ``oom_control`` has
    no ``oom_kill`` line (an event that finds its victim already dying counts too)."""

    def __init__(self, path: Path) -> None:
        self._control = os.open(path / "memory.oom_control", os.O_RDONLY | os.O_CLOEXEC)
        self._event = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        (path / "cgroup.event_control").write_text(f"{self._event} {self._control}")
        self._count = 0

    def count(self) -> int:
        """OOM events since construction."""
        with contextlib.suppress(BlockingIOError):
            self._count += os.eventfd_read(self._event)
        return self._count

    def close(self) -> None:
        os.close(self._event)
        os.close(self._control)


class MemoryCgroup:
    """A memory cgroup ``<root>/<name>`` limited to ``limit_bytes`` (created on construction;
    an existing one of that name is reused and reconfigured).

    ``version`` is 1 or 2, ``path`` its directory. Raises InvalidInputError for a bad name, root,
    or limit (outside [MIN_LIMIT_BYTES, MAX_LIMIT_BYTES], or refused by the kernel), OSError when
    cgroups cannot be made here (:func:`cgroup_support` says why).
    """

    def __init__(self, name: str, limit_bytes: int, root: str = "gnnserve") -> None:
        _check_name(name, "name")
        _check_root(root)
        if isinstance(limit_bytes, bool) or not isinstance(limit_bytes, int):
            raise InvalidInputError(
                f"limit_bytes must be an int, got {limit_bytes!r}", "limit_bytes"
            )
        if not MIN_LIMIT_BYTES <= limit_bytes <= MAX_LIMIT_BYTES:
            raise InvalidInputError(
                f"limit_bytes must be in [{MIN_LIMIT_BYTES}, {MAX_LIMIT_BYTES}] (4 MiB up), "
                f"got {limit_bytes}",
                "limit_bytes",
            )
        self.version, base = _locate(root)
        self.path = base / name
        if self.path.exists() and not self.path.is_dir():  # e.g. name "memory.stat"
            raise InvalidInputError(f"name {name!r} is a control file of {base}", "name")
        created = not self.path.exists()
        self.path.mkdir(exist_ok=True)
        self._files: _V1 | _V2 = _V1(self.path) if self.version == 1 else _V2(self.path)
        try:
            self.moves_charges = self._files.configure(limit_bytes)
        except OSError as exc:
            if created:
                with contextlib.suppress(OSError):
                    self.path.rmdir()
            raise InvalidInputError(
                f"the kernel refused limit_bytes={limit_bytes} for {self.path}: {exc.strerror}",
                "limit_bytes",
            ) from None
        self._events: OomEvents | None = None
        if self._files.oom_kills() is None and self.version == 1:  # kernels < 4.13
            self._events = OomEvents(self.path)

    def add(self, pid: int) -> None:
        """Move process ``pid`` (all its threads) into this cgroup; InvalidInputError (field
        ``pid``) when no such process exists."""
        if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0:
            raise InvalidInputError(f"pid must be a positive int, got {pid!r}", "pid")
        try:
            self._files.write("cgroup.procs", pid)
        except OSError as exc:
            if exc.errno not in (errno.ESRCH, errno.EINVAL):  # EINVAL: past the kernel's pid_max
                raise
            raise InvalidInputError(f"no process {pid}", "pid") from None

    @property
    def limit_bytes(self) -> int:
        """The enforced limit, bytes (the kernel rounds the written one down to whole pages)."""
        return int(self._files.read(self._files.limit_file))

    @property
    def usage_bytes(self) -> int:
        """Memory charged now, bytes (anonymous and page cache)."""
        return int(self._files.read(self._files.usage_file))

    @property
    def max_usage_bytes(self) -> int:
        """Peak memory charged since creation or :meth:`reset_peak`, bytes."""
        return self._files.peak()

    def reset_peak(self) -> None:
        """Restart peak tracking from the current usage (v2: needs kernel >= 6.12)."""
        self._files.reset_peak()

    @property
    def failcnt(self) -> int:
        """How often a charge ran into the limit (v1: ``memory.failcnt`` + ``memory.memsw.failcnt``;
        v2: ``memory.events`` ``max``). With swap accounted, v1 refuses at memory+swap first, and
        kernels >= 6.13 do not count those refusals: there it stays 0 (see :attr:`oom_kills`)."""
        return self._files.failcnt()

    @property
    def oom_kills(self) -> int:
        """Processes the kernel OOM-killed in this cgroup (``oom_kill`` of v1
        ``memory.oom_control`` or v2 ``memory.events``; on v1 kernels without it, the OOM events
        counted by :class:`OomEvents` since construction)."""
        if self._events is not None:
            return self._events.count()
        return self._files.oom_kills() or 0

    def pids(self) -> list[int]:
        """Processes in the cgroup, ascending."""
        return sorted({int(p) for p in self._files.read("cgroup.procs").split()})

    def remove(self, timeout_s: float = 2.0) -> None:
        """Move any remaining process out (v1: to the parent; v2: to the mount root), then delete
        the cgroup. Idempotent. Retries for ``timeout_s`` while exiting processes keep it busy."""
        if self._events is not None:
            self._events.close()
            self._events = None
        self._files.close()
        deadline = time.monotonic() + timeout_s
        while self.path.exists():
            target = self._files.escape() / "cgroup.procs"
            for pid in self.pids():
                with contextlib.suppress(ProcessLookupError):
                    target.write_text(str(pid))
            try:
                self.path.rmdir()
            except FileNotFoundError:
                return
            except OSError as exc:
                if exc.errno != errno.EBUSY or time.monotonic() > deadline:
                    raise
                time.sleep(0.01)

    def __enter__(self) -> MemoryCgroup:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()


def join_memory_cgroup(name: str, limit_bytes: int, root: str = "gnnserve") -> MemoryCgroup:
    """Put this process (``os.getpid()``) into a new memory cgroup ``name`` limited to
    ``limit_bytes``."""
    group = MemoryCgroup(name, limit_bytes, root)
    group.add(os.getpid())
    return group


def cleanup_stale(root: str = "gnnserve", owner: str | None = None) -> int:
    """Remove the empty cgroups below ``root`` (left by instances that died or crashed runs),
    deepest first; returns how many were removed. Busy ones (with processes) stay, and so do
    those named for a live service (``p<pid>-<id>-...`` with that PID alive, other than
    ``owner``, the calling service's tag): another deployment may have made one a moment
    before its instance joins it."""
    _check_root(root)
    v1, v2 = _mounts()
    mount = v1 if v1 is not None else v2
    base = mount / root if mount is not None else None
    if base is None or not base.is_dir():
        return 0
    removed = 0
    for child in sorted((p for p in base.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
        if _live_others(child.relative_to(base).parts[0], owner):
            continue
        with contextlib.suppress(OSError):  # gone meanwhile, busy (a process joined) or not empty
            if not (child / "cgroup.procs").read_text().split():
                child.rmdir()
                removed += 1
    return removed


def _live_others(name: str, owner: str | None) -> bool:
    """Whether group ``name`` belongs to a live FaaS service other than ``owner``."""
    mine = owner is not None and name.startswith(f"{owner}-")
    return not mine and owner_alive(name)  # a FaaS service's tag opens its groups' names
