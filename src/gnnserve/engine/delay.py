"""Queueing-delay prediction for admission control.

A :class:`ServiceModel` fits the time one batch adds to the pipeline's completion timeline,
``seconds = a + b * units`` (units: seed nodes, or new nodes), by least squares over the
completed batches, exponentially weighted towards the latest. The *effective* service time of
batch i is ``done_i - max(done_{i-1}, formed_i)``: while the pipeline is busy it is the interval
between two completions (the period of a pipeline of depth 2, with its stages overlapping),
when it was idle it is the batch's whole latency. ``a`` is the fixed cost of a batch, so a
batch of k requests costs less than k batches of one.

A :class:`Backlog` tracks the work admitted ahead of a new request (queued, not yet batched;
batches in flight) and predicts from the model, once it has seen a few batches, when that work
will be done and when the new request's own batch will be.
"""

from __future__ import annotations

import itertools
import threading
from collections import OrderedDict, deque
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Prediction:
    """Predicted delays of a request admitted now, seconds."""

    wait_s: float  # until the work admitted ahead of it is done (its queueing delay)
    latency_s: float  # until its own batch is done (wait + its batch's service time)


class ServiceModel:
    """Exponentially weighted least-squares line ``seconds = a + b * units``.

    Batch i back from the latest has weight ``decay ** i``: recent batches dominate, so the model
    follows load within a few half-lives. O(1) per batch. When the units barely vary or the fit
    is not positive, it falls back (see :func:`solve_line`). Robustness: the first batch (it may
    pay for compilation and first touch of the stores) is not used, and a batch counts as at
    most ``CLIP`` times its prediction (a GC pause must not shed the next thousand requests; a
    real slowdown still raises the model by a constant factor per batch).
    """

    CLIP = 4.0
    MIN_BATCHES = 8  # batches fitted before the model predicts anything

    def __init__(self, halflife: float = 16.0) -> None:
        self.decay = 0.5 ** (1.0 / halflife)
        self._sums = [0.0] * 5  # weighted count, sum u, sum u^2, sum s, sum u*s
        self._coef: tuple[float, float] | None = None
        self.count = 0  # batches seen, the first included

    def add(self, units: int, seconds: float) -> None:
        """Record one completed batch of ``units`` that took ``seconds``; refit."""
        self.count += 1
        if self.count == 1:
            return
        u, s = float(units), max(float(seconds), 0.0)
        if self._coef is not None:
            s = min(s, self.CLIP * (self._coef[0] + self._coef[1] * u))
        d, sums = self.decay, self._sums
        for i, x in enumerate((1.0, u, u * u, s, u * s)):
            sums[i] = d * sums[i] + x
        self._coef = solve_line(*sums)

    @property
    def coefficients(self) -> tuple[float, float] | None:
        """(a seconds, b seconds per unit), or None before the second batch."""
        return self._coef

    @property
    def ready(self) -> bool:
        """True once ``MIN_BATCHES`` batches were fitted (the first one is not)."""
        return self.count > self.MIN_BATCHES


def solve_line(w: float, su: float, suu: float, ss: float, sus: float) -> tuple[float, float]:
    """(a, b) >= 0 minimising the weighted squared error of ``s = a + b * u``, from the weighted
    sums (weights, u, u^2, s, u*s).

    Degenerate cases: units within ~10% of each other or slope < 0 -> ``a = 0``,
    ``b = sum(s) / sum(u)``; intercept < 0 -> the weighted least-squares line through the origin.
    """
    var = w * suu - su * su
    if var > 0.01 * w * suu:  # the units vary by more than ~10% (coefficient of variation)
        b = (w * sus - su * ss) / var
        a = (ss - b * su) / w
        if b >= 0 and a >= 0:
            return a, b
        if b >= 0:
            return 0.0, sus / suu
    return 0.0, ss / su if su > 0 else 0.0


def fit_line(samples: list[tuple[int, float]], decay: float = 1.0) -> tuple[float, float]:
    """:func:`solve_line` over (units, seconds) pairs, oldest first, weighted ``decay ** age``."""
    sums = [0.0] * 5
    for u, s in samples:
        for i, x in enumerate((1.0, u, u * u, s, u * s)):
            sums[i] = decay * sums[i] + x
    return solve_line(*sums)


class Calibration:
    """A margin added to predicted delays: a high quantile of how late answers came.

    The model predicts a typical batch; on a machine whose speed varies (other processes, GC,
    GIL hand-offs) answers stall now and then, for about as long whatever the queue held, so
    admitting requests right up to their deadline would miss a p99 goal. The margin is the
    ``quantile`` of (actual - predicted latency) over the last ``window`` admitted requests,
    recomputed every ``every`` observations, never below 0 (0 until ``every`` were seen). The
    default quantile, 0.995, sits above the p99 goal it protects: a margin at exactly the 99th
    percentile lets ~1% of admitted answers come late by construction, so the admitted p99 lands
    on the deadline with nothing to spare (bench/overload.py at 3x load). Admission adds it to
    the predicted answer time, at most half the time left before the deadline (see
    ``Admission.refusal``): stalls it cannot prevent must not refuse every request.
    """

    def __init__(self, quantile: float = 0.995, window: int = 256, every: int = 16) -> None:
        self.quantile, self.every = quantile, every
        self._errors: deque[float] = deque(maxlen=window)
        self._seen = 0
        self.margin_s = 0.0

    @property
    def observed(self) -> int:
        """Requests observed so far."""
        return self._seen

    def observe(self, predicted_s: float, actual_s: float) -> None:
        """One answered (or expired) request: its predicted and its actual latency, seconds."""
        self._errors.append(actual_s - predicted_s)
        self._seen += 1
        if self._seen % self.every == 0:
            errors = np.fromiter(tuple(self._errors), float)
            self.margin_s = max(float(np.quantile(errors, self.quantile)), 0.0)


class Backlog:
    """Work admitted and unfinished on one queue, and the delay it predicts for a newcomer.

    ``capacity``: units per batch when the consumer batches greedily (a batch takes what is
    queued, up to ``capacity``); ``None``: one request per batch. Thread-safe.
    """

    def __init__(self, capacity: int | None, halflife: float = 16.0) -> None:
        self.capacity = capacity
        self.model = ServiceModel(halflife)
        self.calibration = Calibration()
        self._lock = threading.Lock()
        self._queued_units = 0
        self._queued_requests = 0
        self._in_flight: OrderedDict[int, tuple[int, float]] = OrderedDict()  # token -> (u, t0)
        self._tokens = itertools.count()
        self._last_done = 0.0  # perf_counter() of the latest completion

    @property
    def queued(self) -> tuple[int, int]:
        """(units, requests) admitted and not yet taken into a batch."""
        return self._queued_units, self._queued_requests

    @property
    def idle(self) -> bool:
        """True when nothing is queued or in flight."""
        return self._queued_requests == 0 and not self._in_flight

    def enqueue(self, units: int) -> None:
        """A request of ``units`` was admitted to the queue."""
        with self._lock:
            self._queued_units += units
            self._queued_requests += 1

    def dequeue(self, units: int, requests: int = 1) -> None:
        """Requests left the queue without running (expired, cancelled)."""
        with self._lock:
            self._queued_units -= units
            self._queued_requests -= requests

    def started(self, units: int, requests: int, formed_s: float) -> int:
        """``requests`` queued requests of ``units`` in all formed a batch; returns its token."""
        with self._lock:
            self._queued_units -= units
            self._queued_requests -= requests
            token = next(self._tokens)
            self._in_flight[token] = (units, formed_s)
            return token

    def finished(self, token: int, done_s: float, ok: bool = True) -> None:
        """Batch ``token`` left the pipeline at ``done_s``; a successful one trains the model."""
        with self._lock:
            units, formed = self._in_flight.pop(token, (0, done_s))
            if not ok:
                return
            self.model.add(units, done_s - max(self._last_done, formed))
            self._last_done = done_s

    def free_at(self, now: float) -> float | None:
        """perf_counter() time when the batches in flight are predicted done (``now`` at the
        earliest; None while the model is not ready)."""
        with self._lock:
            coef = self.model.coefficients
            if coef is None or not self.model.ready:
                return None
            return self._free_at(*coef, now)

    def _free_at(self, a: float, b: float, now: float) -> float:
        t = self._last_done
        for u, formed in self._in_flight.values():  # formation order = completion order
            t = max(max(t, formed) + a + b * u, now)  # an overdue batch is done "now" at best
        return max(t, now)

    def predict(self, units: int, now: float) -> Prediction | None:
        """Delays of a request of ``units`` admitted at ``now`` (None while the model is empty)."""
        with self._lock:
            coef = self.model.coefficients
            if coef is None or not self.model.ready:
                return None
            a, b = coef
            free = self._free_at(a, b, now)
            queued_units, queued_requests = self._queued_units, self._queued_requests
        if self.capacity is None:
            batches_ahead, units_ahead, own = queued_requests, queued_units, units
        else:
            total = queued_units + units
            batches_ahead = (total - 1) // self.capacity
            units_ahead = batches_ahead * self.capacity
            own = total - units_ahead  # the new request shares its batch with what is left
        start = free + batches_ahead * a + b * units_ahead
        return Prediction(wait_s=start - now, latency_s=start + a + b * own - now)
