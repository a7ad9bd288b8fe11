"""Planner: for each batch, choose how its computation graph is built.

- the request's fanouts equal the installed pre-sampling query -> reservoir look-ups (DGS)
- otherwise -> on-demand k-hop sampling with those fanouts (one sampler per fanout tuple)

A batch's fanouts were validated with its requests (``engine.requests``): they are trusted here.
"""

from __future__ import annotations

import threading
from typing import Protocol

import numpy as np

from gnnserve.config import SamplerConfig
from gnnserve.fanouts import check_fanouts
from gnnserve.graph.base import GraphStore
from gnnserve.sampling.metrics import psgs
from gnnserve.sampling.presample import PreSampler
from gnnserve.sampling.sampler import NeighborSampler
from gnnserve.types import SampledSubgraph

Fanouts = tuple[int, ...]
_MAX_SAMPLERS = 16  # distinct per-request fanout tuples kept warm


class Sampler(Protocol):
    """Anything that turns seeds into a SampledSubgraph."""

    def sample(self, seeds: np.ndarray) -> SampledSubgraph:
        """The computation graph of ``seeds`` (checked)."""

    def sample_valid(self, seeds: np.ndarray) -> SampledSubgraph:
        """The same for seeds validated at admission (not checked again)."""


class Planner:
    """Maps a batch's fanouts to the sampler that serves them."""

    def __init__(self, graph: GraphStore, config: SamplerConfig, num_layers: int) -> None:
        self.graph = graph
        self.config = config
        self.num_layers = num_layers
        self.default: Fanouts = tuple(check_fanouts(config.fanouts, hops=num_layers))
        # PSGS for a graph that changes would go stale: the sampler falls back to a fanout bound
        # (a remote store's topology is read by the function instances, never whole here)
        cost = None if graph.mutable or not graph.local else psgs(graph, list(self.default))
        self.psgs = cost
        self._samplers: dict[Fanouts, NeighborSampler] = {
            self.default: self._on_demand(self.default, cost)
        }
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
        with self._lock:
            sampler = self._samplers.get(fanouts)
            if sampler is None:
                if len(self._samplers) >= _MAX_SAMPLERS:
                    self._samplers.pop(next(k for k in self._samplers if k != self.default))
                sampler = self._samplers[fanouts] = self._on_demand(fanouts)
            return sampler

    def expected_size(self, seeds: np.ndarray) -> float:
        """Expected sampled nodes of ``seeds`` under the default fanouts (batch cost)."""
        return self._samplers[self.default].expected_size(seeds)
