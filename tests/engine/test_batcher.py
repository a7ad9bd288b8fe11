"""SLO-true batching: a batch's PSGS cap is the SLO left to its oldest request when it starts."""

from __future__ import annotations

import queue

import numpy as np
import pytest

from gnnserve.config import AdmissionConfig, BatcherConfig
from gnnserve.engine.admission import Admission
from gnnserve.engine.batcher import Batcher
from gnnserve.engine.delay import Backlog
from gnnserve.types import Request, Ticket

COST = 100.0  # summed PSGS of a one-node ticket here


NOW = 1000.0  # the batchers' clock here: fixed, so a busy machine cannot move the cap


def _batcher(inbox: queue.Queue[object], backlog: Backlog | None = None) -> Batcher:
    """A batcher whose clock reads NOW: the cap depends only on the tickets' ages."""
    config = BatcherConfig(
        max_batch_nodes=1024, max_wait_ms=0, latency_slo_ms=10.0, max_batch_cost=1000
    )
    return Batcher(
        config,
        inbox,
        cost=lambda nodes: COST * nodes.size,
        backlog=backlog,
        slo_cap=lambda left_ms: 100.0 * left_ms + 50.0,  # a made-up curve, PSGS per ms left
        clock=lambda: NOW,
    )


def _fill(inbox: queue.Queue[object], count: int, arrival: float) -> None:
    for i in range(count):
        inbox.put(Ticket(Request(nodes=np.array([i], dtype=np.int64)), i, arrival))


def _trained_backlog(service_s: float) -> Backlog:
    """A real backlog whose model has seen batches of 1 unit taking ``service_s`` each."""
    backlog = Backlog(capacity=1024)
    t = NOW - 1.0
    for _ in range(12):
        backlog.enqueue(1)
        token = backlog.started(1, 1, t)
        t += service_s
        backlog.finished(token, t)
    return backlog


def _in_flight(backlog: Backlog, start: float) -> None:
    """One more batch of one unit starts at ``start`` (the batchers' clock)."""
    backlog.enqueue(1)
    backlog.started(1, 1, start)


def _tickets_fitting(left_ms: float) -> int:
    """Tickets of COST that fit under the test curve with ``left_ms`` of SLO left."""
    return int(min(1000.0, 100.0 * left_ms + 50.0) // COST)


def _take(batcher: Batcher) -> int:
    """Tickets in the batcher's next batch."""
    return len(batcher.next_batch().tickets)


def test_a_fresh_batch_takes_the_static_cap_and_an_old_one_less() -> None:
    inbox: queue.Queue[object] = queue.Queue()
    batcher = _batcher(inbox)
    _fill(inbox, 12, NOW)
    assert _take(batcher) == _tickets_fitting(10.0) == 10  # the static cap (1000)
    while not inbox.empty():
        inbox.get()
    _fill(inbox, 12, NOW - 0.006)  # 6 ms spent queueing: 4 ms left, cap 450
    assert _take(batcher) == _tickets_fitting(4.0) == 4


def test_the_cap_counts_the_wait_for_batches_in_flight() -> None:
    backlog = _trained_backlog(0.005)
    inbox: queue.Queue[object] = queue.Queue()
    batcher = _batcher(inbox, backlog)
    _in_flight(backlog, NOW)  # predicted free ~5 ms after NOW
    free = backlog.free_at(NOW)
    assert free is not None and 0.003 < free - NOW < 0.007
    _fill(inbox, 12, NOW)
    fitting = _tickets_fitting(10.0 - (free - NOW) * 1e3)
    assert _take(batcher) == fitting <= 6  # without the wait ahead it would be 10


def test_admission_refuses_an_answer_predicted_past_the_slo() -> None:
    backlog = _trained_backlog(0.008)
    now = NOW
    _in_flight(backlog, now)  # busy: one batch of ~8 ms ahead, then its own of ~8 ms
    for slo, refused in ((10.0, True), (100.0, False)):
        admission = Admission(AdmissionConfig(), 1024, slo_ms=slo)
        reason, predicted = admission.refusal(backlog, 1, now, None)
        assert predicted is not None and predicted.latency_s > 0.010
        assert (reason is not None) == refused, reason
        if refused:
            assert "latency SLO of 10 ms" in reason


def test_loose_judges_the_mean_prediction_strict_adds_the_margin() -> None:
    backlog = _trained_backlog(0.008)
    _in_flight(backlog, NOW)
    for _ in range(backlog.calibration.every):  # answers came ~6 ms later than predicted
        backlog.calibration.observe(0.010, 0.016)
    margin = backlog.calibration.margin_s
    assert margin == pytest.approx(0.006)
    predicted = backlog.predict(1, NOW)
    assert predicted is not None
    slo_ms = (predicted.latency_s + margin / 2) * 1e3  # in time on average, not with the margin
    strict = Admission(AdmissionConfig(), 1024, slo_ms=slo_ms)
    loose = Admission(AdmissionConfig(), 1024, slo_ms=slo_ms, slo_margin=False)
    assert strict.refusal(backlog, 1, NOW, None)[0] is not None
    assert loose.refusal(backlog, 1, NOW, None)[0] is None
    # a deadline keeps the margin on either: the answer must come before it
    deadline = NOW + predicted.latency_s + margin / 2
    assert loose.refusal(backlog, 1, NOW, deadline)[0] is not None


@pytest.mark.parametrize("left_ms", [-5.0, 0.0])
def test_no_slo_left_means_a_batch_of_one(left_ms: float) -> None:
    inbox: queue.Queue[object] = queue.Queue()
    config = BatcherConfig(max_wait_ms=0, latency_slo_ms=10.0, max_batch_cost=1000)
    batcher = Batcher(
        config, inbox, lambda n: COST * n.size, None, lambda ms: max(ms, 0.0), clock=lambda: NOW
    )
    _fill(inbox, 3, NOW - (10.0 - left_ms) / 1e3)
    assert len(batcher.next_batch().tickets) == 1
