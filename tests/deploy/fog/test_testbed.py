"""Node speed on the kernel's own mechanism: a cgroup v1 CPU quota slows a process by its share.
Skipped, with the reason, where the machine forbids cgroups."""

from __future__ import annotations

import subprocess
import sys

import pytest

from gnnserve.deploy.fog.testbed import CPU_ROOT, GROUP, CpuQuota, probe
from gnnserve.errors import InvalidInputError

SUPPORT = probe()
BUSY = (
    "import time\nt = time.perf_counter(); n = 0\n"
    "while time.perf_counter() - t < 1.5: n += 1\nprint(n)"
)


def _spins(quota: CpuQuota | None) -> int:
    """Loop iterations a fresh process manages in 1.5 s (in ``quota`` when given)."""
    proc = subprocess.Popen([sys.executable, "-c", BUSY], stdout=subprocess.PIPE, text=True)
    if quota is not None:
        quota.add(proc.pid)
    return int(proc.communicate(timeout=60)[0])


@pytest.mark.skipif(SUPPORT.cpu_quota is not None, reason=f"no CPU quota: {SUPPORT.cpu_quota}")
def test_a_cpu_quota_slows_a_process_by_its_share() -> None:
    free = _spins(None)
    with CpuQuota("test_quota", 0.25) as quota:
        limited = _spins(quota)
        quota.set_cores(0.5)
        half = _spins(quota)
    assert 0.15 < limited / free < 0.35
    assert 0.35 < half / free < 0.65
    with pytest.raises(InvalidInputError, match="cores"):
        CpuQuota("test_quota2", 0.0)
    assert not (CPU_ROOT / GROUP / "test_quota2").exists()  # a refused quota leaves nothing
