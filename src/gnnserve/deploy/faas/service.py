"""FaaSService: sample instances feeding inference instances, each pool load-aware scheduled.

A request (seeds) goes to the sample function's pool; its :class:`SampledRequest` then goes to
the inference function's pool (FaaS-GNN §4.1: the subgraph passes from one instance to the
other); the answer carries the outputs and what the request cost (fetches, cache, memory,
time per stage). The inference pool is told of the request when it enters the sample pool
(:meth:`FunctionPool.expect`), so a request that meets no warm instance pays one cold start, not
two in series. Both pools start empty and scale to zero after ``keep_alive_s`` idle. Instances
start by ``launch`` (:data:`~gnnserve.deploy.faas.launch.LAUNCHERS`: ``process`` or ``fork``);
each gets a CPU quota of ``memory / mb_per_cpu`` cores (0: none), as FaaS platforms allot CPU in
proportion to memory (FaaS-GNN §5.1; AWS Lambda: one vCPU per 1,769 MB). A quota is a promise
only while the machine has the cores: with no ``max_instances`` the cap per function is what
``cpu_budget`` cores hold of sample + inference pairs (:func:`cpu_instance_cap`), and an explicit
cap whose quotas add up to more than the budget is logged, as the instances then share the cores.
"""

from __future__ import annotations

import itertools
import logging
import math
import os
import shutil
import time
from concurrent.futures import Future
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

import gnnserve.deploy.faas.fork  # noqa: F401 - registers the "fork" launch path
from gnnserve.deploy.faas.cgroup import cgroup_support, cleanup_stale
from gnnserve.deploy.faas.function import (
    FunctionSpec,
    InferenceOutput,
    SampledRequest,
    scratch_dir,
)
from gnnserve.deploy.faas.launch import LAUNCHERS, InstanceHandle, Resources
from gnnserve.deploy.faas.pool import FunctionPool
from gnnserve.deploy.faas.scheduler import Scheduler
from gnnserve.deploy.ray import start_ray, stop_ray
from gnnserve.tempdirs import owner_tag

log = logging.getLogger(__name__)


def cpu_quota(memory_mb: float, mb_per_cpu: float) -> float:
    """Cores of CPU quota an instance of ``memory_mb`` gets at ``mb_per_cpu`` (0: none)."""
    return memory_mb / mb_per_cpu if mb_per_cpu and memory_mb else 0.0


def cpu_instance_cap(cpu_budget: float, quotas: tuple[float, ...]) -> int | None:
    """Instances per function whose CPU ``quotas`` (cores of one instance of each function)
    fit ``cpu_budget`` cores together: at least 1; None when there is no quota or no budget."""
    per_set = sum(quotas)
    if per_set <= 0 or cpu_budget <= 0:
        return None
    return max(1, math.floor(cpu_budget / per_set + 1e-9))


def instance_cap(
    max_instances: int | None, min_instances: int, quotas: tuple[float, ...], cpu_budget: float
) -> int | None:
    """``max_instances``, or when None the cap :func:`cpu_instance_cap` gives (never below
    ``min_instances``); logs an explicit cap whose quotas oversubscribe ``cpu_budget`` cores."""
    fits = cpu_instance_cap(cpu_budget, quotas)
    if max_instances is None:
        return None if fits is None else max(fits, min_instances)
    if fits is not None and max_instances > fits:
        log.warning(
            "faas: %d instances per function with CPU quotas %s cores need %.1f cores, "
            "the budget is %g: the instances will share the cores",
            max_instances,
            [round(q, 2) for q in quotas],
            max_instances * sum(quotas),
            cpu_budget,
        )
    return max_instances


def machine_cores() -> int:
    """Cores this process may run on (its CPU affinity; the CPU count where the platform has
    no affinity call)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


@dataclass
class FaaSResult:
    """One request's answer and its costs."""

    output: InferenceOutput  # logits, embeddings, inference-side costs
    sample: SampledRequest  # its computation graph and the topology fetches
    latency_ms: float  # submit to answer, queueing and cold starts included


class FaaSService:
    """Sample and inference pools for ``spec`` (the inference capacity ``spec.memory_mb``,
    sample instances ``sample_memory_mb``) under scheduler ``policy``."""

    def __init__(
        self,
        spec: FunctionSpec,
        policy: str = "load_aware",
        keep_alive_s: float = 600.0,
        max_instances: int | None = None,
        sample_memory_mb: int | None = None,
        launch: str = "process",
        mb_per_cpu: float = 0.0,
        min_instances: int = 0,
        cpu_budget: float | None = None,
    ) -> None:
        self.spec = spec
        self.mb_per_cpu = float(mb_per_cpu)
        sample_spec = replace(
            spec, memory_mb=spec.memory_mb if sample_memory_mb is None else sample_memory_mb
        )
        budget = machine_cores() if cpu_budget is None else cpu_budget
        quotas = (self._quota(sample_spec), self._quota(spec))
        max_instances = instance_cap(max_instances, min_instances, quotas, budget)
        self.max_instances = max_instances
        self._tag = owner_tag()  # cgroup names: unique per service, the owner's PID in them
        self.launcher = LAUNCHERS.create(launch, self._tag)
        self._started_ray = self.launcher.uses_ray and start_ray(
            num_cpus=max(2, (max_instances or 4) * 2)
        )
        if cgroup_support() is None:
            cleanup_stale()  # empty groups of instances of earlier services
        self._names = itertools.count()
        try:
            self.launcher.prepare("sample", sample_spec)
            self.launcher.prepare("infer", spec)
            self.launcher.wait_ready()
        except Exception:
            self.launcher.close()
            stop_ray(self._started_ray)
            raise
        self.min_instances = min_instances
        scheduling = (policy, keep_alive_s, max_instances, min_instances)
        self.sampler = self._pool("sample", sample_spec, *scheduling)
        self.inference = self._pool("infer", spec, *scheduling)

    def _quota(self, spec: FunctionSpec) -> float:
        """Cores of CPU quota one instance of ``spec`` gets (0: none)."""
        return cpu_quota(spec.memory_mb, self.mb_per_cpu)

    def _pool(
        self,
        kind: str,
        spec: FunctionSpec,
        policy: str,
        keep_alive_s: float,
        max_instances: int | None,
        min_instances: int,
    ) -> FunctionPool:
        tag = f"{self._tag}-{kind}"
        resources = Resources(spec.memory_mb, self._quota(spec))

        def factory(instance: int) -> InstanceHandle:
            name = f"{tag}-{instance}-{next(self._names)}"
            return self.launcher.launch(kind, spec, name, resources)

        scheduler = Scheduler(policy, keep_alive_s, max_instances, min_instances)
        capacity_gb = (spec.memory_mb or 0) / 1024.0
        return FunctionPool(kind, factory, kind, scheduler, capacity_gb)

    def submit(self, seeds: np.ndarray, rng_seed: int | None = None) -> Future[FaaSResult]:
        """Answer ``seeds`` (valid int64 ids) through both pools; the future holds the result."""
        start = time.perf_counter()
        outer: Future[FaaSResult] = Future()
        self.inference.expect()  # its cold start, if it needs one, overlaps sampling
        sampled = self.sampler.submit((np.asarray(seeds, dtype=np.int64), rng_seed))

        def on_sampled(f: Future[SampledRequest]) -> None:
            error = f.exception()
            if error is not None:
                self.inference.unexpect()
                outer.set_exception(error)
                return
            request = f.result()
            inferred = self.inference.submit(request, expected=True)

            def on_inferred(g: Future[InferenceOutput]) -> None:
                exc = g.exception()
                if exc is not None:
                    outer.set_exception(exc)
                    return
                latency = (time.perf_counter() - start) * 1e3
                outer.set_result(FaaSResult(g.result(), request, latency))

            inferred.add_done_callback(on_inferred)

        sampled.add_done_callback(on_sampled)
        return outer

    def predict(
        self, seeds: np.ndarray, rng_seed: int | None = None, timeout_s: float = 120.0
    ) -> FaaSResult:
        """:meth:`submit` and wait."""
        return self.submit(seeds, rng_seed).result(timeout_s)

    def instance_memory(self) -> dict[str, list[dict[str, int]]]:
        """Each warm instance's memory (``FunctionInstance.memory``), per pool."""
        return {
            "sample": self.sampler.ask_warm("memory"),
            "infer": self.inference.ask_warm("memory"),
        }

    def wait_min_warm(self, timeout_s: float) -> bool:
        """Wait until ``min_instances`` sample and inference instances are warm (True)."""
        deadline = time.monotonic() + timeout_s
        return all(
            pool.wait_warm(self.min_instances, max(0.0, deadline - time.monotonic()))
            for pool in (self.sampler, self.inference)
        )

    def wait_scaled_to_zero(self, timeout_s: float) -> bool:
        """Block until keep-alive stopped every instance (or ``timeout_s``); True when it did."""
        deadline = time.monotonic() + timeout_s
        while self.sampler.size + self.inference.size:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.2)
        return True

    def summary(self) -> dict[str, Any]:
        """Cold starts (count, mean and each one's seconds), instance failures, retries, steals
        and GB·s so far."""
        pools = (self.sampler, self.inference)
        cold = [s for p in pools for s in p.stats.cold_start_s]
        return {
            "cold_starts": sum(p.stats.cold_starts for p in pools),
            "cold_start_mean_s": float(sum(cold) / len(cold)) if cold else 0.0,
            "cold_start_s": cold,
            "failures": sum(p.stats.failures for p in pools),
            "retries": sum(p.stats.retries for p in pools),
            "steals": sum(p.scheduler.steals for p in pools),
            "gb_seconds": self.gb_seconds(),
        }

    def gb_seconds(self) -> float:
        """Instance memory billed so far (capacity x lifetime, both pools), GB·s."""
        return self.sampler.live_gb_seconds() + self.inference.live_gb_seconds()

    def shutdown(self) -> None:
        """Stop every instance (and the Ray instance when this service started it)."""
        self.sampler.shutdown()
        self.inference.shutdown()
        self.launcher.close()
        for leftover in scratch_dir(self._tag).parent.glob(f"{self._tag}-*"):
            shutil.rmtree(leftover, ignore_errors=True)  # instances that died mid-download
        if cgroup_support() is None:
            _cleanup_groups(self._tag)
        stop_ray(self._started_ray)


def _cleanup_groups(tag: str) -> None:
    """Remove the empty cgroups of this service's (``tag``) stopped instances and of dead
    services' (killed processes exit within moments; groups still busy now are removed when
    the next service starts)."""
    time.sleep(0.5)
    cleanup_stale(owner=tag)
