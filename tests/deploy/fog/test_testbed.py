"""Node speed on the kernel's own mechanism: a cgroup v1 CPU quota slows a process by its share.
Skipped, with the reason, where the machine forbids cgroups."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from gnnserve.deploy.fog.testbed import CPU_ROOT, GROUP, CpuQuota, probe
from gnnserve.errors import InvalidInputError

SUPPORT = probe()
# Waits for "go" (sent once the process is in its group), then spins for 1.5 s of wall time and
# prints the CPU time the kernel accounted to it meanwhile and the wall time, in seconds.
BUSY = (
    "import sys, time\nsys.stdin.readline()\n"
    "w, c = time.monotonic(), time.process_time()\n"
    "while time.monotonic() - w < 1.5: pass\n"
    "print(time.process_time() - c, time.monotonic() - w)"
)


def _cpu_share(quota: CpuQuota) -> float:
    """CPU seconds per wall second of a busy process in ``quota`` (the kernel's accounting)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", BUSY], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    quota.add(proc.pid)
    cpu, wall = (float(v) for v in proc.communicate("go\n", timeout=60)[0].split())
    return cpu / wall


def _throttled(quota: CpuQuota) -> int:
    """Periods in which the kernel throttled the group (cgroup v1 ``cpu.stat``)."""
    stat = dict(line.split() for line in (quota.path / "cpu.stat").read_text().splitlines())
    return int(stat["nr_throttled"])


@pytest.mark.skipif(SUPPORT.cpu_quota is not None, reason=f"no CPU quota: {SUPPORT.cpu_quota}")
def test_a_cpu_quota_caps_what_the_kernel_gives_a_process() -> None:
    """The kernel never gives a process in the group more than its quota: CPU time over wall
    time stays within the quota (plus the kernel's accounting slack), and the group's throttle
    counter rises. A busy machine only lowers the share, so this holds under load too."""
    name = f"test_quota_{os.getpid()}"
    with CpuQuota(name, 0.25) as quota:
        assert _throttled(quota) == 0
        assert _cpu_share(quota) <= 0.25 * 1.1 + 0.01
        after_quarter = _throttled(quota)
        assert after_quarter > 0
        quota.set_cores(0.5)
        assert _cpu_share(quota) <= 0.5 * 1.1 + 0.01
        assert _throttled(quota) > after_quarter
    assert not (CPU_ROOT / GROUP / name).exists()  # closing removes the group
    with pytest.raises(InvalidInputError, match="cores"):
        CpuQuota(f"{name}_2", 0.0)
    assert not (CPU_ROOT / GROUP / f"{name}_2").exists()  # a refused quota leaves nothing
