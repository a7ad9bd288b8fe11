"""Memory cgroups on the real kernel: limits as written, a process over its limit is OOM-killed,
one under it runs and its peak is charged, removal and stale clean-up, typed errors."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gnnserve.deploy.faas.cgroup import (
    MemoryCgroup,
    OomEvents,
    cgroup_support,
    cleanup_stale,
)
from gnnserve.errors import InvalidInputError

ROOT = f"gnnserve-test/p{os.getpid()}"  # per process: cleanup_stale must not touch others' groups
reason = cgroup_support("gnnserve-test")
pytestmark = pytest.mark.skipif(reason is not None, reason=str(reason))
PAGE = os.sysconf("SC_PAGE_SIZE")
MiB = 1 << 20
# waits for a line (sent once it is in the cgroup), then allocates and touches every page
_CHILD = (
    "import sys, time; sys.stdin.readline(); b = bytearray({n}); b[::{page}] = b'x' * "
    "len(range(0, {n}, {page})); sys.stdout.write('ok'); sys.stdout.flush(); time.sleep({sleep})"
)


@pytest.fixture(autouse=True, scope="module")
def _own_root() -> Iterator[None]:
    """Removes this process's ROOT (and anything a failed test left in it) at the end."""
    probe = MemoryCgroup("probe", 64 * MiB, root=ROOT)
    probe.remove()
    yield
    cleanup_stale(ROOT)
    probe.path.parent.rmdir()


def _child(n_bytes: int, sleep: float = 0.0) -> subprocess.Popen[str]:
    code = _CHILD.format(n=n_bytes, page=PAGE, sleep=sleep)
    return subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )


def _run_in(group: MemoryCgroup, n_bytes: int) -> tuple[int, str]:
    proc = _child(n_bytes)
    group.add(proc.pid)
    assert group.pids() == [proc.pid]
    out, _ = proc.communicate("go\n", timeout=30)
    return proc.returncode, out


def _memory_cgroup_of(pid: int) -> str:
    """The process's memory cgroup path as the kernel reports it (/proc/<pid>/cgroup)."""
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(",") or controllers == "":
            return path
    raise AssertionError("no memory cgroup line")


def test_limits_read_back_page_rounded() -> None:
    limit = 64 * MiB + 100
    with MemoryCgroup("limits", limit, root=ROOT) as group:
        rounded = limit - limit % PAGE
        assert group.limit_bytes == rounded
        if group.version == 1:
            assert int((group.path / "memory.limit_in_bytes").read_text()) == rounded
            if (group.path / "memory.memsw.limit_in_bytes").exists():
                assert int((group.path / "memory.memsw.limit_in_bytes").read_text()) == rounded
            assert int((group.path / "memory.swappiness").read_text()) == 0
            assert "oom_kill_disable 0" in (group.path / "memory.oom_control").read_text()
        else:
            assert int((group.path / "memory.max").read_text()) == rounded
        assert group.pids() == [] and group.usage_bytes == 0
        path = group.path
    assert not path.exists()


def test_process_over_the_limit_is_oom_killed() -> None:
    with MemoryCgroup("over", 64 * MiB, root=ROOT) as group:
        events = OomEvents(group.path) if group.version == 1 else None
        code, out = _run_in(group, 200 * MiB)
        assert (code, out) == (-9, "")
        assert group.oom_kills >= 1
        assert group.max_usage_bytes == group.limit_bytes  # it ran into the limit
        if events is not None:  # the fallback counter for kernels without oom_kill sees it too
            assert events.count() >= 1
            events.close()
        path = group.path
    assert not path.exists()  # remove() after the process exited


def test_failcnt_counts_refusals_of_the_memory_limit() -> None:
    with MemoryCgroup("failcnt", 64 * MiB, root=ROOT) as group:
        if group.version == 1 and (group.path / "memory.memsw.limit_in_bytes").exists():
            # kernels >= 6.13 do not count memsw refusals: let the memory limit refuse
            (group.path / "memory.memsw.limit_in_bytes").write_text("-1")
        assert group.failcnt == 0
        code, _ = _run_in(group, 200 * MiB)
        assert code == -9 and group.failcnt > 0


def test_process_under_the_limit_completes_and_its_peak_is_charged() -> None:
    touched = 100 * MiB
    with MemoryCgroup("under", 256 * MiB, root=ROOT) as group:
        code, out = _run_in(group, touched)
        assert (code, out) == (0, "ok")
        assert touched <= group.max_usage_bytes <= touched + 4 * MiB
        assert group.oom_kills == 0 and group.pids() == []
        group.reset_peak()
        assert group.max_usage_bytes < 16 * MiB  # from the (small) usage left after exit


def test_join_and_remove_with_a_live_process() -> None:
    code = (
        "import sys; from gnnserve.deploy.faas.cgroup import join_memory_cgroup; "
        f"join_memory_cgroup('joined', {64 * MiB}, {ROOT!r}); print('in', flush=True); "
        "sys.stdin.readline()"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "in\n"
        assert _memory_cgroup_of(proc.pid).endswith(f"/{ROOT}/joined")
        group = MemoryCgroup("joined", 64 * MiB, root=ROOT)  # reuses it
        assert group.pids() == [proc.pid]
        group.remove()
        assert not group.path.exists()
        assert _memory_cgroup_of(proc.pid).endswith(f"/{ROOT}") and proc.poll() is None
        group.remove()  # idempotent
    finally:
        proc.communicate("\n", timeout=10)
    assert proc.returncode == 0


def test_cleanup_stale_removes_only_empty_groups() -> None:
    empty = MemoryCgroup("stale-empty", 64 * MiB, root=ROOT)
    nested = MemoryCgroup("inner", 64 * MiB, root=f"{ROOT}/stale-parent")
    busy = MemoryCgroup("stale-busy", 64 * MiB, root=ROOT)
    proc = _child(MiB, sleep=30)
    try:
        busy.add(proc.pid)
        assert cleanup_stale(ROOT) == 3  # stale-empty, stale-parent/inner, stale-parent
        assert not empty.path.exists() and not nested.path.parent.exists()
        assert busy.path.exists() and busy.pids() == [proc.pid]
    finally:
        proc.kill()
        proc.wait()
    busy.remove()
    assert not busy.path.exists()


def test_cleanup_stale_keeps_the_empty_groups_of_live_services_but_its_own() -> None:
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    theirs = MemoryCgroup(f"p{live.pid}-0123abcd-infer-0-0", 64 * MiB, root=ROOT)
    gone = MemoryCgroup(f"p{dead.pid}-0123abcd-infer-0-0", 64 * MiB, root=ROOT)
    mine = MemoryCgroup(f"p{os.getpid()}-4567abcd-sample-0-1", 64 * MiB, root=ROOT)
    try:
        assert cleanup_stale(ROOT) == 1  # a live service may be about to join its groups
        assert theirs.path.exists() and mine.path.exists() and not gone.path.exists()
        assert cleanup_stale(ROOT, owner=f"p{os.getpid()}-4567abcd") == 1  # its own, stopped
        assert theirs.path.exists() and not mine.path.exists()
    finally:
        live.kill()
        live.wait()
    assert cleanup_stale(ROOT) == 1 and not theirs.path.exists()  # its owner has exited now


@pytest.mark.parametrize("name", ["a/b", "..", ".", "", ".hidden", "x" * 129, 7])
def test_bad_names(name: object) -> None:
    with pytest.raises(InvalidInputError) as info:
        MemoryCgroup(name, 64 * MiB, root=ROOT)  # type: ignore[arg-type]
    assert info.value.field == "name"


def test_name_of_a_control_file_is_refused() -> None:
    with pytest.raises(InvalidInputError) as info:
        MemoryCgroup("cgroup.procs", 64 * MiB, root=ROOT)
    assert info.value.field == "name"


@pytest.mark.parametrize("limit", [0, -1, 1024, (4 * MiB) - 1, 1 << 63, True, 64.0, "64"])
def test_bad_limits(limit: object) -> None:
    with pytest.raises(InvalidInputError, match="limit_bytes") as info:
        MemoryCgroup("ok", limit, root=ROOT)  # type: ignore[arg-type]
    assert info.value.field == "limit_bytes"


def test_bad_roots_and_pids() -> None:
    for root in ["/abs", "a//b", "../up", ""]:
        with pytest.raises(InvalidInputError) as info:
            MemoryCgroup("ok", 64 * MiB, root=root)
        assert info.value.field == "root"
    with MemoryCgroup("pids", 64 * MiB, root=ROOT) as group:
        dead = subprocess.Popen([sys.executable, "-c", "pass"])
        dead.wait()  # reaped: the pid no longer exists
        for pid in [dead.pid, 1 << 40, 0, -5, True]:
            with pytest.raises(InvalidInputError) as info:
                group.add(pid)
            assert info.value.field == "pid"
        assert group.pids() == []
