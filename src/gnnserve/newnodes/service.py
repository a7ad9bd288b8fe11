"""The serving path of new-node requests (OMEGA): admitted at submit, run on one worker thread.

A request carries nodes the graph does not hold (features and edges). It arrives validated
(``engine.requests.validate_request``: typed errors, nothing queued), is admitted under the
admission shared with every other request (in-flight bound, predicted delay, deadline), then
answered by
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
from typing import Any, Protocol

import numpy as np

from gnnserve.config import AdmissionConfig, EmbeddingsConfig
from gnnserve.embeddings.base import EmbeddingStore
from gnnserve.embeddings.refresher import PeRefresher
from gnnserve.errors import (
    DeadlineExceededError,
    GnnServeError,
    MissingEmbeddingsError,
    ShuttingDownError,
    StaleEmbeddingsError,
    internal_error,
)
from gnnserve.features.base import FeatureStore
from gnnserve.graph.base import GraphStore
from gnnserve.models.runner import ModelRunner
from gnnserve.newnodes.fresh import FreshEmbeddings, Pinned, ReadLock
from gnnserve.newnodes.inference import NewNodeInference
from gnnserve.newnodes.result import NewNodeResult, RunOptions, run_options
from gnnserve.types import NewNodeInfo, NewNodes, Request, Result, StageTimings, Ticket

log = logging.getLogger(__name__)

_STOP = object()  # closes the worker's queue


def base_version(pe_version: str, version: str) -> bool:
    """Whether ``pe_version`` is the base store of ``version`` (``<checksum>.<n>``): PEs
    computed before any logged batch (``<checksum>`` or ``<checksum>.0``). PEs at a later
    batch are not: a version names a batch count, not the log it came from, so another log's
    batch k would pass for this one's."""
    base = version.rpartition(".")[0]
    return bool(base) and pe_version in (base, f"{base}.0")


def check_embeddings(
    pes: EmbeddingStore, model_version: str, graph: GraphStore, catch_up: bool = False
) -> None:
    """Raise StaleEmbeddingsError unless ``pes`` hold this model on the graph's current content.

    A store served with an update log and no batch applied yet (version ``<checksum>.0``) has
    the content of its base store, so PEs computed on the base store (``<checksum>``) match it.
    ``catch_up`` (a PE refresher will bring them up to date from the replayed log): PEs of the
    base store are accepted at any version of its log.
    """
    version = graph.version
    if graph.mutable and version == f"{pes.meta.graph_version}.0":
        version = pes.meta.graph_version
    elif catch_up and graph.mutable and base_version(pes.meta.graph_version, version):
        pes.check(model_version, pes.meta.graph_version)  # the model must be this one
        if pes.meta.num_nodes > graph.num_nodes:
            raise StaleEmbeddingsError(
                f"precomputed embeddings hold {pes.meta.num_nodes} nodes, more than the graph's "
                f"{graph.num_nodes}; run `gnnserve precompute` again",
                "graph_version",
            )
        return
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

    def deadline(self, now: float, timeout_ms: float | None = None) -> float:
        """perf_counter() deadline of a request admitted at ``now`` (``timeout_ms``: the
        client's)."""

    def reserve(self, future: Future[Any], backlog: Any, units: int, deadline: float) -> None:
        """Count ``future`` in flight until done, or raise OverloadedError / ShuttingDownError."""

    def next_id(self) -> int:
        """A fresh request id."""


RunNewNodes = Callable[[NewNodeInference, NewNodes, str, RunOptions], NewNodeResult]


def run_locally(
    local: NewNodeInference, new: NewNodes, mode: str, options: RunOptions
) -> NewNodeResult:
    """Run a validated new-node request with the single-process inference (the default
    ``run``)."""
    return local.infer(new, mode, options)


class NewNodeService:
    """Queue and worker thread answering new-node requests with :class:`NewNodeInference`.

    ``runner`` holds the served model and its version, ``graph`` / ``features`` the stored graph
    (``reads`` pins its content per request; default the graph itself), ``embeddings`` the PEs
    (checked at start-up); when None, every request is refused with ``unavailable`` (409).
    ``admission`` is shared with the existing-node path; ``backlog`` accounts for this queue in
    its delay predictions. ``config`` gives the limit on new nodes per request (its defaults
    are filled in at validation, ``engine.requests``). The :class:`NewNodeInference` is built
    on first use; ``run`` answers each admitted request with it (default :func:`run_locally`;
    an executor may run some modes elsewhere, e.g. CGP workers). With ``fresh`` (a
    :class:`~gnnserve.embeddings.refresher.PeRefresher`), the PEs follow the graph: each request
    reads a (graph version, PE version) pair within ``config.pe_staleness`` batches
    (:mod:`.fresh`) and is never refused as stale.
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
        fresh: PeRefresher | None = None,
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
        # PEs that follow the graph (the refresher's versions) instead of fixed ones
        self.fresh = None
        if fresh is not None:
            nodes = lambda: graph.num_nodes  # noqa: E731 - the pinned version's, in the caller
            self.fresh = FreshEmbeddings(fresh, self.reads, nodes, config.pe_staleness)

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
                self._inference = self._build(self.pes())
            return self._inference

    # requests --------------------------------------------------------------------------------
    def submit(self, request: Request) -> Future[Result]:
        """Admit a validated new-node request; its future resolves to a :class:`Result` with
        ``new_nodes`` set.

        ``request`` comes from ``engine.requests.validate_request`` (options resolved against
        ``config``); it is not checked again. Raises (nothing queued) ShuttingDownError,
        MissingEmbeddingsError / StaleEmbeddingsError (no usable PEs), OverloadedError
        (admission bound reached).
        """
        new, admission = request.new, self.admission
        assert new is not None, "an existing-node request"
        if admission.closed:
            raise ShuttingDownError("server is shutting down")
        if self.fresh is None:  # fixed PEs: re-checked when run
            check_embeddings(self.pes(), self.runner.version, self.graph)
        future: Future[Result] = Future()
        with self._lock:
            now = time.perf_counter()
            deadline = admission.deadline(now, request.options.timeout_ms)
            admission.reserve(future, self.backlog, new.count, deadline)
            self.backlog.enqueue(new.count)
            self._queue.put(Ticket(request, admission.next_id(), now, deadline, future))
        return future

    def _build(self, pes: EmbeddingStore) -> NewNodeInference:
        return NewNodeInference(
            self.runner.model, self.graph, self.features, pes,
            max_new_nodes=self.config.max_new_nodes,
        )  # fmt: skip

    def pes(self) -> EmbeddingStore:
        """The precomputed embeddings; without them MissingEmbeddingsError (409), or the error
        the engine gave (``unavailable``)."""
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
            assert isinstance(item, Ticket) and item.request.new is not None
            ticket, m = item, item.request.new.count
            if not ticket.future.set_running_or_notify_cancel():
                self.backlog.dequeue(m)
                continue  # the caller gave up while it waited
            token = self.backlog.started(m, 1, time.perf_counter())
            try:
                result = self._run(ticket)
            except BaseException as exc:  # noqa: BLE001 - reported to the caller
                self.backlog.finished(token, time.perf_counter(), ok=False)
                if not isinstance(exc, GnnServeError):
                    log.exception("new-node request failed", exc_info=exc)
                    exc = internal_error(exc)
                ticket.future.set_exception(exc)
                continue
            self.backlog.finished(token, time.perf_counter())  # before the answer, as batches
            ticket.future.set_result(result)

    def _warm_up(self) -> None:
        """Build the overlay and importance scores before the first request needs them."""
        if self.fresh is not None:
            return  # built per (graph, PE) version, under each request's pin
        self.reads.acquire_read()  # a mutable store must not change while its copy is taken
        try:
            _ = self.inference().importance
        except Exception:  # noqa: BLE001 - requests will report the same error
            log.exception("could not prepare new-node inference")
        finally:
            self.reads.release_read()

    def _run(self, ticket: Ticket) -> Result:
        start = time.perf_counter()
        if ticket.deadline_s is not None and start > ticket.deadline_s:
            raise DeadlineExceededError("request expired in the queue")
        request, runner = ticket.request, self.runner
        new = request.new
        assert new is not None
        mode, opts = run_options(request.options)
        pinned: Pinned | None = None
        if self.fresh is not None:
            pinned = self.fresh.pin(ticket.deadline_s)  # holds the read
            graph_version = pinned.graph_version
        else:
            graph_version = self.reads.acquire_read()
        try:
            if pinned is None:
                check_embeddings(self.pes(), runner.version, self.graph)
                local = self.inference()
            else:
                assert self.fresh is not None
                local = self.fresh.inference(pinned, self._build)
            out = self._run_request(local, new, mode, opts)
        finally:
            self.reads.release_read()
        logits, embedding = out.logits.cpu(), out.embedding.cpu()
        m = new.count
        output = request.options.output
        values = runner.shape_output(output, logits, embedding, np.arange(m))
        gamma, policy = _used(mode, opts)
        timings = StageTimings(
            queue_ms=(start - ticket.arrival_s) * 1e3,
            sample_ms=out.timings.plan_ms,
            fetch_ms=out.timings.fetch_ms,
            compute_ms=out.timings.compute_ms,
            total_ms=(time.perf_counter() - ticket.arrival_s) * 1e3,
            batch_size=m,
        )
        info = NewNodeInfo(
            mode,
            gamma,
            policy,
            int(out.num_candidates),
            np.asarray(out.recomputed, dtype=np.int64),
            logits,
            embedding,
            None if pinned is None else pinned.published.graph_version,
            0 if pinned is None else pinned.lag,
        )
        nodes = np.arange(m, dtype=np.int64)
        return Result(
            ticket.request_id, nodes, output, values, runner.version, graph_version, timings, info
        )
