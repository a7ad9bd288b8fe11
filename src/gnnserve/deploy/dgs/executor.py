"""DGSExecutor (``deploy.mode: dgs``): batches sample from DGS serving workers.

The local pipeline (:class:`~gnnserve.engine.local.LocalExecutor`) with its sampling stage
routed: a batch with the default fanouts (``sampler.fanouts``) is sampled by
:class:`~gnnserve.deploy.dgs.service.DGSService` look-ups in the serving workers' caches
(``deploy.workers`` sampling and serving workers, Ray actors); other fanouts sample locally.
Feature gather and the model run here. A DGS sample equals the pre-sampler's for the same
``sampler.seed`` and update sequence, so answers equal ``local`` with ``sampler.presample``.

With an update log, the workers consume the store's log themselves (DGS's event stream); the
executor is a :class:`~gnnserve.graph.events.PublishListener`: once a batch is durable it tells
the service to bring the workers to it, before readers can pin the batch's version. Nodes that
updates add join the workers' key ranges. A batch's sample reports the update batch it
reflects; the batch then reads features (and reports its version) at that same batch: when the
version it pinned differs (a batch published in between), it pins again, and after a few tries
samples locally. A sampling worker that dies is rebuilt from its checkpoint and replays the log
(``DGSService`` module doc); only a failure DGS cannot recover from makes every later batch
sample locally (logged once; answers stay correct).

A serving worker that dies is replaced by the service; the batch that met the death gets 503
``worker_failed`` with a retry hint, and DGS goes on serving.
"""

from __future__ import annotations

import logging
import time

from gnnserve.config import ServeConfig
from gnnserve.deploy.dgs.feed import LogSource, Position
from gnnserve.deploy.dgs.service import DGSService
from gnnserve.deploy.ray import start_ray_early
from gnnserve.dynamic.wal import record_offset
from gnnserve.engine.batcher import Batch
from gnnserve.engine.executor import BatchSource, ExecutionContext
from gnnserve.engine.local import LocalExecutor
from gnnserve.types import SampledSubgraph

log = logging.getLogger(__name__)
PIN_TRIES = 8  # pins tried for a DGS sample at the pinned version before sampling locally


class DGSExecutor(LocalExecutor):
    """LocalExecutor whose default-fanout batches sample from DGS serving workers."""

    name = "dgs"

    def __init__(self, context: ExecutionContext) -> None:
        super().__init__(context)
        self.service: DGSService | None = None
        self.stale_reason: str | None = None  # set when DGS can no longer serve the graph
        self.dgs_batches = 0  # batches sampled by DGS (the rest locally)
        self.misaligned = 0  # batches sampled locally: no DGS answer at their pinned version

    def start(self, batches: BatchSource) -> None:
        """Start the DGS workers on the current graph, then the local stages."""
        ctx = self.context
        deploy = ctx.config.deploy
        version = ctx.graph.acquire_read()  # the version the workers start from
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
                log=self._log_source(version),
            )
        finally:
            ctx.graph.release_read()
        if ctx.updates is not None:
            ctx.updates.subscribe(self)
            store = ctx.updates.graph  # batches since the pin: the workers read them now
            self.service.advance(store.seq, store.num_nodes)
        log.info(
            "DGS: %d sampling + %d serving workers ready in %.1f s (fanouts %s)",
            deploy.workers,
            deploy.workers,
            time.perf_counter() - start,
            list(ctx.planner.default),
        )
        super().start(batches)

    def _log_source(self, version: str) -> LogSource | None:
        """The store's update log, from the record after ``version`` (None: no log)."""
        updates = self.context.updates
        if updates is None or updates.log is None:
            return None
        seq = _seq(version)
        path = updates.log.path
        return LogSource(path, Position(seq, record_offset(path, seq + 1)), updates.features.dim)

    def stop(self, timeout_s: float = 30.0) -> None:
        """Drain the local stages, then stop the DGS workers."""
        super().stop(timeout_s)
        service, self.service = self.service, None
        if service is not None:
            service.shutdown()

    def sample(self, batch: Batch) -> SampledSubgraph:
        """DGS look-ups for default-fanout batches while DGS serves the graph, at the batch's
        pinned version; else (also for a request's own seed) local."""
        planner = self.context.planner
        default = (batch.fanouts or planner.default) == planner.default  # what workers keep
        seeded = batch.rng_seed is not None  # a seed keys on-demand draws: sampled locally
        if self.service is None or self.stale_reason is not None or seeded or not default:
            return super().sample(batch)
        for _ in range(PIN_TRIES):
            version, subgraph = self.service.sample_at(batch.seeds)
            if self.context.updates is None or version == _seq(batch.graph_version):
                self.dgs_batches += 1
                batch.path = "dgs"
                return subgraph
            self._repin(batch)
        self.misaligned += 1
        return super().sample(batch)

    def _repin(self, batch: Batch) -> None:
        """Pin the newest version instead (a batch was published since the pin)."""
        graph = self.context.graph
        graph.release_read()
        time.sleep(0)  # the writer flips right after the workers committed
        batch.graph_version = graph.acquire_read()

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
            "misaligned_batches": self.misaligned,
            "rebuilt_workers": 0 if self.service is None else self.service.rebuilt,
            "replaced_workers": 0 if self.service is None else self.service.replaced,
            "stale": self.stale_reason,
        }

    # PublishListener (graph.events): called by the writer, before the batch is visible ------
    def on_published(self, seq: int, num_nodes: int) -> None:
        """Bring the workers to batch ``seq`` (they read it from the log)."""
        if self.service is None or self.stale_reason is not None:
            return
        try:
            self.service.advance(seq, num_nodes)
        except Exception as exc:  # noqa: BLE001 - a listener must not raise (graph.events)
            self._give_up(f"DGS could not apply update batch {seq}: {exc}")

    def _give_up(self, reason: str) -> None:
        if self.stale_reason is None:
            self.stale_reason = reason
            log.warning("%s: batches sample locally from now on", reason)


def _seq(version: str) -> int:
    """The update batch of a dynamic store's version string ``<checksum>.<seq>``."""
    return int(version.rsplit(".", 1)[1])
