"""Admission control: bound the work in flight, stamp a validated request's deadline.

Requests arrive validated (:mod:`gnnserve.engine.requests`). A request is refused with 429
(OverloadedError) when ``max_queue_requests`` are in flight, when the work admitted ahead of it
is predicted to take longer than ``max_queue_delay_ms``, or when its answer is predicted to come
after its deadline or, with ``batcher.latency_slo_ms``, past that SLO (see
:mod:`gnnserve.engine.delay`; that prediction includes a margin
calibrated on the actual latencies of admitted requests). An engine with nothing queued or in
flight admits whatever the prediction. The deadline is ``timeout_s`` after admission, or earlier
when the caller set one: the HTTP layer sets it from the ``X-Timeout-Ms`` header through
:data:`REQUEST`, Python callers with the request's ``timeout_ms`` option or
:func:`request_timeout`.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from gnnserve.config import AdmissionConfig
from gnnserve.engine.delay import Backlog, Calibration, Prediction
from gnnserve.engine.requests import check_timeout_ms
from gnnserve.errors import OverloadedError, ShuttingDownError
from gnnserve.types import Request, Result, Ticket

__all__ = [
    "REQUEST",
    "TIMEOUT_HEADER",
    "Admission",
    "RequestContext",
    "Ticket",
    "parse_timeout_ms",
    "request_timeout",
]

TIMEOUT_HEADER = "X-Timeout-Ms"


@dataclass
class RequestContext:
    """A request seen by the HTTP layer: when it arrived and the deadline its caller set
    (perf_counter seconds). Admission fills in when it expects the answer; the HTTP layer then
    calibrates that expectation with the time the response was actually sent."""

    arrival_s: float
    deadline_s: float | None = None
    expected_s: float | None = None  # predicted answer time, set when admitted
    calibration: Calibration | None = None  # of the queue that admitted it

    def answered(self, now: float) -> None:
        """The response went out at ``now``: how late it was against the prediction."""
        if self.calibration is not None and self.expected_s is not None:
            self.calibration.observe(self.expected_s - self.arrival_s, now - self.arrival_s)


# set by the HTTP layer (server/shedding.py) for the request being handled; read by admission
REQUEST: ContextVar[RequestContext | None] = ContextVar("gnnserve_request", default=None)


def parse_timeout_ms(value: object) -> float:
    """A caller's timeout in ms, > 0 and finite; InvalidInputError naming the header otherwise."""
    return check_timeout_ms(value, TIMEOUT_HEADER)


@contextmanager
def request_timeout(timeout_ms: float) -> Iterator[None]:
    """Requests admitted in this block must be answered within ``timeout_ms`` from its start."""
    ms = parse_timeout_ms(timeout_ms)
    now = time.perf_counter()
    token = REQUEST.set(RequestContext(now, now + ms / 1e3))
    try:
        yield
    finally:
        REQUEST.reset(token)


class Admission:
    """Admission by in-flight bound, predicted queueing delay and deadline.

    ``backlog`` tracks the existing-node pipeline (greedy batches of ``max_batch_nodes`` seed
    nodes); other queues (new nodes) pass their own :class:`Backlog` to :meth:`reserve`.
    """

    def __init__(
        self,
        config: AdmissionConfig,
        max_batch_nodes: int | None = 1024,
        slo_ms: float | None = None,
        slo_margin: bool = True,
    ) -> None:
        self.config = config
        self.slo_ms = slo_ms  # batcher.latency_slo_ms: refuse answers predicted past it
        # PSGS-Strict adds the backlog's calibration margin to the SLO's prediction (the answer
        # must come in time); PSGS-Loose judges the mean prediction alone (in time on average)
        self.slo_margin = slo_margin
        self.backlog = Backlog(max_batch_nodes, config.service_halflife)
        self._in_flight = 0
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._closed = False

    @property
    def in_flight(self) -> int:
        """Admitted requests not yet resolved."""
        return self._in_flight

    @property
    def closed(self) -> bool:
        """True once shutdown began."""
        return self._closed

    def close(self) -> None:
        """Refuse every later request (graceful shutdown)."""
        self._closed = True

    def deadline(self, now: float, timeout_ms: float | None = None) -> float:
        """perf_counter() deadline of a request admitted at ``now``: ``timeout_s``, or earlier
        when the caller set one (``timeout_ms``, or the HTTP header through :data:`REQUEST`)."""
        deadline = now + self.config.timeout_s
        if timeout_ms is not None:
            deadline = min(deadline, now + timeout_ms / 1e3)
        ctx = REQUEST.get()
        if ctx is not None and ctx.deadline_s is not None:
            deadline = min(deadline, ctx.deadline_s)
        return deadline

    def admit(self, request: Request) -> Ticket:
        """Admit a validated existing-node request; raises ShuttingDownError / OverloadedError.

        The caller must put the ticket on the batcher's inbox (it is counted in ``backlog`` as
        queued).
        """
        if self._closed:
            raise ShuttingDownError("server is shutting down")
        size = request.size
        future: Future[Result] = Future()
        now = time.perf_counter()
        deadline = self.deadline(now, request.options.timeout_ms)
        self.reserve(future, self.backlog, size, deadline)
        self.backlog.enqueue(size)
        return Ticket(request, self.next_id(), now, deadline, future)

    def reserve(
        self,
        future: Future[Any],
        backlog: Backlog | None = None,
        units: int = 1,
        deadline: float | None = None,
    ) -> None:
        """Count ``future`` as in flight until it is done, or refuse it.

        Raises ShuttingDownError once closed; OverloadedError when ``max_queue_requests`` are
        already in flight (every kind of request shares the bound) or when ``backlog`` predicts
        too long a wait for ``units`` more (see :meth:`refusal`). An admitted request's actual
        latency calibrates ``backlog``'s predictions: when its future is done, or, over HTTP,
        when its response is sent (see :class:`RequestContext`).
        """
        if self._closed:
            raise ShuttingDownError("server is shutting down")
        now = time.perf_counter()
        predicted = None
        if backlog is not None:
            reason, predicted = self.refusal(backlog, units, now, deadline)
            if reason is not None:
                assert predicted is not None
                raise OverloadedError(reason, retry_after_s=predicted.wait_s)
        with self._lock:
            if self._in_flight >= self.config.max_queue_requests:
                raise OverloadedError(
                    f"queue full ({self.config.max_queue_requests} requests in flight); retry later"
                )
            self._in_flight += 1
        future.add_done_callback(self._release)
        if backlog is None or predicted is None:
            return
        ctx = REQUEST.get()
        if ctx is not None:  # calibrated on the HTTP answer (parsing and encoding included)
            ctx.calibration, ctx.expected_s = backlog.calibration, now + predicted.latency_s
            return
        calibration, latency = backlog.calibration, predicted.latency_s
        future.add_done_callback(lambda _: calibration.observe(latency, time.perf_counter() - now))

    def refusal(
        self, backlog: Backlog, units: int, now: float, deadline: float | None
    ) -> tuple[str | None, Prediction | None]:
        """Why a request of ``units`` arriving at ``now`` would be refused (None: admitted),
        and the raw prediction it was judged on (None while the model is not ready).

        Refused when the predicted queueing delay exceeds ``max_queue_delay_ms`` or the
        predicted answer, plus the backlog's calibration margin (at most half the time left),
        comes after ``deadline`` or past the latency SLO (``slo_ms``, when set; without the
        margin when ``slo_margin`` is off: PSGS-Loose). Never refused while ``backlog`` is idle.
        """
        predicted = backlog.predict(units, now)
        if predicted is None or backlog.idle:
            return None, predicted
        budget = self.config.max_queue_delay_ms
        if budget is not None:
            wait_ms = predicted.wait_s * 1e3
            if wait_ms > budget:
                return (
                    f"predicted queueing delay {wait_ms:.0f} ms exceeds the budget of "
                    f"{budget:g} ms; retry later",
                    predicted,
                )
        limits = []  # (seconds the answer may take, what that limit is, margin added)
        if self.slo_ms is not None:
            what = "past the latency SLO of {:g} ms (batcher.latency_slo_ms)"
            limits.append((self.slo_ms / 1e3, what, self.slo_margin))
        if deadline is not None:
            limits.append((deadline - now, "after the request's deadline (in {:.0f} ms)", True))
        for limit_s, what, margin in limits:
            extra = min(backlog.calibration.margin_s, limit_s / 2) if margin else 0.0
            latency = predicted.latency_s + extra
            if latency > limit_s:
                said = what.format(limit_s * 1e3)
                return f"answer predicted in {latency * 1e3:.0f} ms, {said}; retry later", predicted
        return None, predicted

    def would_refuse(self, deadline: float | None = None) -> float | None:
        """Cheap check for the HTTP layer, before the body is read: None when the smallest
        request (one node) would be admitted now, else a retry delay hint in seconds."""
        if self._in_flight >= self.config.max_queue_requests:
            return 1.0
        reason, predicted = self.refusal(self.backlog, 1, time.perf_counter(), deadline)
        if reason is None:
            return None
        assert predicted is not None
        return predicted.wait_s

    def next_id(self) -> int:
        """A fresh request id (monotonic, shared by every kind of request)."""
        return next(self._ids)

    def _release(self, _: Future[Any]) -> None:
        with self._lock:
            self._in_flight -= 1
