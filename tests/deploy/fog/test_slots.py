"""Testbed slots: deployments in separate processes hold separate slots (names, subnets,
cgroups); a SIGKILLed owner's leftovers are reclaimed by the next claim of its slot while a live
deployment's namespace, link and cgroup stay untouched."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator

import pytest

from gnnserve.deploy.fog.slots import SLOT_DIR, _named_for, claim_slot
from gnnserve.deploy.fog.testbed import CPU_ROOT, _run, probe

SUPPORT = probe()
pytestmark = pytest.mark.skipif(
    SUPPORT.netns is not None or SUPPORT.cpu_quota is not None,
    reason=f"testbed: {SUPPORT.netns or SUPPORT.cpu_quota}",
)

# a deployment in miniature: a slot, a device link and a CPU quota holding this process
OWNER = """
import sys
from gnnserve.deploy.fog.links import PRESETS, Link
from gnnserve.deploy.fog.slots import claim_slot
from gnnserve.deploy.fog.testbed import CpuQuota
slot = claim_slot()
link = Link(slot.index, 0, PRESETS["wifi"], netem=False)
quota = CpuQuota("node", 0.5, group=slot.cgroup_parent)
quota.add(__import__("os").getpid())
print(slot.index, link.ns, link.host_ip, flush=True)
sys.stdin.read()
link.close()
quota.close()
slot.release()
"""


def _start_owner() -> tuple[subprocess.Popen[str], int, str, str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", OWNER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    index, ns, host_ip = proc.stdout.readline().split()
    return proc, int(index), ns, host_ip


@pytest.fixture
def owners() -> Iterator[list[subprocess.Popen[str]]]:
    procs: list[subprocess.Popen[str]] = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            assert proc.stdin is not None
            proc.stdin.close()  # a clean stop: the owner removes its own resources
            proc.wait(timeout=30)


def _namespaces() -> str:
    return _run("ip", "netns", "list").stdout


def test_a_killed_owners_leftovers_are_reclaimed_and_a_live_one_kept(owners: list) -> None:
    first, dead, dead_ns, _ = _start_owner()
    owners.append(first)
    second, live, live_ns, live_ip = _start_owner()
    owners.append(second)
    assert dead != live  # two live deployments, two slots
    assert dead_ns in _namespaces() and live_ns in _namespaces()
    owner_file = (SLOT_DIR / f"slot-{live}.owner").read_text()
    assert f"pid {second.pid}" in owner_file

    os.kill(first.pid, signal.SIGKILL)  # no clean-up: its namespace, veth and cgroup stay
    first.wait(timeout=30)
    assert dead_ns in _namespaces() and (CPU_ROOT / f"gnnserve-fog/slot{dead}").is_dir()

    with claim_slot() as slot:  # the lowest free slot: the dead owner's
        assert slot.index == dead
        assert dead_ns not in _namespaces()
        assert not (CPU_ROOT / f"gnnserve-fog/slot{dead}").exists()
        # the live deployment is untouched: namespace, host address, cgroup with its process
        assert live_ns in _namespaces()
        assert live_ip in _run("ip", "-o", "addr", "show").stdout
        procs = (CPU_ROOT / f"gnnserve-fog/slot{live}/node/cgroup.procs").read_text().split()
        assert str(second.pid) in procs
    assert second.poll() is None


def test_slot_names_never_match_another_slot() -> None:
    names = ["gnf1d0", "gnh1d0", "gnb1", "gnf1f2", "gnf12d0", "gnb12", "gnh11f1", "gnfprobe7"]
    assert _named_for(1, names) == ["gnf1d0", "gnh1d0", "gnb1", "gnf1f2"]
    assert _named_for(12, names) == ["gnf12d0", "gnb12"]
