"""``--fsync always``: a real ``gnnserve serve`` process, traced with strace, syncs the update log
(and, once, its directory) before it writes each acknowledgement to the socket; ``--fsync never``
syncs nothing per batch."""

from __future__ import annotations

import os
import re
import shutil
import signal
import struct
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from gnnserve.demo import wait_ready
from gnnserve.dynamic.records import MAGIC
from gnnserve.ports import free_port

BATCHES = 5
SYSCALLS = "trace=fsync,fdatasync,write,sendto,sendmsg,writev"
Events = list[tuple[str, str, bytes]]  # (syscall, fd path, trace line)
_LINE = re.compile(rb"^(\d+) +\S+ (<\.\.\. )?(\w+)(?: resumed>|\((\d+)<([^>]*)>)")


def _strace() -> str:
    """The strace binary, or skip when it is missing or ptrace is not permitted here."""
    strace = shutil.which("strace") or "/usr/bin/strace"
    if not os.access(strace, os.X_OK):
        pytest.skip("strace is not installed")
    probe = subprocess.run([strace, "-f", "-o", os.devnull, "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"strace cannot trace here (ptrace not permitted?): {probe.stderr[-200:]!r}")
    return strace


def _events(trace: Path) -> Events:
    """(syscall, fd path, line) per finished syscall, in the order strace saw them finish: a call
    another thread interrupted counts where its "resumed" half is."""
    pending: dict[bytes, tuple[str, str, bytes]] = {}
    out = []
    for line in trace.read_bytes().splitlines():
        m = _LINE.match(line)
        if m is None:
            continue
        pid, resumed, name = m.group(1), m.group(2), m.group(3).decode()
        if resumed:
            if pid in pending:
                out.append(pending.pop(pid))
            continue
        event = (name, (m.group(5) or b"").decode(), line)
        if line.endswith(b"<unfinished ...>"):
            pending[pid] = event
        else:
            out.append(event)
    return out


def _serve_traced(store: Path, ckpt: Path, log: Path, fsync: str, trace: Path):  # type: ignore[no-untyped-def]
    port = free_port()
    cmd = [_strace(), "-f", "--seccomp-bpf", "-tt", "-yy", "-x", "-s", "200", "-e", SYSCALLS]
    cmd += ["-o", str(trace), sys.executable, "-m", "gnnserve.cli", "serve", "--store", str(store)]
    cmd += ["--model", str(ckpt), "--port", str(port), "--update-log", str(log), "--fsync", fsync]
    proc = subprocess.Popen(cmd, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    return proc, f"http://127.0.0.1:{port}"


def _stop(proc: subprocess.Popen[bytes]) -> None:
    children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children")
    for pid in children.read_text().split() if children.exists() else []:
        os.kill(int(pid), signal.SIGTERM)  # the server; strace exits after it
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="module")
def traced(
    small_store: Path, small_ckpt: Path, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, tuple[Path, Events]]:
    """Per fsync policy: (log, trace events) of a traced server that took BATCHES updates one at
    a time. Both servers run at once, so the test costs about one server start."""
    tmp = tmp_path_factory.mktemp("fsync")
    runs = {}
    for policy in ("always", "never"):
        log, trace = tmp / policy / "updates.log", tmp / f"{policy}.trace"
        runs[policy] = (log, trace, *_serve_traced(small_store, small_ckpt, log, policy, trace))
    try:
        for _, _, proc, base in runs.values():
            wait_ready(base, proc, timeout_s=300)  # two servers start at once
        with httpx.Client(timeout=30) as client:
            for k in range(1, BATCHES + 1):
                ops = [{"op": "upsert_features", "node": k, "features": [float(k)] * 16}]
                for _, _, _, base in runs.values():
                    r = client.post(f"{base}/v1/graph/updates", json={"ops": ops})
                    assert r.status_code == 200 and r.json()["seq"] == k, r.text
    finally:
        for _, _, proc, _ in runs.values():
            _stop(proc)
    return {policy: (log, _events(trace)) for policy, (log, trace, _, _) in runs.items()}


def _index(events: Events, name: set[str], path: str, text: bytes) -> int:
    """Position of the first event of a syscall in ``name`` on ``path`` whose line has ``text``."""
    for i, (call, fd_path, line) in enumerate(events):
        if call in name and path in fd_path and text in line:
            return i
    raise AssertionError(f"no {name} on {path} with {text!r} in the trace")


SENDS = {"write", "sendto", "sendmsg", "writev"}


def _hex(data: bytes) -> bytes:
    """``data`` as strace -x prints a string that holds a non-ASCII byte (all of it in hex;
    an ASCII string stays text)."""
    return b"".join(b"\\x%02x" % c for c in data)


HEADER = b'\\"version\\":0,'  # the log's first record, a JSON line


def _frame(k: int) -> bytes:
    """The start of batch k's record: a binary frame (magic, seq k)."""
    return _hex(MAGIC + struct.pack("<Q", k))


def _ack(k: int) -> bytes:
    return b'\\"seq\\":%d,' % k


@pytest.mark.slow
def test_fsync_always_syncs_the_log_before_each_acknowledgement(
    traced: dict[str, tuple[Path, Events]],
) -> None:
    log, events = traced["always"]
    logged = str(log)
    header = _index(events, {"write"}, logged, HEADER)
    syncs = [i for i, (call, path, _) in enumerate(events) if call in {"fsync", "fdatasync"}]
    dir_syncs = [i for i in syncs if events[i][1] == str(log.parent)]
    assert dir_syncs and dir_syncs[0] < header  # the new log's directory entry is durable
    log_syncs = [i for i in syncs if events[i][1] == logged]
    for k in range(1, BATCHES + 1):
        written = _index(events, {"write"}, logged, _frame(k))
        acked = _index(events, SENDS, "TCP", _ack(k))
        assert written < acked
        assert any(written < i < acked for i in log_syncs), f"batch {k} acknowledged unsynced"


@pytest.mark.slow
def test_fsync_never_issues_no_per_batch_fsync(traced: dict[str, tuple[Path, Events]]) -> None:
    log, events = traced["never"]
    first = _index(events, {"write"}, str(log), _frame(1))
    last_ack = _index(events, SENDS, "TCP", _ack(BATCHES))
    for k in range(2, BATCHES + 1):  # every batch was written to the log in this window
        assert first < _index(events, {"write"}, str(log), _frame(k)) < last_ack
    log_or_dir = (str(log), str(log.parent))
    synced = [e for e in events[first:last_ack] if e[0] in {"fsync", "fdatasync"}]
    synced = [e for e in synced if e[1] in log_or_dir]
    assert synced == []
