"""Temporary directories owned by one process: named ``gnnserve-<kind>-p<pid>-<id>-*`` in the
system temp dir, so that a later start can remove those of owners that died without cleaning
up (SIGKILL, OOM) and never touch a live owner's."""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import uuid
from pathlib import Path


def owned_tempdir(kind: str) -> Path:
    """A new directory for this process's deployment of ``kind`` (letters only)."""
    if not re.fullmatch(r"[a-z]+", kind):
        raise ValueError(f"kind must be lower-case letters, got {kind!r}")
    return Path(tempfile.mkdtemp(prefix=f"gnnserve-{kind}-{owner_tag()}-"))


_OWNER_TAG = r"p(\d+)-[0-9a-f]{8}-"  # owner_tag() and the dash after it


def owner_tag() -> str:
    """A new tag naming this process as the owner of what carries it: ``p<pid>-<8 hex>``."""
    return f"p{os.getpid()}-{uuid.uuid4().hex[:8]}"


def _owner_pid(name: str) -> int | None:
    """The PID of the owner tag (and dash) that opens ``name``; None without one."""
    match = re.match(_OWNER_TAG, name)
    return int(match.group(1)) if match else None


def owner_alive(name: str) -> bool:
    """Whether ``name`` opens with an owner tag (and a dash) whose process is alive."""
    pid = _owner_pid(name)
    return pid is not None and pid_alive(pid)


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists (a reused number counts as alive: the safe side)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


def sweep_dead(kind: str, root: str | Path | None = None) -> list[Path]:
    """Remove the ``kind`` directories whose owner process is gone; returns them. A directory
    whose PID is alive (its owner, or a process that reused the number) is kept."""
    base = Path(root) if root is not None else Path(tempfile.gettempdir())
    prefix = f"gnnserve-{kind}-"
    removed = []
    for path in base.glob(f"{prefix}p*"):
        pid = _owner_pid(path.name[len(prefix) :])
        if pid is not None and path.is_dir() and not pid_alive(pid):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed
