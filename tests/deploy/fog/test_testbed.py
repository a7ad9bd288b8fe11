"""The testbed on the kernel's own mechanisms: a CPU quota slows a process by its share, a link
carries an upload at its tbf rate, and a device group in a link's namespace reaches its fog.
Skipped, with the reason, where the machine forbids cgroups or network namespaces."""

from __future__ import annotations

import subprocess
import sys
import time

import numpy as np
import pytest

from gnnserve.deploy.fog.devices import DeviceGroup
from gnnserve.deploy.fog.testbed import (
    CPU_ROOT,
    GROUP,
    PRESETS,
    CpuQuota,
    Link,
    LinkPreset,
    cloud_path,
    probe,
)
from gnnserve.deploy.fog.upload import Receiver
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


def test_presets_compose_as_a_path() -> None:
    assert PRESETS["4g"].then(PRESETS["wifi"]) == LinkPreset("4g+wifi", 10.0, 27.0)
    cloud = cloud_path("4g")  # Fograph: one fog cut 4G collection time by 64% against the cloud
    assert cloud.rate_mbit == pytest.approx(10.0 * 0.36) and cloud.delay_ms == 25.0 + 20.0


@pytest.mark.skipif(SUPPORT.netns is not None, reason=f"no network namespaces: {SUPPORT.netns}")
def test_uploads_over_a_link_take_its_rate() -> None:
    received = np.zeros((20_000, 32), np.float32)

    def apply(start: int, values: np.ndarray) -> None:
        received[start : start + values.shape[0]] = values

    values = np.random.default_rng(0).standard_normal(received.shape).astype(np.float32)
    with Link(201, LinkPreset("test", 20.0, 30.0), SUPPORT.netem) as link:
        receiver = Receiver(link.host_ip, apply)
        group = DeviceGroup(link.host_ip, receiver.port, None, link, chunks=4)
        try:
            start = time.perf_counter()
            group.start_round(1, values)
            receiver.wait(1, timeout_s=60)
            took = time.perf_counter() - start
            report = group.finish_round()
        finally:
            group.close()
            receiver.close()
    np.testing.assert_array_equal(received, values)
    ideal = report["bytes"] * 8 / 20e6 + 0.030  # 2.56 MB at 20 Mbit/s plus the delay
    assert 0.9 * ideal < took < 1.6 * ideal + 0.5  # + start-up of the device process
