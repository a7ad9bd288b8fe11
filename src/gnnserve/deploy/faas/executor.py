"""FaaSExecutor (``deploy.mode: faas``): the gateway hands each batch to function instances.

The engine in front (admission, batcher, the HTTP API) is unchanged; every batch it forms is
one invocation of the serverless pipeline (:class:`~gnnserve.deploy.faas.service.FaaSService`):
a sample instance builds the computation graph from the published store at ``deploy.remote``,
an inference instance reads the features (adaptive cache) and runs the model. Instances start
on demand (cold starts), are scheduled by the load-aware scheduler (or the naive policy) and
scale to zero after ``deploy.keep_alive_s`` idle. Only default-fanout requests are served: the
instances sample with ``sampler.fanouts``.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import Future
from functools import partial

import numpy as np

from gnnserve.config import ServeConfig
from gnnserve.deploy.faas.function import FunctionSpec
from gnnserve.deploy.faas.metrics import FaaSMetrics
from gnnserve.deploy.faas.service import FaaSResult, FaaSService
from gnnserve.engine.batcher import Batch
from gnnserve.engine.executor import BatchSource, ExecutionContext, Executor
from gnnserve.engine.local import resolve_batch
from gnnserve.engine.pipeline import check_default_fanouts, fail_batch
from gnnserve.errors import InvalidInputError, StoreFormatError

log = logging.getLogger(__name__)


class FaaSExecutor(Executor):
    """Runs batches on serverless function instances (Ray actors) behind the gateway."""

    name = "faas"
    cold_start_note = (
        "function instances start cold on the first request that finds none warm "
        "(a cold start, as on a FaaS platform; kept warm --keep-alive-s after their last "
        "request; --min-instances N keeps N of each function warm from start-up)"
    )

    @classmethod
    def check_config(cls, config: ServeConfig) -> None:
        """Refuse a memory predictor beside the checkpoint that was profiled for another
        model or other fanouts than the server samples with, before the store loads (the
        instances would refuse it on every request)."""
        from gnnserve.models.memory import MemoryPredictor

        try:
            MemoryPredictor.load_if_present(config.model_path, config.sampler.fanouts)
        except StoreFormatError as exc:
            raise InvalidInputError(exc.message, "sampler.fanouts") from None

    def __init__(self, context: ExecutionContext) -> None:
        super().__init__(context)
        self.service: FaaSService | None = None
        self.metrics = FaaSMetrics()
        self._source: BatchSource | None = None
        self._thread: threading.Thread | None = None
        self._inflight: set[Future[FaaSResult]] = set()
        self._idle = threading.Condition()

    def spec(self) -> FunctionSpec:
        """The function spec from the serve config."""
        cfg = self.context.config
        deploy = cfg.deploy
        return FunctionSpec(
            remote=deploy.remote or cfg.store.path,
            model=cfg.model_path,
            fanouts=tuple(self.context.planner.default),
            fetch=deploy.fetch,
            cache=deploy.cache,
            memory_mb=deploy.memory_mb,
            seed=cfg.sampler.seed,
        )

    def start(self, batches: BatchSource) -> None:
        """Create the (empty) pools and the dispatch thread."""
        deploy = self.context.config.deploy
        self.service = FaaSService(
            self.spec(),
            policy=deploy.scheduler,
            keep_alive_s=deploy.keep_alive_s,
            max_instances=deploy.max_instances,
            sample_memory_mb=deploy.sample_memory_mb,
            launch=deploy.launch,
            mb_per_cpu=deploy.mb_per_cpu,
            min_instances=deploy.min_instances,
            cpu_budget=deploy.cpu_budget,
        )
        self._source = batches
        self._thread = threading.Thread(target=self._dispatch, name="faas-dispatch", daemon=True)
        self._thread.start()

    def _dispatch(self) -> None:
        assert self._source is not None and self.service is not None
        while True:
            batch = self._source.next_batch()
            if batch is None:
                return
            default = self.context.planner.default
            try:
                check_default_fanouts(
                    batch,
                    default,
                    f"the faas deployment: its instances sample with {list(default)}",
                )
            except InvalidInputError as error:
                self._finish(batch, error)
                continue
            batch.graph_version = self.context.graph.version
            future = self.service.submit(np.asarray(batch.seeds, dtype=np.int64), batch.rng_seed)
            with self._idle:
                self._inflight.add(future)
            future.add_done_callback(partial(self._answer, batch))

    def _answer(self, batch: Batch, future: Future[FaaSResult]) -> None:
        try:
            error = future.exception()
            if error is not None:
                self._finish(batch, error)
                return
            result = future.result()
            self.metrics.record(result)
            batch.subgraph = result.sample.subgraph
            batch.stage_ms.update(
                sample=result.sample.sample_ms,
                fetch=result.output.fetch_ms,
                compute=result.output.compute_ms,
            )
            assert self._source is not None
            self._source.finished(batch)
            resolve_batch(batch, self.context.runner, result.output.logits, result.output.embedding)
            for observe in self.context.observers:
                observe(batch)
        finally:
            with self._idle:
                self._inflight.discard(future)
                self._idle.notify_all()

    def _finish(self, batch: Batch, error: BaseException) -> None:
        assert self._source is not None
        self._source.finished(batch)
        fail_batch(batch, error)

    def stop(self, timeout_s: float = 30.0) -> None:
        """Wait for the batches in flight, then stop every instance."""
        if self._thread is not None:
            self._thread.join(timeout_s)
        with self._idle:
            self._idle.wait_for(lambda: not self._inflight, timeout_s)
        service, self.service = self.service, None
        if service is not None:
            service.shutdown()

    def warm_up(self) -> dict[str, float]:
        """Wait for ``--min-instances`` warm instances of each function (their cold starts ran
        their own warm-up request); nothing with the default 0: instances start cold on the
        first request, as on a FaaS platform."""
        if self.service is None or self.service.min_instances == 0:
            return {}
        start = time.perf_counter()
        timeout_s = self.context.config.deploy.timeout_s
        if not self.service.wait_min_warm(timeout_s):
            log.warning("faas: min instances not warm after %.0f s", timeout_s)
        return {"min_instances": (time.perf_counter() - start) * 1e3}

    def describe(self) -> dict[str, object]:
        """Instances by state, cold starts, queues, steals, cache and fetch counters."""
        about: dict[str, object] = {"deploy": self.name}
        if self.service is not None:
            about.update(self.metrics.snapshot(self.service))
        return about
