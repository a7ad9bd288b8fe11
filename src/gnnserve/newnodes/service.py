"""The serving path of new-node requests (OMEGA): checked at submit, run on one worker thread.

A request carries nodes the graph does not hold (features and edges). It is validated when
submitted (typed errors, nothing queued), admitted under the admission shared with every other
request (in-flight bound, predicted delay, deadline), then answered by
:class:`~gnnserve.newnodes.inference.NewNodeInference` on a dedicated thread while it holds the
graph's read lock. Precomputed embeddings (PEs) are re-checked against the graph version under
that lock: once the store has changed they are stale and the request is refused (409), never
answered from stale PEs.

:class:`NewNodeService` receives its collaborators (model runner, graph, features, PEs, the
shared admission and this queue's backlog); the engine builds it. It sits below the engine and
imports nothing from it: what it needs of admission and of the backlog is written down as the
protocols :class:`SharedAdmission` and :class:`WorkBacklog`.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import torch

from gnnserve.config import AdmissionConfig, EmbeddingsConfig
from gnnserve.embeddings.base import EmbeddingStore
from gnnserve.errors import (
    DeadlineExceededError,
    GnnServeError,
    InvalidInputError,
    MissingEmbeddingsError,
    ShuttingDownError,
    StaleEmbeddingsError,
)
from gnnserve.features.base import FeatureStore
from gnnserve.graph.base import GraphStore
from gnnserve.models.runner import ModelRunner
from gnnserve.newnodes.inference import MODES, NewNodeInference
from gnnserve.newnodes.parse import parse_new_nodes, parse_output
from gnnserve.newnodes.result import NewNodeResult, RunOptions, check_run_options
from gnnserve.types import InferenceResult, NewNodes, OutputKind, StageTimings

log = logging.getLogger(__name__)

_STOP = object()  # closes the worker's queue


def check_embeddings(pes: EmbeddingStore, model_version: str, graph: GraphStore) -> None:
    """Raise StaleEmbeddingsError unless ``pes`` hold this model on the graph's current content.

    A store served with an update log and no batch applied yet (version ``<checksum>.0``) has
    the content of its base store, so PEs computed on the base store (``<checksum>``) match it.
    """
    version = graph.version
    if graph.mutable and version == f"{pes.meta.graph_version}.0":
        version = pes.meta.graph_version
    try:
        pes.check(model_version, version)
    except StaleEmbeddingsError as exc:
        if not graph.mutable or exc.field != "graph_version":
            raise
        raise StaleEmbeddingsError(
            f"{exc.message} with --update-log (the served log) to include the updates",
            exc.field,
        ) from None
    if pes.meta.num_nodes != graph.num_nodes:  # same version string, yet another graph
        raise StaleEmbeddingsError(
            f"precomputed embeddings hold {pes.meta.num_nodes} nodes, the graph has "
            f"{graph.num_nodes}; run `gnnserve precompute` again",
            "graph_version",
        )


@dataclass
class NewNodePrediction(InferenceResult):
    """The answer to a new-node request; ``nodes`` are the request indices 0..m-1.

    ``gamma`` and ``policy`` are those the mode used: None where it does not use them (``full``,
    ``ns``; ``pe`` recomputes nothing, gamma 0). Timings: ``sample_ms`` is the plan (computation
    graph) time, ``fetch_ms`` the feature and PE gather, ``batch_size`` the number of new nodes.
    """

    mode: str = ""
    gamma: float | None = None
    policy: str | None = None
    num_candidates: int = 0  # |R|: existing nodes with an edge from a new node
    recomputed_nodes: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    logits: torch.Tensor = field(default_factory=lambda: torch.empty(0))  # [m, C]
    embedding: torch.Tensor = field(default_factory=lambda: torch.empty(0))  # [m, H]

    @property
    def new_nodes(self) -> int:
        """m: the number of new nodes answered."""
        return int(self.nodes.size)

    @property
    def recomputed(self) -> int:
        """Number of existing nodes whose PEs were recomputed for this request."""
        return int(self.recomputed_nodes.size)

    def as_output(self, output: str | OutputKind) -> torch.Tensor:
        """The values of another output kind (no recomputation): labels, probs or embeddings."""
        rows = np.arange(self.new_nodes, dtype=np.int64)
        return ModelRunner.shape_output(parse_output(output), self.logits, self.embedding, rows)


@dataclass(frozen=True)
class NewNodeRequest:
    """A validated, admitted new-node request."""

    new: NewNodes
    output: OutputKind
    mode: str
    options: RunOptions
    request_id: int
    arrival_s: float  # perf_counter() at submit
    deadline_s: float  # perf_counter() time after which it is dropped unanswered


def _used(mode: str, options: RunOptions) -> tuple[float | None, str | None]:
    """(gamma, policy) that ``mode`` actually uses."""
    if mode == "srpe":
        return options.gamma, options.policy
    return (0.0, None) if mode == "pe" else (None, None)


class WorkBacklog(Protocol):
    """What the service reports of its queue to admission's delay prediction (units: new nodes;
    one request per run). ``gnnserve.engine.delay.Backlog(None, halflife)`` implements it."""

    def enqueue(self, units: int) -> None:
        """A request of ``units`` was admitted to the queue."""

    def dequeue(self, units: int) -> None:
        """A queued request left without running (cancelled)."""

    def started(self, units: int, requests: int, formed_s: float) -> int:
        """Queued work began to run at ``formed_s`` (perf_counter seconds); returns a token."""

    def finished(self, token: int, done_s: float, ok: bool = True) -> None:
        """Run ``token`` ended at ``done_s``; a successful one trains the prediction."""


class SharedAdmission(Protocol):
    """The admission the service shares with the engine (``gnnserve.engine.admission.Admission``):
    one in-flight bound, one id sequence, deadlines and shutdown for every kind of request."""

    config: AdmissionConfig

    @property
    def closed(self) -> bool:
        """True once shutdown began."""

    def deadline(self, now: float) -> float:
        """perf_counter() deadline of a request admitted at ``now``."""

    def reserve(self, future: Future[Any], backlog: Any, units: int, deadline: float) -> None:
        """Count ``future`` in flight until done, or raise OverloadedError / ShuttingDownError."""

    def next_id(self) -> int:
        """A fresh request id."""


class ReadLock(Protocol):
    """Pins the graph's content while a request reads it (the graph itself, or its read view)."""

    def acquire_read(self) -> str:
        """Pin the current version; returns it."""

    def release_read(self) -> None:
        """End a read started with ``acquire_read``."""


RunNewNodes = Callable[[NewNodeInference, NewNodes, str, RunOptions], NewNodeResult]


def run_locally(
    local: NewNodeInference, new: NewNodes, mode: str, options: RunOptions
) -> NewNodeResult:
    """Run a new-node request with the single-process inference (the default ``run``)."""
    o = options
    return local.run(new, mode, o.gamma, o.policy, o.fanouts, o.seed)


class NewNodeService:
    """Queue and worker thread answering new-node requests with :class:`NewNodeInference`.

    ``runner`` holds the served model and its version, ``graph`` / ``features`` the stored graph
    (``reads`` pins its content per request; default the graph itself), ``embeddings`` the PEs
    (checked at start-up); when None, every request is refused with ``unavailable`` (409).
    ``admission`` is shared with the existing-node path; ``backlog`` accounts for this queue in
    its delay predictions. ``config`` gives the default mode, gamma and policy and the limit on
    new nodes per request. The :class:`NewNodeInference` is built on first use; ``run`` answers
    each admitted request with it (default :func:`run_locally`; an executor may run some modes
    elsewhere, e.g. CGP workers).
    """

    def __init__(
        self,
        runner: ModelRunner,
        graph: GraphStore,
        features: FeatureStore,
        embeddings: EmbeddingStore | None,
        admission: SharedAdmission,
        backlog: WorkBacklog,
        config: EmbeddingsConfig,
        *,
        reads: ReadLock | None = None,
        unavailable: GnnServeError | None = None,
        run: RunNewNodes = run_locally,
    ) -> None:
        self.runner = runner
        self.graph = graph
        self.features = features
        self.embeddings = embeddings
        self.admission = admission
        self.backlog = backlog
        self.config = config
        self.reads: ReadLock = graph if reads is None else reads
        self.unavailable = unavailable
        self._run_request = run
        bound = admission.config.max_queue_requests + 1  # admission bounds it; +1: STOP
        self._queue: queue.Queue[object] = queue.Queue(bound)
        self._lock = threading.Lock()  # admit + enqueue vs. stop: nothing lands after STOP
        self._inference: NewNodeInference | None = None
        self._inference_lock = threading.Lock()
        self._thread: threading.Thread | None = None

    # lifecycle -------------------------------------------------------------------------------
    def start(self) -> None:
        """Start the worker thread (idempotent)."""
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._loop, name="gnnserve-newnodes", daemon=True
                )
                self._thread.start()

    def stop(self, timeout_s: float = 30.0) -> None:
        """Answer every accepted request, then end the worker (admission must be closed)."""
        with self._lock:
            thread, self._thread = self._thread, None
            if thread is not None:
                self._queue.put(_STOP)
        if thread is not None:
            thread.join(timeout_s)

    def inference(self) -> NewNodeInference:
        """The single-process new-node engine over the served model, graph, features and PEs."""
        with self._inference_lock:
            if self._inference is None:
                self._inference = NewNodeInference(
                    self.runner.model,
                    self.graph,
                    self.features,
                    self._pes(),
                    max_new_nodes=self.config.max_new_nodes,
                )
            return self._inference

    # requests --------------------------------------------------------------------------------
    def submit(
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
        """Validate and admit a request; its future resolves to a :class:`NewNodePrediction`.

        Raises (nothing queued) ShuttingDownError, MissingEmbeddingsError /
        StaleEmbeddingsError (no usable PEs), InvalidInputError / TooManyNodesError naming the
        field, OverloadedError (admission bound reached).
        """
        cfg, admission = self.config, self.admission
        if admission.closed:
            raise ShuttingDownError("server is shutting down")
        pes = self._pes()
        kind = parse_output(output)
        mode = cfg.mode if mode is None else mode
        if not isinstance(mode, str) or mode not in MODES.names():
            raise InvalidInputError(f"unknown mode {mode!r}; choose one of {MODES.names()}", "mode")
        options = check_run_options(
            cfg.gamma if gamma is None else gamma,
            cfg.policy if policy is None else policy,
            fanouts,
            seed,
            int(self.runner.model.config.num_layers),
        )
        new = parse_new_nodes(
            features,
            edges,
            new_edges,
            num_nodes=self.graph.num_nodes,
            feature_dim=self.features.dim,
            max_new_nodes=cfg.max_new_nodes,
        )
        check_embeddings(pes, self.runner.version, self.graph)  # early answer; re-checked when run
        future: Future[NewNodePrediction] = Future()
        with self._lock:
            now = time.perf_counter()
            deadline = admission.deadline(now)
            admission.reserve(future, self.backlog, new.count, deadline)
            self.backlog.enqueue(new.count)
            request = NewNodeRequest(new, kind, mode, options, admission.next_id(), now, deadline)
            self._queue.put((request, future))
        return future

    def _pes(self) -> EmbeddingStore:
        if self.embeddings is None:
            raise self.unavailable or MissingEmbeddingsError(
                "no precomputed embeddings: run `gnnserve precompute`, then serve with them",
                "new_nodes",
            )
        return self.embeddings

    # worker ----------------------------------------------------------------------------------
    def _loop(self) -> None:
        if self.embeddings is not None:
            self._warm_up()
        while True:
            item = self._queue.get()
            if item is _STOP:
                return
            assert isinstance(item, tuple)
            request, future = item
            if not future.set_running_or_notify_cancel():
                self.backlog.dequeue(request.new.count)
                continue  # the caller gave up while it waited
            token = self.backlog.started(request.new.count, 1, time.perf_counter())
            try:
                result = self._run(request)
            except BaseException as exc:  # noqa: BLE001 - reported to the caller
                self.backlog.finished(token, time.perf_counter(), ok=False)
                if not isinstance(exc, GnnServeError):
                    log.exception("new-node request failed", exc_info=exc)
                    exc = GnnServeError(f"internal error: {type(exc).__name__}: {exc}")
                future.set_exception(exc)
                continue
            self.backlog.finished(token, time.perf_counter())  # before the answer, as batches
            future.set_result(result)

    def _warm_up(self) -> None:
        """Build the overlay and importance scores before the first request needs them."""
        self.reads.acquire_read()  # a mutable store must not change while its copy is taken
        try:
            _ = self.inference().importance
        except Exception:  # noqa: BLE001 - requests will report the same error
            log.exception("could not prepare new-node inference")
        finally:
            self.reads.release_read()

    def _run(self, request: NewNodeRequest) -> NewNodePrediction:
        start = time.perf_counter()
        if start > request.deadline_s:
            raise DeadlineExceededError("request expired in the queue")
        opts, runner = request.options, self.runner
        graph_version = self.reads.acquire_read()
        try:
            check_embeddings(self._pes(), runner.version, self.graph)
            out = self._run_request(self.inference(), request.new, request.mode, opts)
        finally:
            self.reads.release_read()
        logits, embedding = out.logits.cpu(), out.embedding.cpu()
        m = request.new.count
        values = runner.shape_output(request.output, logits, embedding, np.arange(m))
        gamma, policy = _used(request.mode, opts)
        timings = StageTimings(
            queue_ms=(start - request.arrival_s) * 1e3,
            sample_ms=out.timings.plan_ms,
            fetch_ms=out.timings.fetch_ms,
            compute_ms=out.timings.compute_ms,
            total_ms=(time.perf_counter() - request.arrival_s) * 1e3,
            batch_size=m,
        )
        return NewNodePrediction(
            request.request_id,
            np.arange(m, dtype=np.int64),
            request.output,
            values,
            runner.version,
            graph_version,
            timings,
            mode=request.mode,
            gamma=gamma,
            policy=policy,
            num_candidates=int(out.num_candidates),
            recomputed_nodes=np.asarray(out.recomputed, dtype=np.int64),
            logits=logits,
            embedding=embedding,
        )
