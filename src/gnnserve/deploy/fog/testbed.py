"""A heterogeneous fog testbed on one machine, built from the kernel's own mechanisms: what the
machine allows (:func:`probe`) and node speed.

- **Node speed**: a cgroup v1 CPU quota per fog node process (``cpu.cfs_quota_us`` over
  ``cpu.cfs_period_us``, as container runtimes set ``--cpus``): :class:`CpuQuota`. Changing the
  quota mid-run is a background-load change.
- **Links** (device -> fog, fog <-> fog, the cloud's path) are in :mod:`.links`.

Everything here needs root; ``probe`` reports what is missing and tests skip with that reason.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from gnnserve.errors import GnnServeError, InvalidInputError

CPU_ROOT = Path("/sys/fs/cgroup/cpu")  # cgroup v1 cpu controller mount
GROUP = "gnnserve-fog"  # parent cgroup of every fog node's
MIN_QUOTA_US = 1_000  # the kernel's smallest quota per period


def period_us(cores: float) -> int:
    """CFS period for a ``cores`` quota: the shortest whose quota is at least 1 ms."""
    return max(MIN_QUOTA_US, int(-(-MIN_QUOTA_US // cores)))


class TestbedError(GnnServeError):
    """The machine cannot build this part of the testbed (not root, no cgroup, no netns)."""


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)


def _must(*argv: str) -> None:
    done = _run(*argv)
    if done.returncode != 0:
        raise TestbedError(f"`{' '.join(argv)}` failed: {done.stderr.strip()}")


@dataclass(frozen=True)
class Support:
    """What this machine allows: a reason per missing part (None: available)."""

    cpu_quota: str | None
    netns: str | None
    netem: bool  # tc netem present (else the sender adds the delay)


def probe() -> Support:
    """Check root, the cgroup v1 cpu controller, ``ip netns`` + ``tc tbf`` and ``tc netem``."""
    root = None if os.geteuid() == 0 else "needs root"
    cpu = root or (None if (CPU_ROOT / "cpu.cfs_quota_us").exists() else f"no {CPU_ROOT}")
    netns = root or (None if shutil.which("ip") and shutil.which("tc") else "no ip/tc tools")
    netem = False
    if netns is None:
        name = f"gnfprobe{os.getpid()}"
        if _run("ip", "netns", "add", name).returncode != 0:
            netns = "ip netns add is not permitted"
        else:
            try:
                tbf = ("tbf", "rate", "1mbit", "burst", "32kb", "latency", "50ms")
                if _run(
                    "ip", "netns", "exec", name, "tc", "qdisc", "add", "dev", "lo", "root", *tbf
                ).returncode:
                    netns = "tc tbf is not available"
                _run("ip", "netns", "exec", name, "tc", "qdisc", "del", "dev", "lo", "root")
                add = ("tc", "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms")
                netem = _run("ip", "netns", "exec", name, *add).returncode == 0
            finally:
                _run("ip", "netns", "del", name)
    return Support(cpu, netns, netem)


def _check_cores(cores: float) -> None:
    if not 0.01 <= cores <= 1024:
        raise InvalidInputError(f"cores must lie in [0.01, 1024], got {cores}", "cores")


def remove_cpu_group(path: Path, timeout_s: float = 10.0) -> None:
    """Move the processes of cgroup ``path`` back to the root group and remove it (retrying
    while a process that is being killed still holds it)."""
    deadline = time.monotonic() + timeout_s
    while True:
        for pid in (path / "cgroup.procs").read_text().split():
            with contextlib.suppress(OSError):  # exited meanwhile
                (CPU_ROOT / "cgroup.procs").write_text(pid)
        try:
            path.rmdir()
            return
        except OSError as exc:
            if exc.errno != errno.EBUSY or time.monotonic() > deadline:
                raise TestbedError(f"cannot remove cgroup {path}: {exc}") from exc
            time.sleep(0.05)


class CpuQuota:
    """A cgroup v1 CPU quota of ``cores`` CPUs for the processes added to it, named ``name``
    under ``group``."""

    def __init__(self, name: str, cores: float, group: str = GROUP) -> None:
        if not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}", name):
            raise InvalidInputError(
                f"cgroup name must be letters, digits, '_', '.' or '-', got {name!r}", "name"
            )
        _check_cores(cores)  # before the group exists: a refused quota leaves nothing behind
        self.path = CPU_ROOT / group / name
        self.path.mkdir(parents=True, exist_ok=True)
        self.set_cores(cores)

    def set_cores(self, cores: float) -> None:
        """Limit the group to ``cores`` CPUs (a fraction slows it; takes effect at once).

        The period is short (the kernel's 1 ms minimum quota per period): with Docker's 100 ms
        a 0.3-core node would run a 20 ms round at full speed from its 30 ms slice, so rounds
        of a few ms would show no heterogeneity at all."""
        _check_cores(cores)
        self.cores = float(cores)
        period = period_us(cores)
        (self.path / "cpu.cfs_period_us").write_text(str(period))
        (self.path / "cpu.cfs_quota_us").write_text(str(int(round(cores * period))))

    def add(self, pid: int) -> None:
        """Move process ``pid`` (all its threads) into the group."""
        (self.path / "cgroup.procs").write_text(str(int(pid)))

    def close(self, timeout_s: float = 10.0) -> None:
        """Move the group's processes back to the root group and remove it."""
        remove_cpu_group(self.path, timeout_s)

    def __enter__(self) -> CpuQuota:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
