"""Dynamic batching: coalesce concurrent requests into one batch of seed nodes.

A batch closes at ``max_batch_nodes`` seeds or, when set, before its summed PSGS passes
``max_batch_cost``. With ``latency_slo_ms`` that cost cap comes from the calibration profile
(:func:`cost_bound`, Quiver §6 Fig. 10): PSGS-Strict inverts the served max-latency curve at the
SLO, PSGS-Loose the mean curve. The SLO counts from a request's arrival, so each batch's cap is
the curve inverted at what is left of the SLO of its oldest request once the pipeline is
predicted free (``slo_cap``): a batch that formed late, or that will wait behind others, takes
less work. Admission refuses (429) a request whose answer is predicted past the SLO.

The batcher also reports to the admission :class:`~gnnserve.engine.delay.Backlog` when requests
leave the queue and when batches leave the pipeline, which trains the service-time model.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import time
from collections.abc import Callable
from concurrent.futures import InvalidStateError
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from gnnserve.config import BatcherConfig
from gnnserve.engine.delay import Backlog
from gnnserve.errors import DeadlineExceededError, GnnServeError, InvalidInputError
from gnnserve.sampling.calibrate import CalibrationProfile, Stat, psgs_bound
from gnnserve.sampling.paths import NEVER
from gnnserve.types import MiniBatch, SampledSubgraph, Ticket

if TYPE_CHECKING:
    from gnnserve.engine.device_path import DeviceBatch

STOP = object()  # sentinel closing a stage queue
log = logging.getLogger(__name__)


def _fail(ticket: Ticket, exc: GnnServeError) -> None:
    """Resolve ``ticket`` with ``exc`` unless it is already done (or cancelled by its caller)."""
    with contextlib.suppress(InvalidStateError):
        ticket.future.set_exception(exc)


@dataclass
class Batch:
    """Requests riding together through the pipeline, and what each stage produced for them."""

    tickets: list[Ticket]  # the requests, in arrival order
    seeds: np.ndarray  # int64: the tickets' node ids concatenated (duplicates kept)
    formed_s: float  # perf_counter() when the batch closed
    fanouts: tuple[int, ...] | None = None  # every ticket's fanouts (None = default)
    rng_seed: int | None = None  # every ticket's sampling seed (None: fresh draws)
    graph_version: str = ""  # version the batch reads, pinned from sampling until fetched
    read_pin: object = None  # that pin, handed from the sample thread to the fetch thread
    subgraph: SampledSubgraph | None = None  # set by the sample stage (CPU paths)
    device: DeviceBatch | None = None  # set by the sample stage instead, on the device path
    path: str = ""  # the sampling path it took (sample stage): inline, parallel, presample, ...
    cost: float | None = None  # its summed PSGS under the default fanouts (None: not known)
    minibatch: MiniBatch | None = None  # set by the fetch stage
    stage_ms: dict[str, float] = field(default_factory=dict)  # per-stage wall time, ms
    token: int | None = None  # the batch's entry in the admission backlog

    @property
    def num_seeds(self) -> int | None:
        """Unique seeds of the sample taken (None before the sample stage)."""
        if self.subgraph is not None:
            return self.subgraph.num_seeds
        return None if self.device is None else self.device.sample.num_seeds


def cost_bound(
    config: BatcherConfig, profile: CalibrationProfile | None, threshold: float
) -> float | None:
    """A batch's cap on summed PSGS: ``config.max_batch_cost``, lowered with ``latency_slo_ms``
    to the largest PSGS whose served latency curve (inline below ``threshold``, parallel from
    it; max curve for ``psgs_bound: strict``, mean for ``loose``) stays within the SLO. A cap
    below the routing point ``threshold`` (no batch could go parallel) is logged as a warning
    naming both.

    An SLO without a current ``profile`` raises InvalidInputError naming
    ``batcher.latency_slo_ms``: an SLO that is silently not enforced would be a wrong answer.
    """
    slo = config.latency_slo_ms
    if slo is None:
        return config.max_batch_cost
    if profile is None:
        raise InvalidInputError(
            "--latency-slo-ms needs a current calibration profile for this machine, model, "
            "graph and fanouts (the log says why there is none): run `gnnserve calibrate "
            "--store DIR --model DIR` first",
            "batcher.latency_slo_ms",
        )
    stat: Stat = "max" if config.psgs_bound == "strict" else "mean"
    bound = psgs_bound(profile, slo, stat, threshold)
    smallest = min(c.psgs[0] for c in profile.curves.values())
    if bound <= smallest:
        log.warning("even the smallest calibrated batch takes over %.1f ms (%s)", slo, stat)
    if bound < threshold < NEVER:
        log.warning(
            "PSGS-%s cap %.0f (summed PSGS for %.1f ms) is below the routing point %.0f: no "
            "batch reaches the throughput path, routing is off. Raise --latency-slo-ms, use "
            "--psgs-bound loose, or route by a lower point",
            config.psgs_bound, bound, slo, threshold,
        )  # fmt: skip
    log.info(
        "PSGS-%s batching: summed PSGS per batch <= %.0f for %.1f ms (%s curve)",
        config.psgs_bound,
        bound,
        slo,
        stat,
    )
    return bound if config.max_batch_cost is None else min(bound, config.max_batch_cost)


def slo_cap(
    config: BatcherConfig, profile: CalibrationProfile | None, threshold: float
) -> Callable[[float], float] | None:
    """Milliseconds of SLO left -> the summed PSGS a batch may reach (the curve of
    :func:`cost_bound` inverted there); None without ``latency_slo_ms`` or a profile."""
    if config.latency_slo_ms is None or profile is None:
        return None
    stat: Stat = "max" if config.psgs_bound == "strict" else "mean"
    smallest = min(c.psgs[0] for c in profile.curves.values())

    def cap(left_ms: float) -> float:
        return psgs_bound(profile, left_ms, stat, threshold) if left_ms > 0 else smallest

    return cap


def drop_expired(batch: Batch) -> None:
    """Answer 504 to the requests of ``batch`` past their deadline, before a stage runs.

    Raises DeadlineExceededError when no request is left waiting: the stage skips the batch.
    """
    now = time.perf_counter()
    waiting = False
    for ticket in batch.tickets:
        if ticket.future.done():
            continue
        deadline = ticket.deadline_s
        if deadline is not None and now > deadline:
            _fail(ticket, DeadlineExceededError("request expired before its batch was computed"))
        else:
            waiting = True
    if not waiting:
        raise DeadlineExceededError("every request of the batch expired")


class Batcher:
    """Pulls tickets from ``inbox`` and closes a batch at ``max_batch_nodes`` or ``max_wait_ms``.

    With ``max_wait_ms = 0`` it is greedy: it takes whatever is already queued, so batches grow
    exactly when the pipeline is busy and a lone request never waits.
    """

    def __init__(
        self,
        config: BatcherConfig,
        inbox: queue.Queue[object],
        cost: Callable[[np.ndarray], float] | None = None,
        backlog: Backlog | None = None,
        slo_cap: Callable[[float], float] | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.config = config
        self.clock = clock  # seconds, perf_counter's scale: tickets' arrivals are on it
        self.slo_cap = slo_cap  # ms of SLO left when a batch starts -> its PSGS cap
        self.inbox = inbox
        self.cost = cost  # expected sampling work of some seeds (PSGS sum), for max_batch_cost
        self.backlog = backlog  # admission's account of queued and in-flight work
        self._carry: Ticket | None = None  # a ticket that did not fit the previous batch
        self.stopped = False

    def _take(self, timeout: float | None) -> Ticket | None:
        """Next live ticket, or None on timeout/stop; expired tickets are failed here."""
        while True:
            if self._carry is not None:
                ticket, self._carry = self._carry, None
                return ticket
            if self.stopped:
                return None
            try:
                item = self.inbox.get(timeout=timeout) if timeout != 0 else self.inbox.get_nowait()
            except queue.Empty:
                return None
            if item is STOP:
                self.stopped = True
                return None
            assert isinstance(item, Ticket)
            deadline = item.deadline_s
            expired = deadline is not None and self.clock() > deadline
            if expired or item.future.cancelled():  # cancelled: its caller went away
                if self.backlog is not None:
                    self.backlog.dequeue(int(item.nodes.size))
                _fail(item, DeadlineExceededError("request expired in the queue"))
                continue
            return item

    def _cost(self, ticket: Ticket) -> float:
        if self.cost is None or self.config.max_batch_cost is None:
            return 0.0
        return self.cost(ticket.nodes)

    def _max_cost(self, oldest: Ticket) -> float:
        """The cap on this batch's summed PSGS: ``max_batch_cost``, lowered by ``slo_cap`` at
        the SLO left to ``oldest`` when the batch is predicted to start (the pipeline free)."""
        static = self.config.max_batch_cost or float("inf")
        slo = self.config.latency_slo_ms
        if self.slo_cap is None or slo is None:
            return static
        now = self.clock()
        free = self.backlog.free_at(now) if self.backlog is not None else None
        start = now if free is None else free
        return min(static, self.slo_cap(slo - (start - oldest.arrival_s) * 1e3))

    def next_batch(self) -> Batch | None:
        """Block for the first request, then fill the batch; None once stopped and drained."""
        first = self._take(timeout=None)
        if first is None:
            return None
        tickets, fanouts = [first], first.request.options.fanouts
        rng_seed = first.request.options.seed
        size, cost = first.nodes.size, self._cost(first)
        max_cost = self._max_cost(first)
        close_at = self.clock() + self.config.max_wait_ms / 1e3
        while size < self.config.max_batch_nodes and cost < max_cost:
            remaining = close_at - self.clock()
            ticket = self._take(timeout=max(remaining, 0.0) if remaining > 0 else 0)
            if ticket is None:
                break
            extra = self._cost(ticket)
            if (
                size + ticket.nodes.size > self.config.max_batch_nodes
                or cost + extra > max_cost
                or ticket.request.options.fanouts != fanouts  # one sampler per batch
                or ticket.request.options.seed != rng_seed  # and one key of draws
            ):
                self._carry = ticket
                break
            tickets.append(ticket)
            size += ticket.nodes.size
            cost += extra
        seeds = np.concatenate([t.nodes for t in tickets])
        batch = Batch(tickets, seeds, self.clock(), fanouts=fanouts, rng_seed=rng_seed)
        if self.backlog is not None:
            batch.token = self.backlog.started(int(seeds.size), len(tickets), batch.formed_s)
        return batch

    def finished(self, batch: Batch) -> None:
        """``batch`` left the pipeline (answered or failed): report it to the backlog."""
        if self.backlog is not None and batch.token is not None:
            ok = "compute" in batch.stage_ms  # the model ran: its time is a service sample
            self.backlog.finished(batch.token, self.clock(), ok)
            batch.token = None
