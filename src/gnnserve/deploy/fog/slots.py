"""Testbed slots: fog deployments on one host that never touch each other's namespaces,
links, addresses or cgroups.

Every system resource a fog deployment creates carries its slot ``k``: namespaces
``gnf<k>d<i>`` (device links) and ``gnf<k>f<j>`` (the fog fabric), host-side veths
``gnh<k>...``, the bridge ``gnb<k>``, subnets ``10.213.<k>.*`` and ``10.214.<k>.*``, and the
cgroups under ``gnnserve-fog/slot<k>``. A deployment claims the first slot whose owner file
(``/run/gnnserve/fog/slot-<k>.owner``) it can lock; the lock is held for the deployment's life
and the kernel drops it when the owner dies, however it dies, so a held lock means a live owner
(a PID could be reused; a lock cannot outlive its process). Only on claiming a slot does a
deployment delete what is named for it: the leftovers of a dead owner, never what a live
deployment holds. The owner file records the owner's PID and deployment id, for people.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import uuid
from pathlib import Path

from gnnserve.deploy.fog.testbed import CPU_ROOT, GROUP, TestbedError, _run, remove_cpu_group

SLOTS = 25  # deployments side by side on one host
SLOT_DIR = Path(os.environ.get("GNNSERVE_RUN_DIR", "/run/gnnserve")) / "fog"


class Slot:
    """A claimed slot: ``index`` names and numbers this deployment's resources (see module)."""

    def __init__(self, index: int, fd: int, deployment: str) -> None:
        self.index, self._fd, self.deployment = index, fd, deployment

    @property
    def cgroup_parent(self) -> str:
        """The cgroup (relative to the controller's root) under which this slot's groups go."""
        return f"{GROUP}/slot{self.index}"

    def release(self) -> None:
        """Remove this slot's cgroup parent (its groups are closed first) and drop the lock."""
        if self._fd < 0:
            return
        with contextlib.suppress(OSError):
            (CPU_ROOT / self.cgroup_parent).rmdir()
        with contextlib.suppress(OSError):
            os.ftruncate(self._fd, 0)
        os.close(self._fd)  # closing releases the flock
        self._fd = -1

    def __enter__(self) -> Slot:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def claim_slot() -> Slot:
    """The first free slot, its dead owner's leftovers removed (TestbedError when every slot
    is held by a live deployment)."""
    SLOT_DIR.mkdir(parents=True, exist_ok=True)
    for index in range(SLOTS):
        fd = os.open(SLOT_DIR / f"slot-{index}.owner", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)  # a live deployment holds it
            continue
        try:
            remove_leftovers(index)
            deployment = uuid.uuid4().hex[:12]
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"pid {os.getpid()}\ndeployment {deployment}\n".encode(), 0)
        except BaseException:
            os.close(fd)
            raise
        return Slot(index, fd, deployment)
    raise TestbedError(
        f"all {SLOTS} fog testbed slots are held by live deployments (owner files in "
        f"{SLOT_DIR}): stop one first"
    )


def _named_for(index: int, names: list[str]) -> list[str]:
    """The names in ``names`` that belong to slot ``index`` (a letter follows the number, so
    slot 1 never matches slot 12's names)."""
    pattern = re.compile(rf"gn[fhdb]{index}(?:[df]\d+)?")
    return [n for n in names if pattern.fullmatch(n)]


def remove_leftovers(index: int) -> list[str]:
    """Delete every namespace, link and cgroup named for slot ``index``; returns their names.
    Only the owner of the slot's lock may call this."""
    namespaces = [line.split()[0] for line in _run("ip", "netns", "list").stdout.splitlines()]
    links = [
        line.split(":")[1].strip().split("@")[0]
        for line in _run("ip", "-o", "link", "show").stdout.splitlines()
        if line.count(":") >= 2
    ]
    removed = []
    for ns in _named_for(index, namespaces):
        _run("ip", "netns", "del", ns)
        removed.append(ns)
    for link in _named_for(index, links):
        _run("ip", "link", "del", link)
        removed.append(link)
    removed += _remove_cgroups(CPU_ROOT / GROUP / f"slot{index}")
    return removed


def _remove_cgroups(parent: Path) -> list[str]:
    """Remove ``parent`` and its child groups, moving any process left in them to the root."""
    if not parent.is_dir():
        return []
    groups = [*(p for p in parent.iterdir() if p.is_dir()), parent]
    for group in groups:
        remove_cpu_group(group)
    return [str(g.relative_to(CPU_ROOT)) for g in groups]
