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
    prefix = f"gnnserve-{kind}-p{os.getpid()}-{uuid.uuid4().hex[:8]}-"
    return Path(tempfile.mkdtemp(prefix=prefix))


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
    pattern = re.compile(rf"gnnserve-{re.escape(kind)}-p(\d+)-[0-9a-f]{{8}}-")
    removed = []
    for path in base.glob(f"gnnserve-{kind}-p*"):
        match = pattern.match(path.name)
        if match and path.is_dir() and not pid_alive(int(match.group(1))):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed
