"""Memory cgroups: limits as written, a process over its limit is OOM-killed, one under it runs."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from gnnserve.deploy.faas.cgroup import MemoryCgroup, cgroup_support, cleanup_stale
from gnnserve.errors import InvalidInputError

reason = cgroup_support("gnnserve-test")
pytestmark = pytest.mark.skipif(reason is not None, reason=str(reason))
ROOT = "gnnserve-test"
_ALLOC = (
    "import sys, time; b = bytearray({n} << 20); sys.stdout.write('ok'); sys.stdout.flush(); "
    "time.sleep({sleep})"
)


def _child(mb: int, sleep: float = 0.0) -> subprocess.Popen[str]:
    """A python process that waits for its cgroup, then allocates and touches ``mb`` MiB."""
    code = "import sys; sys.stdin.readline(); " + _ALLOC.format(n=mb, sleep=sleep)
    return subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )


def _run_in(group: MemoryCgroup, mb: int) -> tuple[int, str]:
    proc = _child(mb)
    group.add(proc.pid)
    out, _ = proc.communicate("go\n", timeout=60)
    return proc.returncode, out


def test_limit_reads_back_page_rounded() -> None:
    with MemoryCgroup(f"t{os.getpid()}a", (64 << 20) + 100, root=ROOT) as group:
        assert group.limit_bytes == (64 << 20) + 100 - ((64 << 20) + 100) % os.sysconf(
            "SC_PAGE_SIZE"
        )
        assert group.pids() == []
        path = group.path
    assert not path.exists()


def test_process_over_the_limit_is_oom_killed() -> None:
    with MemoryCgroup(f"t{os.getpid()}b", 64 << 20, root=ROOT) as group:
        code, out = _run_in(group, 200)
        assert code == -9 and out == ""
        assert group.oom_kills >= 1


def test_process_under_the_limit_completes_and_its_peak_is_charged() -> None:
    with MemoryCgroup(f"t{os.getpid()}c", 256 << 20, root=ROOT) as group:
        code, out = _run_in(group, 100)
        assert (code, out) == (0, "ok")
        assert 100 << 20 <= group.max_usage_bytes < 200 << 20
        assert group.oom_kills == 0


def test_cleanup_stale_removes_empty_groups() -> None:
    group = MemoryCgroup(f"t{os.getpid()}d", 64 << 20, root=ROOT)
    assert cleanup_stale(ROOT) >= 1
    assert not group.path.exists()
    group.remove()  # idempotent


def test_bad_inputs() -> None:
    with pytest.raises(InvalidInputError, match="name"):
        MemoryCgroup("a/b", 64 << 20, root=ROOT)
    with pytest.raises(InvalidInputError, match="limit_bytes"):
        MemoryCgroup("ok", 1024, root=ROOT)
    with MemoryCgroup(f"t{os.getpid()}e", 64 << 20, root=ROOT) as group:
        dead = subprocess.Popen([sys.executable, "-c", "pass"])
        dead.wait()
        time.sleep(0.05)
        with pytest.raises(InvalidInputError, match="no process"):
            group.add(dead.pid)
