"""Dynamic batching: coalesce concurrent requests into one batch of seed nodes."""

from __future__ import annotations

import queue
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from gnnserve.config import BatcherConfig
from gnnserve.engine.admission import Ticket
from gnnserve.errors import DeadlineExceededError
from gnnserve.types import MiniBatch, SampledSubgraph

STOP = object()  # sentinel closing a stage queue


@dataclass
class Batch:
    """Requests riding together through the pipeline, and what each stage produced for them."""

    tickets: list[Ticket]  # the requests, in arrival order
    seeds: np.ndarray  # int64: the tickets' node ids concatenated (duplicates kept)
    formed_s: float  # perf_counter() when the batch closed
    fanouts: tuple[int, ...] | None = None  # every ticket's fanouts (None = default)
    graph_version: str = ""  # version the batch reads, pinned from sampling until fetched
    subgraph: SampledSubgraph | None = None  # set by the sample stage
    minibatch: MiniBatch | None = None  # set by the fetch stage
    stage_ms: dict[str, float] = field(default_factory=dict)  # per-stage wall time, ms


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
    ) -> None:
        self.config = config
        self.inbox = inbox
        self.cost = cost  # expected sampling work of some seeds (PSGS sum), for max_batch_cost
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
            deadline = item.request.deadline_s
            if deadline is not None and time.perf_counter() > deadline:
                item.future.set_exception(DeadlineExceededError("request expired in the queue"))
                continue
            return item

    def _cost(self, ticket: Ticket) -> float:
        if self.cost is None or self.config.max_batch_cost is None:
            return 0.0
        return self.cost(ticket.request.nodes)

    def next_batch(self) -> Batch | None:
        """Block for the first request, then fill the batch; None once stopped and drained."""
        first = self._take(timeout=None)
        if first is None:
            return None
        tickets = [first]
        size, cost = first.request.nodes.size, self._cost(first)
        max_cost = self.config.max_batch_cost or float("inf")
        close_at = time.perf_counter() + self.config.max_wait_ms / 1e3
        while size < self.config.max_batch_nodes and cost < max_cost:
            remaining = close_at - time.perf_counter()
            ticket = self._take(timeout=max(remaining, 0.0) if remaining > 0 else 0)
            if ticket is None:
                break
            extra = self._cost(ticket)
            if (
                size + ticket.request.nodes.size > self.config.max_batch_nodes
                or cost + extra > max_cost
                or ticket.request.fanouts != first.request.fanouts  # one sampler per batch
            ):
                self._carry = ticket
                break
            tickets.append(ticket)
            size += ticket.request.nodes.size
            cost += extra
        seeds = np.concatenate([t.request.nodes for t in tickets])
        return Batch(tickets, seeds, time.perf_counter(), fanouts=first.request.fanouts)
