"""Engine: admission -> batcher -> executor, with per-request futures.

The executor (``ServeConfig.deploy.mode``, see :mod:`gnnserve.engine.executor`) runs each batch:
sample -> fetch -> compute in this process for ``local``. Requests for new nodes (features and
edges the graph does not hold) take their own queue, :mod:`gnnserve.newnodes.service`, and are
run by the same executor.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future

import torch

from gnnserve.config import ServeConfig
from gnnserve.dynamic.store import DynamicStore, UpdateResult
from gnnserve.embeddings.base import EmbeddingStore
from gnnserve.engine.admission import Admission
from gnnserve.engine.batcher import STOP, Batch, Batcher
from gnnserve.engine.delay import Backlog
from gnnserve.engine.executor import EXECUTORS, ExecutionContext, Executor
from gnnserve.engine.planner import Planner
from gnnserve.engine.warmup import warm_up_engine
from gnnserve.errors import GnnServeError, ReadOnlyStoreError
from gnnserve.features.base import FeatureStore
from gnnserve.graph.base import GraphStore
from gnnserve.models.runner import ModelRunner
from gnnserve.newnodes.service import NewNodePrediction, NewNodeService
from gnnserve.types import InferenceResult, OutputKind

log = logging.getLogger(__name__)


class Engine:
    """Serves predictions for existing nodes of one graph with one model, and for new nodes.

    Thread-safe: ``submit`` may be called from any thread; ``predict`` blocks, ``apredict`` awaits
    (likewise ``submit_new_nodes``, ``predict_new_nodes``, ``apredict_new_nodes``). New-node
    requests need ``embeddings`` (the PEs of this model on this graph); without them they are
    refused with ``embeddings_error`` (409).
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
    ) -> None:
        self.config = config or ServeConfig()
        self.updates = updates  # the mutable store behind graph/features, when there is one
        self.graph = graph
        self.features = features
        self.planner = Planner(graph, self.config.sampler, runner.model.config.num_layers)
        self.psgs = self.planner.psgs  # expected sampled nodes per seed (None: graph changes)
        if updates is not None and self.planner.presampler is not None:
            updates.subscribe(self.planner.presampler)  # built from this version's CSR
        self.admission = Admission(
            graph, self.config.admission, self.config.batcher.max_batch_nodes
        )
        self._inbox: queue.Queue[object] = queue.Queue()
        self.batcher = Batcher(
            self.config.batcher, self._inbox, self.planner.expected_size, self.admission.backlog
        )
        self.observers: list[Callable[[Batch], None]] = []  # called after each finished batch
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
        if self.updates is not None:
            self.updates.close()

    @property
    def runner(self) -> ModelRunner:
        """The served model: forward, version and output shaping (the executor's)."""
        return self.executor.context.runner

    @runner.setter
    def runner(self, runner: ModelRunner) -> None:
        """Run batches with ``runner`` from the next one on (tests wrap the model this way)."""
        self.executor.context.runner = runner

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
    def submit(
        self, nodes: object, output: str | OutputKind = "label", fanouts: object = None
    ) -> Future[InferenceResult]:
        """Admit a request and return its future; raises typed errors for bad or excess input.

        ``fanouts`` (one per model layer, -1 = all neighbours) overrides the configured ones.
        """
        if not self._started:
            self.start()
        checked = None if fanouts is None else self.planner.check(fanouts)
        ticket = self.admission.admit(nodes, output, checked)
        self._inbox.put(ticket)
        return ticket.future

    def predict(
        self,
        nodes: object,
        output: str | OutputKind = "label",
        timeout_s: float | None = None,
        fanouts: object = None,
    ) -> InferenceResult:
        """Blocking prediction for ``nodes`` (existing node ids)."""
        return self.submit(nodes, output, fanouts).result(timeout=timeout_s)

    async def apredict(
        self, nodes: object, output: str | OutputKind = "label", fanouts: object = None
    ) -> InferenceResult:
        """Awaitable prediction, for asyncio servers."""
        return await asyncio.wrap_future(self.submit(nodes, output, fanouts))

    def submit_new_nodes(
        self,
        features: object,
        edges: object,
        new_edges: object = None,
        output: str | OutputKind = "label",
        mode: object = None,
        gamma: object = None,
        policy: object = None,
        fanouts: object = None,
        seed: object = 0,
    ) -> Future[NewNodePrediction]:
        """Admit a request for new nodes and return its future (see ``NewNodeService.submit``).

        ``features`` [m, F]; ``edges`` [E, 2] (new node index, existing node id); ``new_edges``
        [E2, 2] between new nodes. ``mode``, ``gamma`` and ``policy`` default to
        ``config.embeddings``; ``fanouts`` are those of mode ``ns``; ``seed`` drives its sampling
        and the ``random`` policy.
        """
        if not self._started:
            self.start()
        return self.new_nodes.submit(
            features, edges, new_edges, output, mode, gamma, policy, fanouts, seed
        )

    def predict_new_nodes(
        self,
        features: object,
        edges: object,
        new_edges: object = None,
        output: str | OutputKind = "label",
        timeout_s: float | None = None,
        **options: object,
    ) -> NewNodePrediction:
        """Blocking :meth:`submit_new_nodes`; ``options``: mode, gamma, policy, fanouts, seed."""
        future = self.submit_new_nodes(features, edges, new_edges, output, **options)
        return future.result(timeout=timeout_s)

    async def apredict_new_nodes(
        self,
        features: object,
        edges: object,
        new_edges: object = None,
        output: str | OutputKind = "label",
        **options: object,
    ) -> NewNodePrediction:
        """Awaitable :meth:`submit_new_nodes`, for asyncio servers."""
        future = self.submit_new_nodes(features, edges, new_edges, output, **options)
        return await asyncio.wrap_future(future)

    def apply_updates(self, ops: object) -> UpdateResult:
        """Apply a batch of graph updates (durable before it returns); see dynamic.updates."""
        if self.updates is None:
            raise ReadOnlyStoreError("this store is read-only: serve it with an update log", "ops")
        return self.updates.apply(ops)

    @property
    def queue_depth(self) -> int:
        """Requests admitted and not yet answered."""
        return self.admission.in_flight
