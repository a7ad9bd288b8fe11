"""Planner: for each batch, choose how its computation graph is built.

- the request's fanouts equal the installed pre-sampling query -> reservoir look-ups (DGS)
- otherwise -> on-demand k-hop sampling with those fanouts (one sampler per fanout tuple)

A batch's fanouts were validated with its requests (``engine.requests``): they are trusted here.

Hybrid routing (Quiver §4.2.2): the default-fanout sampler runs a batch inline when its summed
PSGS is below ``parallel_threshold``, on the throughput path from it on (hop by hop in parallel,
or the profile's device path, e.g. ``cuda``). ``sampler.routing``
(latency | throughput) takes that threshold from a calibration profile (``gnnserve calibrate``,
:mod:`gnnserve.sampling.calibrate`) measured on this machine for this model, graph and fanouts;
without one the constant ``sampler.parallel_threshold`` stays, with a logged warning. Other
fanouts keep the constant (the profile was measured for the default ones).
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import numpy as np
import torch

from gnnserve.config import BatcherConfig, SamplerConfig, ServeConfig
from gnnserve.errors import InvalidInputError
from gnnserve.fanouts import check_fanouts
from gnnserve.features import open_feature_store
from gnnserve.graph import open_graph_store
from gnnserve.graph.base import GraphStore
from gnnserve.models.checkpoint import load_checkpoint
from gnnserve.models.runner import ModelRunner
from gnnserve.sampling.calibrate import PROFILE_NAME, CalibrationProfile, Identity, find_profile
from gnnserve.sampling.calibration_runs import measure, plot_profile
from gnnserve.sampling.metrics import psgs
from gnnserve.sampling.paths import NEVER, PathSampler, build_path
from gnnserve.sampling.presample import PreSampler
from gnnserve.sampling.sampler import NeighborSampler
from gnnserve.types import SampledSubgraph

Fanouts = tuple[int, ...]
_MAX_SAMPLERS = 16  # distinct per-request fanout tuples kept warm
log = logging.getLogger(__name__)


class Sampler(Protocol):
    """Anything that turns seeds into a SampledSubgraph."""

    def sample(self, seeds: np.ndarray) -> SampledSubgraph:
        """The computation graph of ``seeds`` (checked)."""

    def sample_valid(self, seeds: np.ndarray) -> SampledSubgraph:
        """The same for seeds validated at admission (not checked again)."""


class Planner:
    """Maps a batch's fanouts to the sampler that serves them."""

    def __init__(
        self,
        graph: GraphStore,
        config: SamplerConfig,
        num_layers: int,
        profile: CalibrationProfile | None = None,
    ) -> None:
        self.graph = graph
        self.config = config
        self.num_layers = num_layers
        self.default: Fanouts = tuple(check_fanouts(config.fanouts, hops=num_layers))
        # PSGS for a graph that changes would go stale: the sampler falls back to a fanout bound
        # (a remote store's topology is read by the function instances, never whole here)
        cost = None if graph.mutable or not graph.local else psgs(graph, list(self.default))
        self.psgs = cost
        self.profile = profile if cost is not None else None  # its PSGS scale needs ``cost``
        # summed PSGS from which a default-fanout batch goes hop by hop in parallel
        self.parallel_threshold = routed_threshold(config, self.profile)
        default = self._on_demand(self.default, cost)
        default.parallel_threshold = self.parallel_threshold
        if config.routing is not None and self.profile is not None and cost is not None:
            default.throughput = throughput_sampler(self.profile, graph, self.default, config, cost)
            default.throughput_name = self.profile.path_b
        self._samplers: dict[Fanouts, NeighborSampler] = {self.default: default}
        self.presampler: PreSampler | None = None
        if config.presample:
            indptr, indices = graph.csr()
            self.presampler = PreSampler(indptr, indices, list(self.default), config.seed)
        self._lock = threading.Lock()

    def _on_demand(self, fanouts: Fanouts, cost: np.ndarray | None = None) -> NeighborSampler:
        c = self.config
        return NeighborSampler(self.graph, list(fanouts), c.seed, c.parallel_threshold, cost)

    def sampler_for(self, fanouts: Fanouts | None) -> Sampler:
        """The pre-sampler when it serves ``fanouts`` (None = the default), else on-demand."""
        fanouts = fanouts or self.default
        if self.presampler is not None and fanouts == self.default:
            return self.presampler
        return self.on_demand_for(fanouts)

    def on_demand_for(self, fanouts: Fanouts | None) -> NeighborSampler:
        """The on-demand sampler of ``fanouts`` (None = the default), also where a pre-sampler
        serves them: a request's own seed keys its draws (the reservoirs take none)."""
        fanouts = fanouts or self.default
        with self._lock:
            sampler = self._samplers.get(fanouts)
            if sampler is None:
                if len(self._samplers) >= _MAX_SAMPLERS:
                    self._samplers.pop(next(k for k in self._samplers if k != self.default))
                sampler = self._samplers[fanouts] = self._on_demand(fanouts)
            return sampler

    def path_of(self, fanouts: Fanouts | None, seeds: np.ndarray, seeded: bool) -> str:
        """The sampling path a batch takes: ``presample``, or its on-demand sampler's path
        (``inline``, ``parallel``, a device path); ``seeded``: the request fixes its draws."""
        if not seeded and self.presampler is not None and (fanouts or self.default) == self.default:
            return "presample"
        return self.on_demand_for(fanouts).path_of(seeds)

    def expected_size(self, seeds: np.ndarray) -> float:
        """Expected sampled nodes of ``seeds`` under the default fanouts (batch cost)."""
        return self._samplers[self.default].expected_size(seeds)


def routed_threshold(config: SamplerConfig, profile: CalibrationProfile | None) -> int:
    """The default sampler's parallel threshold: the profile's point for ``config.routing``
    (an infinite point: never parallel; 0: always), else ``config.parallel_threshold``."""
    if config.routing is None or profile is None:
        return config.parallel_threshold
    point = profile.points[config.routing]  # routing names its profile point
    return NEVER if math.isinf(point) else max(int(math.ceil(point)), 0)


def throughput_sampler(
    profile: CalibrationProfile,
    graph: GraphStore,
    fanouts: Fanouts,
    config: SamplerConfig,
    cost: np.ndarray,
) -> PathSampler | None:
    """The profile's throughput path when it is a device path (``cuda``, ``torch``), built
    once for the default fanouts with their PSGS ``cost``; None for ``parallel``
    (NeighborSampler's own hop-by-hop)."""
    if profile.path_b == "parallel":
        return None
    log.info("throughput path: %s (from the calibration profile)", profile.path_b)
    return build_path(profile.path_b, graph, list(fanouts), config.seed, cost)


def profile_path(config: ServeConfig) -> Path:
    """Where the served profile is read: ``sampler.calibration``, else beside the store."""
    return Path(config.sampler.calibration or Path(config.store.path) / PROFILE_NAME)


def serving_profile(
    config: ServeConfig, graph: GraphStore, model_version: str
) -> CalibrationProfile | None:
    """The calibration profile ``config`` asks for (routing or a latency SLO), checked against
    this machine, ``model_version``, ``graph`` and the default fanouts; None when nothing asks
    for one, or (with a logged warning) when it is missing or stale or the graph changes."""
    if config.sampler.routing is None and config.batcher.latency_slo_ms is None:
        return None
    if graph.mutable or not graph.local:
        log.warning("no calibrated routing: PSGS is not tracked on a changing or remote graph")
        return None
    if not (config.sampler.calibration or config.store.path):
        log.warning("no calibration profile: no store directory or sampler.calibration given")
        return None
    expected = Identity.here(model_version, graph.version, list(config.sampler.fanouts))
    profile = find_profile(profile_path(config), expected)
    if profile is not None:
        points = ", ".join(f"{k} {v:.0f}" for k, v in profile.points.items())
        log.info("calibration profile %s: PSGS points %s", profile_path(config), points)
    return profile


def in_flight(config: BatcherConfig) -> int:
    """Batches a server keeps in flight at once: pipelines x their depth (one per pipeline
    when several run)."""
    return config.pipelines if config.pipelines > 1 else config.pipeline_depth


def calibrate(
    store_dir: str | Path,
    model_dir: str | Path,
    fanouts: list[int] | None = None,
    out: str | Path | None = None,
    buckets: int = 12,
    runs: int = 10,
    max_seeds: int = 1024,
    torch_threads: int | None = 1,
    seed: int = 0,
    progress: Callable[[str], None] | None = None,
    throughput: str | None = None,
    concurrency: int | None = None,
) -> tuple[CalibrationProfile, Path, Path]:
    """Calibrate the sampling paths of the store at ``store_dir`` with the checkpoint at
    ``model_dir`` (see :func:`gnnserve.sampling.calibration_runs.measure`); writes the profile
    JSON to ``out`` (default ``<store>/calibration.json``) and its PNG beside it (``.png``).

    ``fanouts`` default to ``serve``'s; ``torch_threads`` as ``serve --torch-threads`` (the model
    forward is part of each measured batch); ``throughput`` names the path measured against
    inline (default: cuda where present, else parallel); ``concurrency``: batches measured at
    once (default: as many as ``serve`` keeps in flight, ``batcher.pipelines`` x
    ``pipeline_depth``). Returns (profile, json path, png path).
    """
    graph = open_graph_store(store_dir)
    features = open_feature_store(store_dir)
    ckpt = load_checkpoint(model_dir)
    if ckpt.config.in_dim != features.dim:
        raise InvalidInputError(
            f"model expects {ckpt.config.in_dim} input features, the store has {features.dim}",
            "model",
        )
    fanouts = check_fanouts(fanouts or SamplerConfig().fanouts, hops=ckpt.config.num_layers)
    identity = Identity.here(ckpt.version, graph.version, fanouts)
    runner = ModelRunner(ckpt.model, ckpt.version)
    before = torch.get_num_threads()
    if torch_threads is not None:
        torch.set_num_threads(torch_threads)
    try:
        profile = measure(
            graph,
            features,
            runner.forward,
            identity,
            buckets,
            runs,
            max_seeds,
            seed,
            progress,
            throughput,
            concurrency or in_flight(BatcherConfig()),
        )
    finally:
        torch.set_num_threads(before)
    path = profile.save(Path(out) if out else Path(store_dir) / PROFILE_NAME)
    return profile, path, plot_profile(profile, path.with_suffix(".png"))
