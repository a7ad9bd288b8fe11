"""Engine: admission -> batcher -> sample -> fetch -> compute, with per-request futures.

Requests for new nodes (features and edges the graph does not hold) take their own path, see
:mod:`gnnserve.newnodes.service`.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future

import torch

from gnnserve.config import ServeConfig
from gnnserve.embeddings.base import EmbeddingStore
from gnnserve.engine.admission import Admission
from gnnserve.engine.batcher import STOP, Batch, Batcher, drop_expired
from gnnserve.engine.delay import Backlog
from gnnserve.engine.pipeline import Stage, fail_batch
from gnnserve.engine.planner import Planner
from gnnserve.engine.warmup import warm_up_engine
from gnnserve.errors import GnnServeError, ReadOnlyStoreError
from gnnserve.features.base import FeatureStore
from gnnserve.graph.base import GraphStore
from gnnserve.graph.dynamic_store import DynamicStore, UpdateResult
from gnnserve.models.runner import ModelRunner
from gnnserve.newnodes.service import NewNodePrediction, NewNodeService
from gnnserve.types import InferenceResult, MiniBatch, OutputKind, StageTimings

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
        self.runner = runner
        self.planner = Planner(graph, self.config.sampler, runner.model.config.num_layers)
        self.psgs = self.planner.psgs  # expected sampled nodes per seed (None: graph changes)
        if updates is not None and self.planner.presampler is not None:
            updates.attach(self.planner.presampler)
        self.admission = Admission(
            graph, self.config.admission, self.config.batcher.max_batch_nodes
        )
        self._inbox: queue.Queue[object] = queue.Queue()
        self.batcher = Batcher(
            self.config.batcher, self._inbox, self.planner.expected_size, self.admission.backlog
        )
        self.observers: list[Callable[[Batch], None]] = []  # called after each finished batch
        self._threads: list[threading.Thread] = []
        self._started = False
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
        )

    # lifecycle -------------------------------------------------------------------------------
    def start(self) -> Engine:
        """Start the stage threads (idempotent)."""
        if self._started:
            return self
        if self.config.compute.torch_threads is not None:
            torch.set_num_threads(self.config.compute.torch_threads)  # process-wide
        # at most pipeline_depth batches between batcher and result: while they are busy,
        # requests wait in the inbox and the next batch grows (adaptive batching)
        self._slots = threading.Semaphore(self.config.batcher.pipeline_depth)
        to_fetch: queue.Queue[object] = queue.Queue()
        to_compute: queue.Queue[object] = queue.Queue()
        release = self._release_slot
        self._threads = [
            threading.Thread(target=self._sample_loop, args=(to_fetch,), daemon=True),
            Stage("fetch", self._fetch, to_fetch, to_compute, release),
            Stage("compute", self._compute, to_compute, None, release),
        ]
        for t in self._threads:
            t.start()
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
        for t in self._threads:
            t.join(timeout_s)
        self._started = False
        if self.updates is not None:
            self.updates.close()

    @property
    def started(self) -> bool:
        """True while the stage threads run."""
        return self._started

    def warm_up(self) -> dict[str, float]:
        """Run every path of a default-fanout request once (see engine.warmup), then count as
        warm, also when it failed (logged; requests report the same error).

        An explicit start-up step, after ``start``: the app runs it before it reports ready.
        Returns the ms spent per step and in ``total`` (nothing when ``compute.warm_up`` is off:
        the engine then counts as warm at once).
        """
        try:
            return warm_up_engine(self) if self.config.compute.warm_up else {}
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
        """Apply a batch of graph updates (durable before it returns); see graph.updates."""
        if self.updates is None:
            raise ReadOnlyStoreError("this store is read-only: serve it with an update log", "ops")
        return self.updates.apply(ops)

    @property
    def queue_depth(self) -> int:
        """Requests admitted and not yet answered."""
        return self.admission.in_flight

    # stages --------------------------------------------------------------------------------
    def _sample_loop(self, outbox: queue.Queue[object]) -> None:
        """Batch and sample in one thread, so a batch closes only when sampling can take it."""
        while True:
            self._slots.acquire()
            batch = self.batcher.next_batch()
            if batch is None:
                break
            start = time.perf_counter()
            batch.graph_version = self.graph.acquire_read()  # released once features are read
            try:
                batch.subgraph = self.planner.sampler_for(batch.fanouts).sample(batch.seeds)
            except BaseException as exc:  # noqa: BLE001 - reported per request
                self.graph.release_read()
                fail_batch(batch, exc)
                self._release_slot(batch)
                continue
            batch.stage_ms["sample"] = (time.perf_counter() - start) * 1e3
            outbox.put(batch)
        outbox.put(STOP)

    def _release_slot(self, batch: Batch) -> None:
        self.batcher.finished(batch)  # trains admission's service-time model
        self._slots.release()

    def _fetch(self, batch: Batch) -> None:
        assert batch.subgraph is not None
        try:
            drop_expired(batch)  # 504 for requests past their deadline; none left: skip
            ids = batch.subgraph.input_nodes
            x = self.features.get(ids)
            in_degree = torch.from_numpy(self.graph.gcn_degree(ids))  # full-graph, for GCN
        finally:
            self.graph.release_read()
        batch.minibatch = MiniBatch(batch.subgraph, x, in_degree)

    def _compute(self, batch: Batch) -> None:
        assert batch.minibatch is not None and batch.subgraph is not None
        drop_expired(batch)
        start = time.perf_counter()
        logits, embedding = self.runner.forward(batch.minibatch)
        batch.stage_ms["compute"] = (time.perf_counter() - start) * 1e3
        self.batcher.finished(batch)  # before the answers: a caller's next request finds it done
        self._resolve(batch, logits, embedding)
        for observe in self.observers:
            observe(batch)

    def _resolve(self, batch: Batch, logits: torch.Tensor, embedding: torch.Tensor) -> None:
        assert batch.subgraph is not None
        rows = batch.subgraph.seed_rows
        offset = 0
        now = time.perf_counter()
        for ticket in batch.tickets:
            req = ticket.request
            mine = rows[offset : offset + req.nodes.size]
            offset += req.nodes.size
            try:
                values = self.runner.shape_output(req.output, logits, embedding, mine, req.nodes)
            except GnnServeError as exc:  # NaN/inf outputs: this request fails, not the batch
                if not ticket.future.done():
                    ticket.future.set_exception(exc)
                continue
            timings = StageTimings(
                queue_ms=(batch.formed_s - req.arrival_s) * 1e3,
                sample_ms=batch.stage_ms.get("sample", 0.0),
                fetch_ms=batch.stage_ms.get("fetch", 0.0),
                compute_ms=batch.stage_ms.get("compute", 0.0),
                total_ms=(now - req.arrival_s) * 1e3,
                batch_size=batch.subgraph.num_seeds,
            )
            result = InferenceResult(
                req.request_id,
                req.nodes,
                req.output,
                values,
                self.runner.version,
                batch.graph_version,
                timings,
            )
            if not ticket.future.done():
                ticket.future.set_result(result)
