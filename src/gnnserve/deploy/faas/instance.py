"""FunctionInstance: one function instance, a Ray actor in its own process.

Its cold start is what a FaaS platform's is: a process (a new one, or one forked from a warm
template: :mod:`.launch`) already inside its memory and CPU cgroups (as Docker enforces a
container's limits: exceeding the memory gets the process OOM-killed), opening the remote store,
loading the model and running one synthetic request so that kernels are compiled and loaded
before the first real one. ``ready`` reports how long the steps inside the process took; the pool
measures the whole launch-to-ready time.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import ray
import torch

from gnnserve.deploy.faas.cgroup import MemoryCgroup, cgroup_support
from gnnserve.deploy.faas.function import (
    FunctionSpec,
    InferenceFunction,
    InferenceOutput,
    SampledRequest,
    SampleFunction,
    scratch_dir,
)
from gnnserve.deploy.faas.resources import CPU_GROUP, Resources
from gnnserve.deploy.fog.testbed import CpuQuota
from gnnserve.errors import InvalidInputError

log = logging.getLogger(__name__)
KINDS = ("sample", "infer")
_MB = 1 << 20


@dataclass
class Startup:
    """What an instance's cold start did inside its process (milliseconds, bytes)."""

    pid: int  # the instance's process
    cgroup_ms: float  # creating and joining the memory cgroup
    init_ms: float  # opening the store, loading the model (and downloads in full-fetch mode)
    limited: bool  # a cgroup enforces the capacity
    rss_bytes: int  # resident memory once ready


class FunctionInstance:
    """A ``kind`` ("sample" | "infer") instance built from ``spec``, named ``name`` (its
    cgroups), limited to ``resources``; ``forked``: a child of a fork template."""

    def __init__(
        self, kind: str, spec: FunctionSpec, name: str, resources: Resources, forked: bool = False
    ) -> None:
        if kind not in KINDS:
            raise InvalidInputError(f"instance kind must be one of {KINDS}, got {kind!r}", "kind")
        start = time.perf_counter()
        self.cgroup = _enter_cgroups(name, resources)
        # a forked child keeps one thread: GNU OpenMP hangs when a child of a process that used
        # it starts a team of its own
        torch.set_num_threads(1 if forked else max(1, int(resources.cpus)))
        joined = time.perf_counter()
        self.function: SampleFunction | InferenceFunction
        scratch = scratch_dir(name)
        if kind == "sample":
            self.function = SampleFunction(spec, scratch)
        elif self.cgroup is not None:  # budgets in what the limit counts: the cgroup's usage
            group = self.cgroup
            self.function = InferenceFunction(spec, lambda: group.usage_bytes, scratch)
        else:
            self.function = InferenceFunction(spec, scratch=scratch)
        done = time.perf_counter()
        self.startup = Startup(
            os.getpid(),
            (joined - start) * 1e3,
            (done - joined) * 1e3,
            self.cgroup is not None,
            _rss(),
        )

    def ready(self) -> Startup:
        """The cold start's steps (the pool waits for this call)."""
        return self.startup

    def sample(self, payload: tuple[np.ndarray, int | None]) -> SampledRequest:
        """Sample instances: the computation graph of (seeds, rng_seed)."""
        assert isinstance(self.function, SampleFunction)
        seeds, rng_seed = payload
        return self.function.sample(seeds, rng_seed)

    def infer(self, request: SampledRequest) -> InferenceOutput:
        """Inference instances: the outputs of a sampled request."""
        assert isinstance(self.function, InferenceFunction)
        return self.function.infer(request)

    def memory(self) -> dict[str, int]:
        """Resident and anonymous resident bytes now, the process id and, under a cgroup, what
        it charges now, its peak and its limit (bytes)."""
        out = {"pid": os.getpid(), "rss_bytes": _rss(), "anon_bytes": _anon()}
        if self.cgroup is not None:
            out["usage_bytes"] = self.cgroup.usage_bytes
            out["peak_bytes"] = self.cgroup.max_usage_bytes
            out["limit_bytes"] = self.cgroup.limit_bytes
        return out


def _enter_cgroups(name: str, resources: Resources) -> MemoryCgroup | None:
    """Put this process into the instance's cgroups (a no-op where the launcher's wrapper already
    did; on another host this also sets the limits) and return its memory cgroup."""
    if cgroup_support() is not None:
        return None
    group = None
    if resources.memory_mb:
        group = MemoryCgroup(name, resources.memory_mb * _MB)
        group.add(os.getpid())
    if resources.cpus:
        CpuQuota(name, resources.cpus, group=CPU_GROUP).add(os.getpid())
    return group


def _anon() -> int:
    """Anonymous resident bytes (``RssAnon``): pages only this process's cgroup can be charged."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    return 0


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


# one call at a time (an actor's default), never restarted: the pool replaces dead instances;
# the CPU it may use is its cgroup quota, not a Ray resource
RemoteInstance: Any = ray.remote(num_cpus=0, max_restarts=0)(FunctionInstance)
