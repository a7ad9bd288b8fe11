"""SLO-true batching: a batch's PSGS cap is the SLO left to its oldest request when it starts."""

from __future__ import annotations

import queue
import time

import numpy as np
import pytest

from gnnserve.config import AdmissionConfig, BatcherConfig
from gnnserve.engine.admission import Admission
from gnnserve.engine.batcher import Batcher
from gnnserve.engine.delay import Backlog
from gnnserve.types import Request, Ticket

COST = 100.0  # summed PSGS of a one-node ticket here


def _batcher(inbox: queue.Queue[object], backlog: Backlog | None = None) -> Batcher:
    config = BatcherConfig(
        max_batch_nodes=1024, max_wait_ms=0, latency_slo_ms=10.0, max_batch_cost=1000
    )
    return Batcher(
        config,
        inbox,
        cost=lambda nodes: COST * nodes.size,
        backlog=backlog,
        slo_cap=lambda left_ms: 100.0 * left_ms + 50.0,  # a made-up curve, PSGS per ms left
    )


def _fill(inbox: queue.Queue[object], count: int, arrival: float) -> None:
    for i in range(count):
        inbox.put(Ticket(Request(nodes=np.array([i], dtype=np.int64)), i, arrival))


def _trained_backlog(service_s: float) -> Backlog:
    """A real backlog whose model has seen batches of 1 unit taking ``service_s`` each."""
    backlog = Backlog(capacity=1024)
    t = time.perf_counter() - 1.0
    for _ in range(12):
        backlog.enqueue(1)
        token = backlog.started(1, 1, t)
        t += service_s
        backlog.finished(token, t)
    return backlog


def _in_flight(backlog: Backlog, start: float) -> None:
    """One more batch of one unit starts at ``start`` (perf_counter time)."""
    backlog.enqueue(1)
    backlog.started(1, 1, start)


def _tickets_fitting(left_ms: float) -> int:
    """Tickets of COST that fit under the test curve with ``left_ms`` of SLO left."""
    return int(min(1000.0, 100.0 * left_ms + 50.0) // COST)


def _take(batcher: Batcher, arrival: float, free: float | None = None) -> tuple[int, int, int]:
    """(tickets batched, fewest and most the cap allows for the time the call took): the
    batcher reads the clock itself, so the bound is taken before and after it; its batch
    starts then, or at ``free`` (when the batches in flight are predicted done) if later."""
    before = time.perf_counter()
    got = len(batcher.next_batch().tickets)
    after = time.perf_counter()
    starts = [t if free is None else max(t, free) for t in (after, before)]
    left = [10.0 - (start - arrival) * 1e3 for start in starts]
    return got, _tickets_fitting(left[0]), _tickets_fitting(left[1])


def test_a_fresh_batch_takes_the_static_cap_and_an_old_one_less() -> None:
    inbox: queue.Queue[object] = queue.Queue()
    batcher = _batcher(inbox)
    now = time.perf_counter()
    _fill(inbox, 12, now)
    got, low, high = _take(batcher, now)
    assert low <= got <= high and got >= 9  # ~10 ms left: the static cap (1000) or next to it
    while not inbox.empty():
        inbox.get()
    old = time.perf_counter() - 0.006  # 6 ms spent queueing: ~4 ms left, cap ~450
    _fill(inbox, 12, old)
    got, low, high = _take(batcher, old)
    assert low <= got <= high and got <= 4


def test_the_cap_counts_the_wait_for_batches_in_flight() -> None:
    backlog = _trained_backlog(0.005)
    inbox: queue.Queue[object] = queue.Queue()
    batcher = _batcher(inbox, backlog)
    now = time.perf_counter()
    _in_flight(backlog, now)  # free ~5 ms after now
    free = backlog.free_at(now)
    assert free is not None and free - now > 0.003
    _fill(inbox, 12, now)
    got, low, high = _take(batcher, now, free)
    assert low <= got <= high and got <= 6  # the wait ahead leaves ~5 ms: cap ~550


def test_admission_refuses_an_answer_predicted_past_the_slo() -> None:
    backlog = _trained_backlog(0.008)
    now = time.perf_counter()
    _in_flight(backlog, now)  # busy: one batch of ~8 ms ahead, then its own of ~8 ms
    for slo, refused in ((10.0, True), (100.0, False)):
        admission = Admission(AdmissionConfig(), 1024, slo_ms=slo)
        reason, predicted = admission.refusal(backlog, 1, now, None)
        assert predicted is not None and predicted.latency_s > 0.010
        assert (reason is not None) == refused, reason
        if refused:
            assert "latency SLO of 10 ms" in reason


@pytest.mark.parametrize("left_ms", [-5.0, 0.0])
def test_no_slo_left_means_a_batch_of_one(left_ms: float) -> None:
    inbox: queue.Queue[object] = queue.Queue()
    config = BatcherConfig(max_wait_ms=0, latency_slo_ms=10.0, max_batch_cost=1000)
    batcher = Batcher(config, inbox, lambda n: COST * n.size, None, lambda ms: max(ms, 0.0))
    _fill(inbox, 3, time.perf_counter() - (10.0 - left_ms) / 1e3)
    assert len(batcher.next_batch().tickets) == 1
