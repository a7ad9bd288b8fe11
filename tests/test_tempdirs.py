"""Owned temp dirs: a dead owner's are swept, a live owner's (this process's, or another live
process's) are kept, and other names are never touched."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from gnnserve.tempdirs import owned_tempdir, sweep_dead

MAKE = "from gnnserve.tempdirs import owned_tempdir; print(owned_tempdir('dgs'), flush=True)"


def _owner(tmp: Path, stay: bool) -> subprocess.Popen[str]:
    """A process that makes a dgs dir in ``tmp``, prints it, and (``stay``) waits on stdin."""
    code = MAKE + ("; import sys; sys.stdin.read()" if stay else "")
    return subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        env={"TMPDIR": str(tmp)},
    )  # fmt: skip


def test_only_the_dirs_of_dead_owners_are_swept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    mine = owned_tempdir("dgs")
    assert mine.parent == tmp_path and mine.name.startswith("gnnserve-dgs-p")
    gone, live = _owner(tmp_path, stay=False), _owner(tmp_path, stay=True)
    assert gone.stdout is not None and live.stdout is not None
    dead, theirs = Path(gone.stdout.readline().strip()), Path(live.stdout.readline().strip())
    gone.wait(timeout=30)
    (dead / "sampling-0.ckpt").write_bytes(b"x")
    other = tmp_path / "gnnserve-dgs-notmine"
    other.mkdir()
    try:
        assert sweep_dead("dgs") == [dead]
        assert mine.is_dir() and theirs.is_dir() and other.is_dir() and not dead.exists()
        assert sweep_dead("faas") == []
    finally:
        assert live.stdin is not None
        live.stdin.close()
        live.wait(timeout=30)
    assert sweep_dead("dgs") == [theirs]  # its owner has exited now
    with pytest.raises(ValueError, match="letters"):
        owned_tempdir("../x")
