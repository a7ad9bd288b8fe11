"""An instance's limits and the cgroup its CPU quotas live under: shared by the launchers
(:mod:`.launch`) and the instance processes (:mod:`.instance`), which must not import each
other."""

from __future__ import annotations

from dataclasses import dataclass

CPU_GROUP = "gnnserve-faas"  # parent of every instance's CPU quota group


@dataclass(frozen=True)
class Resources:
    """An instance's limits: ``memory_mb`` (0: none) and ``cpus`` (CPU quota; 0: none)."""

    memory_mb: int
    cpus: float
