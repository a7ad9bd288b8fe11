"""Engine: admission -> batcher -> executor, with per-request futures.

The executor (``ServeConfig.deploy.mode``, see :mod:`gnnserve.engine.executor`) runs each batch:
sample -> fetch -> compute in this process for ``local``. Requests for new nodes (features and
edges the graph does not hold) take their own queue, :mod:`gnnserve.newnodes.service`, and are
run by the same executor. Both kinds are one :class:`~gnnserve.types.Request`, validated once
(:mod:`gnnserve.engine.requests`), and answered with one :class:`~gnnserve.types.Result`.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING

import torch

from gnnserve.config import ServeConfig
from gnnserve.dynamic import bulk
from gnnserve.dynamic.columns import ColumnBatch
from gnnserve.dynamic.graph import requested_seq
from gnnserve.dynamic.json_scan import scan_edges
from gnnserve.dynamic.store import DynamicStore, UpdateResult
from gnnserve.embeddings.base import EmbeddingStore
from gnnserve.embeddings.refresher import PeRefresher
from gnnserve.engine.admission import Admission
from gnnserve.engine.answer_cache import AnswerCache
from gnnserve.engine.batcher import STOP, Batch, Batcher, cost_bound, slo_cap
from gnnserve.engine.delay import Backlog
from gnnserve.engine.executor import EXECUTORS, ExecutionContext, Executor
from gnnserve.engine.planner import Planner, serving_profile
from gnnserve.engine.requests import RequestLimits, request_fields, validate_request
from gnnserve.engine.warmup import log_warm_up, warm_up_engine
from gnnserve.errors import (
    GnnServeError,
    InvalidInputError,
    ReadOnlyStoreError,
    ShuttingDownError,
)
from gnnserve.features.base import FeatureStore
from gnnserve.graph.base import GraphStore
from gnnserve.models.runner import ModelRunner
from gnnserve.newnodes.service import NewNodeService
from gnnserve.types import OutputKind, Request, Result

if TYPE_CHECKING:
    from gnnserve.engine.placement import TierRefresher

log = logging.getLogger(__name__)


class Engine:
    """Serves predictions for existing nodes of one graph with one model, and for new nodes.

    Thread-safe: ``request`` builds a validated :class:`Request` (existing nodes or new ones),
    ``submit`` admits it from any thread; ``predict`` / ``predict_new_nodes`` block,
    ``apredict`` / ``apredict_new_nodes`` await. New-node requests need ``embeddings`` (the PEs
    of this model on this graph); without them they are refused with ``embeddings_error`` (409).
    """

    def __init__(
        self,
        graph: GraphStore,
        features: FeatureStore,
        runner: ModelRunner,
        config: ServeConfig | None = None,
        updates: DynamicStore | None = None,
        embeddings: EmbeddingStore | None = None,
        embeddings_error: GnnServeError | None = None,
        refresher: PeRefresher | None = None,
        planner: Planner | None = None,
        owns_store: bool = True,
    ) -> None:
        self.config = config or ServeConfig()
        self.updates = updates  # the mutable store behind graph/features, when there is one
        self.owns_store = owns_store  # False: another engine's (several models, one graph)
        self.graph = graph
        layers = runner.model.config.num_layers
        if planner is None:
            profile = serving_profile(self.config, graph, runner.version)  # routing / SLO
            planner = Planner(graph, self.config.sampler, layers, profile)
            if updates is not None and planner.presampler is not None:
                updates.subscribe(planner.presampler)  # built from this version's CSR
        elif planner.num_layers != layers:
            raise ValueError(f"a {planner.num_layers}-hop planner for a {layers}-layer model")
        self.planner = planner  # samplers, PSGS and pre-samples: shared by models alike
        self.psgs = self.planner.psgs  # expected sampled nodes per seed (None: graph changes)
        self.answer_cache = self._answer_cache(graph, runner, updates)
        self.admission = Admission(
            self.config.admission,
            self.config.batcher.max_batch_nodes,
            slo_ms=self.config.batcher.latency_slo_ms,
            slo_margin=self.config.batcher.psgs_bound == "strict",
        )
        self.limits = RequestLimits(
            graph,
            features.dim,
            runner.model.config.num_layers,
            self.config.admission.max_nodes_per_request,
            self.config.embeddings,
        )
        self._inbox: queue.Queue[object] = queue.Queue()
        bound = cost_bound(
            self.config.batcher, self.planner.profile, self.planner.parallel_threshold
        )
        batching = self.config.batcher.model_copy(update={"max_batch_cost": bound})
        profile, threshold = self.planner.profile, self.planner.parallel_threshold
        self.batcher = Batcher(
            batching, self._inbox, self.planner.expected_size, self.admission.backlog,
            slo_cap(self.config.batcher, profile, threshold),
        )  # fmt: skip
        self.observers: list[Callable[[Batch], None]] = []  # called after each finished batch
        self.on_stop: list[Callable[[], None]] = []  # background helpers' stops, after the drain
        self.tiers: TierRefresher | None = None  # re-places feature tiers from traffic, when on
        self.executor: Executor = EXECUTORS.create(
            self.config.deploy.mode,
            ExecutionContext(
                graph, features, runner, self.planner, self.config, updates, embeddings,
                self.observers,
            ),
        )  # fmt: skip
        self._started = False
        self._start_lock = threading.Lock()
        self._warm = threading.Event()  # set by warm_up: the server reports ready after it
        self.new_nodes = NewNodeService(
            runner,
            graph,
            features,
            embeddings,
            self.admission,
            Backlog(None, self.config.admission.service_halflife),  # one request per run
            self.config.embeddings,
            reads=graph,
            unavailable=embeddings_error,
            run=self.executor.run_new_nodes,
            fresh=refresher,
        )

    # lifecycle -------------------------------------------------------------------------------
    def start(self) -> Engine:
        """Start the executor and the new-node worker (idempotent)."""
        with self._start_lock:
            if self._started:
                return self
            if self.config.compute.torch_threads is not None:
                torch.set_num_threads(self.config.compute.torch_threads)  # process-wide
            self.executor.start(self.batcher)
            self.new_nodes.start()
            self._started = True
        return self

    def stop(self, timeout_s: float = 30.0) -> None:
        """Refuse new requests, finish every accepted one, then stop the threads."""
        self.admission.close()
        if not self._started:
            return
        self.new_nodes.stop(timeout_s)
        self._inbox.put(STOP)
        self.executor.stop(timeout_s)
        self._started = False
        for stop in self.on_stop:
            stop()
        if self.updates is not None and self.owns_store:
            self.updates.close()
        elif self.updates is not None and self.answer_cache is not None:
            self.updates.unsubscribe(self.answer_cache)  # the store serves other models on

    @property
    def runner(self) -> ModelRunner:
        """The served model: forward, version and output shaping (the executor's)."""
        return self.executor.context.runner

    @runner.setter
    def runner(self, runner: ModelRunner) -> None:
        """Run batches with ``runner`` from the next one on (tests wrap the model this way)."""
        self.executor.context.runner = runner

    @property
    def features(self) -> FeatureStore:
        """The served feature store (the executor's)."""
        return self.executor.context.features

    @features.setter
    def features(self, features: FeatureStore) -> None:
        """Read batches' features from ``features`` from the next batch on (a re-placed tiered
        store); new-node requests keep the store the engine was built with."""
        self.executor.context.features = features

    @property
    def started(self) -> bool:
        """True while the executor runs."""
        return self._started

    def warm_up(self) -> dict[str, float]:
        """Run every path of a default-fanout request once (see engine.warmup), then count as
        warm, also when it failed (logged; requests report the same error).

        An explicit start-up step, after ``start``: the app runs it before it reports ready.
        Returns the ms spent per step and in ``total`` (nothing when ``compute.warm_up`` is off:
        the engine then counts as warm at once).
        """
        try:
            if not self.config.compute.warm_up:
                return {}
            spent = warm_up_engine(self)
            for step, ms in self.executor.warm_up().items():
                spent[f"{self.executor.name} {step}"] = ms
                spent["total"] += ms
            log_warm_up(spent, self)
            return spent
        finally:
            self._warm.set()

    @property
    def warm(self) -> bool:
        """True once ``warm_up`` has run (what ``/v2/health/ready`` waits for)."""
        return self._warm.is_set()

    def __enter__(self) -> Engine:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # requests ------------------------------------------------------------------------------
    def request(
        self,
        nodes: object = None,
        new_nodes: object = None,
        *,
        output: object = "label",
        fanouts: object = None,
        mode: object = None,
        gamma: object = None,
        policy: object = None,
        seed: object = None,
        timeout_ms: object = None,
    ) -> Request:
        """A validated request (``engine.requests.validate_request`` with this engine's limits).

        ``nodes``: existing node ids; or ``new_nodes``: a NewNodes or a mapping of
        ``features`` [m, F], ``edges`` [E, 2] (new node index, existing node id) and
        ``new_edges`` [E2, 2]. ``fanouts`` (one per model layer, -1 = all neighbours) override
        the configured ones (new nodes: those of mode ``ns``); ``mode``, ``gamma``, ``policy``
        (new nodes) default to ``config.embeddings``; ``seed`` drives mode ``ns`` and the
        ``random`` policy; ``timeout_ms`` bounds the wait for the answer. A stopping engine
        refuses first (503), then one without usable PEs a new-node request (409), then a bad
        field (InvalidInputError / TooManyNodesError naming it).
        """
        if self.admission.closed:
            raise ShuttingDownError("server is shutting down")
        if nodes is None and new_nodes is not None:
            self.new_nodes.pes()  # 409 before the (possibly large) fields are read
        return validate_request(
            nodes,
            new_nodes,
            output=output,
            fanouts=fanouts,
            mode=mode,
            gamma=gamma,
            policy=policy,
            seed=seed,
            timeout_ms=timeout_ms,
            limits=self.limits,
        )

    def submit(self, request: Request) -> Future[Result]:
        """Admit ``request`` and return its future; raises typed errors when it is refused.

        A request not built by :meth:`request` (or ``validate_request`` with :attr:`limits`) is
        validated first.
        """
        if request.checked_by is not self.limits:
            request = self.request(**request_fields(request))
        if not self._started:
            self.start()
        if request.new is not None:
            return self.new_nodes.submit(request)
        cached = self.answer_cache is not None and self._full_neighbourhood(request)
        if cached:
            hit = self._cached(request)
            if hit is not None:
                return hit
        ticket = self.admission.admit(request)
        if cached:
            ticket.future.add_done_callback(self._keep_answer)
        self._inbox.put(ticket)
        return ticket.future

    # answer cache ----------------------------------------------------------------------------
    def _answer_cache(
        self, graph: GraphStore, runner: ModelRunner, updates: DynamicStore | None
    ) -> AnswerCache | None:
        mb = self.config.compute.result_cache_mb
        if mb <= 0:
            return None
        model = runner.model
        seq = (lambda: updates.graph.seq) if updates is not None else (lambda: 0)
        cache = AnswerCache(
            graph, int(mb * 2**20), model.config.num_layers, model.needs_degree, seq
        )
        if updates is not None:
            updates.subscribe(cache)
        return cache

    def _full_neighbourhood(self, request: Request) -> bool:
        fanouts = request.options.fanouts or self.planner.default
        return all(f == -1 for f in fanouts)

    def _cached(self, request: Request) -> Future[Result] | None:
        """A done future with the cached answer of ``request``, or None (a miss)."""
        assert self.answer_cache is not None
        runner = self.executor.context.runner
        result = self.answer_cache.answer(self.graph, request, runner.version, self.admission)
        if result is None:
            return None
        future: Future[Result] = Future()
        future.set_result(result)
        return future

    def _keep_answer(self, future: Future[Result]) -> None:
        if not future.cancelled() and future.exception() is None:
            assert self.answer_cache is not None
            self.answer_cache.keep(future.result())

    async def asubmit(self, request: Request) -> Result:
        """Awaitable :meth:`submit`, for asyncio servers."""
        return await asyncio.wrap_future(self.submit(request))

    def predict(
        self,
        nodes: object,
        output: str | OutputKind = "label",
        timeout_s: float | None = None,
        fanouts: object = None,
    ) -> Result:
        """Blocking prediction for ``nodes`` (existing node ids)."""
        request = self.request(nodes, output=output, fanouts=fanouts)
        return self.submit(request).result(timeout=timeout_s)

    async def apredict(
        self, nodes: object, output: str | OutputKind = "label", fanouts: object = None
    ) -> Result:
        """Awaitable prediction, for asyncio servers."""
        return await self.asubmit(self.request(nodes, output=output, fanouts=fanouts))

    def predict_new_nodes(
        self,
        features: object,
        edges: object,
        new_edges: object = None,
        output: str | OutputKind = "label",
        timeout_s: float | None = None,
        **options: object,
    ) -> Result:
        """Blocking prediction for new nodes (see :meth:`request`); ``options``: mode, gamma,
        policy, fanouts, seed, timeout_ms. ``result.new_nodes`` holds what the mode did."""
        new = {"features": features, "edges": edges, "new_edges": new_edges}
        request = self.request(new_nodes=new, output=output, **options)
        return self.submit(request).result(timeout=timeout_s)

    async def apredict_new_nodes(
        self,
        features: object,
        edges: object,
        new_edges: object = None,
        output: str | OutputKind = "label",
        **options: object,
    ) -> Result:
        """Awaitable :meth:`predict_new_nodes`, for asyncio servers."""
        new = {"features": features, "edges": edges, "new_edges": new_edges}
        request = self.request(new_nodes=new, output=output, **options)
        return await self.asubmit(request)

    def apply_updates(self, ops: object) -> UpdateResult:
        """Apply a batch of graph updates (durable before it returns); see dynamic.updates."""
        return self._store().apply(ops)

    def scan_edge_updates(self, body: bytes) -> ColumnBatch | None:
        """The columns of a JSON update body of plain edge operations (``dynamic.json_scan``),
        or None: another body, or a store that takes no updates."""
        if self.updates is None:
            return None
        return scan_edges(body, self.updates.features.dim)

    def apply_update_columns(self, batch: ColumnBatch) -> UpdateResult:
        """Apply one batch already in columns (validated here), durably."""
        return self._store().apply_columns(batch)

    def apply_bulk_updates(self, stream: bytes, max_bytes: int | None = None) -> UpdateResult:
        """Apply one batch sent as an Arrow IPC stream (``dynamic.bulk``), durably. With
        ``max_bytes`` a stream that expands beyond it once decoded is refused first (413)."""
        store = self._store()
        return store.apply_columns(bulk.read_stream(stream, max_bytes))

    def ensure_version(self, min_version: int | str) -> None:
        """Return once the graph holds the write that returned ``min_version`` (its ``seq``, or
        its ``graph_version``): read-your-writes across ``serve --workers``. InvalidInputError
        (``min_version``) for a version no write of this store returned."""
        seq = requested_seq(min_version, self.graph.meta.checksum)
        if self.updates is not None:
            self.updates.ensure_version(seq)
        elif seq > 0:
            raise InvalidInputError(
                f"min_version {seq}: this store takes no updates (serve it with --update-log)",
                "min_version",
            )

    def _store(self) -> DynamicStore:
        if self.updates is None:
            raise ReadOnlyStoreError("this store is read-only: serve it with an update log", "ops")
        return self.updates

    @property
    def queue_depth(self) -> int:
        """Requests admitted and not yet answered."""
        return self.admission.in_flight
