"""DGSExecutor (``deploy.mode: dgs``): batches sample from DGS serving workers.

The local pipeline (:class:`~gnnserve.engine.local.LocalExecutor`) with its sampling stage
routed: a batch with the default fanouts (``sampler.fanouts``) is sampled by
:class:`~gnnserve.deploy.dgs.service.DGSService` look-ups in the serving workers' caches
(``deploy.workers`` sampling and serving workers, Ray actors); other fanouts sample locally.
Feature gather and the model run here. A DGS sample equals the pre-sampler's for the same
``sampler.seed`` and update sequence, so answers equal ``local`` with ``sampler.presample``.

With an update log, the executor subscribes to the changing graph (the UpdateListener protocol
of :mod:`gnnserve.graph.events`): every applied batch's edge events reach the workers before the
writer is answered, so a batch sampled after an update sees it. DGS keeps a fixed vertex set: once
an update adds nodes, every batch samples locally (logged once; answers stay correct).

A serving worker that dies is replaced by the service (``DGSService`` module doc); the batch
that met the death gets 503 ``worker_failed`` with a retry hint, and DGS goes on serving.
"""

from __future__ import annotations

import logging
import time

import numpy as np

from gnnserve.config import ServeConfig
from gnnserve.deploy.dgs.service import DGSService
from gnnserve.deploy.ray import start_ray_early
from gnnserve.engine.batcher import Batch
from gnnserve.engine.executor import BatchSource, ExecutionContext
from gnnserve.engine.local import LocalExecutor
from gnnserve.graph.events import NeighborsOf
from gnnserve.types import SampledSubgraph

log = logging.getLogger(__name__)


class DGSExecutor(LocalExecutor):
    """LocalExecutor whose default-fanout batches sample from DGS serving workers."""

    name = "dgs"

    def __init__(self, context: ExecutionContext) -> None:
        super().__init__(context)
        self.service: DGSService | None = None
        self.stale_reason: str | None = None  # set when DGS can no longer serve the graph
        self.dgs_batches = 0  # batches sampled by DGS (the rest locally)

    def start(self, batches: BatchSource) -> None:
        """Start the DGS workers on the current graph, then the local stages."""
        ctx = self.context
        deploy = ctx.config.deploy
        ctx.graph.acquire_read()  # no update between the copy and the subscription
        try:
            indptr, indices = ctx.graph.csr()
            start = time.perf_counter()
            self.service = DGSService(
                indptr,
                indices,
                list(ctx.planner.default),
                n_sampling=deploy.workers,
                n_serving=deploy.workers,
                seed=ctx.config.sampler.seed,
            )
            if ctx.updates is not None:
                ctx.updates.subscribe(self)
        finally:
            ctx.graph.release_read()
        log.info(
            "DGS: %d sampling + %d serving workers ready in %.1f s (fanouts %s)",
            deploy.workers,
            deploy.workers,
            time.perf_counter() - start,
            list(ctx.planner.default),
        )
        super().start(batches)

    def stop(self, timeout_s: float = 30.0) -> None:
        """Drain the local stages, then stop the DGS workers."""
        super().stop(timeout_s)
        service, self.service = self.service, None
        if service is not None:
            service.shutdown()

    def sample(self, batch: Batch) -> SampledSubgraph:
        """DGS look-ups for default-fanout batches while DGS serves the graph; else (also for a
        request's own seed) local."""
        planner = self.context.planner
        default = (batch.fanouts or planner.default) == planner.default  # what workers keep
        seeded = batch.rng_seed is not None  # a seed keys on-demand draws: sampled locally
        if self.service is None or self.stale_reason is not None or seeded or not default:
            return super().sample(batch)
        self.dgs_batches += 1
        return self.service.sample(batch.seeds)

    @classmethod
    def start_early(cls, config: ServeConfig) -> None:
        """Start Ray (one CPU per worker) while the store loads."""
        start_ray_early(2 * config.deploy.workers)

    def warm_up(self) -> dict[str, float]:
        """DGS look-ups on every serving worker and across them (``DGSService.warm_up``)."""
        if self.service is None or self.service.num_nodes == 0:
            return {}
        start = time.perf_counter()
        self.service.warm_up()
        return {"sample": (time.perf_counter() - start) * 1e3}

    def describe(self) -> dict[str, object]:
        """Workers, batches sampled by DGS, and why DGS stopped serving (if it did)."""
        return {
            "deploy": self.name,
            "workers": self.context.config.deploy.workers,
            "dgs_batches": self.dgs_batches,
            "replaced_workers": 0 if self.service is None else self.service.replaced,
            "stale": self.stale_reason,
        }

    # UpdateListener (graph.events): called under the store's writer lock -------------------
    def on_add_nodes(self, count: int) -> None:
        """DGS holds a fixed vertex set: from now on every batch samples locally."""
        self._give_up(f"an update added {count} node(s); DGS serves a fixed vertex set")

    def on_edge_events(
        self, kinds: np.ndarray, srcs: np.ndarray, dsts: np.ndarray, neighbors_of: NeighborsOf
    ) -> None:
        """Apply the batch's edge events on the workers before the writer is answered."""
        if self.service is None or self.stale_reason is not None:
            return
        try:
            self.service.apply_events(kinds, srcs, dsts)
        except Exception as exc:  # noqa: BLE001 - a listener must not raise (graph.events)
            self._give_up(f"DGS could not apply an update batch: {exc}")

    def _give_up(self, reason: str) -> None:
        if self.stale_reason is None:
            self.stale_reason = reason
            log.warning("%s: batches sample locally from now on", reason)
