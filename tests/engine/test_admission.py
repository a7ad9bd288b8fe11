"""Admission by predicted queueing delay: the service-time fit, the backlog's prediction, 429s,
and deadlines on the new-node path."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from gnnserve.config import AdmissionConfig, ServeConfig
from gnnserve.engine.admission import Admission, request_timeout
from gnnserve.engine.delay import Backlog, Calibration, Prediction, ServiceModel, fit_line
from gnnserve.engine.loader import build_engine
from gnnserve.errors import DeadlineExceededError, InvalidInputError, OverloadedError
from gnnserve.types import Request, RequestOptions


def test_fit_equals_weighted_least_squares_and_recovers_a_line() -> None:
    rng = np.random.default_rng(0)
    units = rng.integers(1, 200, 64)
    seconds = 0.003 + 0.0002 * units + rng.normal(0, 2e-4, units.size)
    samples = list(zip(units.tolist(), seconds.tolist(), strict=True))
    for decay in (1.0, 0.9):
        weights = decay ** np.arange(units.size)[::-1]  # the latest sample has weight 1
        want_b, want_a = np.polyfit(units, seconds, 1, w=np.sqrt(weights))
        assert fit_line(samples, decay) == pytest.approx((want_a, want_b), rel=1e-6)
    exact = [(int(u), 0.002 + 0.001 * int(u)) for u in (1, 5, 9, 40)]
    assert fit_line(exact) == pytest.approx((0.002, 0.001), rel=1e-9)


def test_fit_degenerate_cases_stay_non_negative() -> None:
    # one batch size only: the slope is the mean time per unit
    assert fit_line([(16, 0.004), (16, 0.006)]) == pytest.approx((0.0, 0.010 / 32))
    # a negative intercept: the least-squares line through the origin
    samples = [(10, 0.001), (20, 0.005), (30, 0.009)]
    u, s = np.array([10, 20, 30]), np.array([0.001, 0.005, 0.009])
    assert fit_line(samples) == pytest.approx((0.0, float(u @ s / (u @ u))))
    # a negative slope (noise): the mean time per unit
    assert fit_line([(10, 0.004), (20, 0.003)]) == pytest.approx((0.0, 0.007 / 30))


def test_service_model_weights_recent_batches_and_bounds_outliers() -> None:
    model = ServiceModel(halflife=4)
    clean = [(u, 0.001 + 0.0005 * u) for u in (4, 8, 16, 32) * 10]
    model.add(1, 9.0)  # the first batch (compilation) is not used
    assert model.coefficients is None
    for u, sec in clean:
        model.add(u, sec)
    assert model.count == 41
    assert model.coefficients == pytest.approx(fit_line(clean, model.decay), rel=1e-9)
    model.add(8, 9.0)  # a pause: counted as 4x its prediction (5 ms -> 20 ms), not 9 s
    a, b = model.coefficients or (0.0, 0.0)
    w = fit_line(clean, model.decay)
    assert a + 8 * b < 2 * (w[0] + 8 * w[1])
    for u, sec in clean:
        model.add(u, sec)
    assert model.coefficients == pytest.approx((0.001, 0.0005), rel=0.01)
    for u, sec in clean:  # a real slowdown, 10x: followed within a few half-lives
        model.add(u, 10 * sec)
    assert model.coefficients == pytest.approx((0.01, 0.005), rel=0.01)


def _simulate(
    a: float,
    b: float,
    last_done: float,
    in_flight: list[tuple[int, float]],
    queued: list[int],
    new: int,
    capacity: int | None,
    now: float,
) -> tuple[float, float]:
    """Event-by-event reference: batches complete one after the other, each adding a + b * units
    after the previous completion (or after it formed); queued requests form greedy FIFO batches
    of at most ``capacity`` units (one request each when None). Returns (wait, latency)."""
    t = last_done
    for units, formed in in_flight:
        t = max(max(t, formed) + a + b * units, now)
    t = max(t, now)
    batches: list[list[int]] = []
    for units in [*queued, new]:
        if batches and capacity is not None and sum(batches[-1]) + units <= capacity:
            batches[-1].append(units)
        else:
            batches.append([units])
    for batch in batches[:-1]:
        t += a + b * sum(batch)
    return t - now, t + a + b * sum(batches[-1]) - now


@pytest.mark.parametrize("capacity", [64, None])
def test_prediction_equals_event_simulation(capacity: int | None) -> None:
    backlog = Backlog(capacity)
    # completed batches: 2 ms + 0.1 ms per unit; the first formed on an idle pipeline, the
    # others while their predecessor ran (their service time counts from its completion)
    done = 100.0
    for units in (16, 32, 48, 64) * 3:
        formed = done if units == 16 else done - 0.5
        done += 0.002 + 0.0001 * units
        backlog.enqueue(units)
        backlog.finished(backlog.started(units, 1, formed), done)
    a, b = backlog.model.coefficients or (0.0, 0.0)
    assert (a, b) == pytest.approx((0.002, 0.0001))
    in_flight = [(32, done + 0.001), (16, done + 0.002)]
    for units, formed in in_flight:
        backlog.enqueue(units)
        backlog.started(units, 1, formed)
    queued = [16] * 9  # 144 units: 3 batches of 64 ahead at most
    for units in queued:
        backlog.enqueue(units)
    for now in (done + 0.003, done + 0.050):  # in flight on time / overdue
        got = backlog.predict(16, now)
        assert got is not None
        want = _simulate(a, b, done, in_flight, queued, 16, capacity, now)
        assert (got.wait_s, got.latency_s) == pytest.approx(want, rel=1e-9)


def test_backlog_counts_and_idle() -> None:
    backlog = Backlog(8)
    assert backlog.idle and backlog.predict(1, 0.0) is None
    for i in range(ServiceModel.MIN_BATCHES + 1):
        assert backlog.predict(1, 0.0) is None  # no prediction from fewer batches
        backlog.enqueue(1)
        backlog.finished(backlog.started(1, 1, i), i + 0.5)
    assert backlog.predict(1, 100.0) == Prediction(0.0, 0.5)
    backlog.enqueue(3)
    backlog.enqueue(5)
    assert backlog.queued == (8, 2) and not backlog.idle
    token = backlog.started(8, 2, 1.0)
    assert backlog.queued == (0, 0) and not backlog.idle
    backlog.finished(token, 1.5, ok=False)  # a failed batch does not train the model
    assert backlog.idle and backlog.model.count == ServiceModel.MIN_BATCHES + 1


def _request(n: int) -> Request:
    """An existing-node request for nodes 0..n-1 (admission takes validated requests)."""
    return Request(nodes=np.arange(n, dtype=np.int64))


def _measured(admission: Admission, seconds_per_batch: float, units: int) -> None:
    """Record completed batches of ``units`` taking ``seconds_per_batch`` each, back to back."""
    t = time.perf_counter() - 1.0
    for _ in range(ServiceModel.MIN_BATCHES + 1):
        admission.backlog.enqueue(units)
        token = admission.backlog.started(units, 1, t)
        t += seconds_per_batch
        admission.backlog.finished(token, t)


def test_admit_refuses_when_the_predicted_queueing_delay_exceeds_the_budget() -> None:
    config = AdmissionConfig(max_queue_delay_ms=45)
    admission = Admission(config, max_batch_nodes=8)
    _measured(admission, 0.010, 8)  # 10 ms per batch of 8 nodes
    admitted = [admission.admit(_request(8)) for _ in range(5)]  # 0..40 ms ahead
    assert admission.backlog.queued == (40, 5)
    with pytest.raises(OverloadedError, match="predicted queueing delay 50 ms") as err:
        admission.admit(_request(8))  # 5 batches ahead: 50 ms > 45 ms
    assert err.value.retry_after_s == pytest.approx(0.050, rel=1e-6)  # the predicted wait
    assert admission.in_flight == 5  # the refused one holds nothing
    for ticket in admitted:
        ticket.future.cancel()


def test_an_idle_engine_admits_whatever_the_prediction() -> None:
    admission = Admission(AdmissionConfig(max_queue_delay_ms=1), max_batch_nodes=8)
    _measured(admission, 10.0, 8)  # absurdly slow batches: nothing is ahead, so still admitted
    with request_timeout(1.0):
        ticket = admission.admit(Request(nodes=np.array([1])))
    assert ticket.deadline_s is not None


def test_request_timeout_sets_a_deadline_and_refuses_late_answers() -> None:
    admission = Admission(AdmissionConfig(max_queue_delay_ms=None), max_batch_nodes=8)
    _measured(admission, 0.010, 8)
    first = admission.admit(_request(8))
    before = time.perf_counter()
    with request_timeout(500):
        second = admission.admit(_request(8))  # answer predicted in ~20 ms
    assert second.deadline_s == pytest.approx(before + 0.5, abs=0.05)
    assert first.deadline_s == pytest.approx(first.arrival_s + 30.0)
    with request_timeout(15), pytest.raises(OverloadedError, match="deadline"):
        admission.admit(_request(8))  # ~30 ms predicted, 15 ms allowed
    with pytest.raises(InvalidInputError, match="X-Timeout-Ms"), request_timeout(0):
        pass


def test_the_timeout_ms_option_sets_the_deadline() -> None:
    admission = Admission(AdmissionConfig(timeout_s=2.0, max_queue_delay_ms=None))

    def admit(timeout_ms: float):  # type: ignore[no-untyped-def]
        return admission.admit(Request(np.arange(2), options=RequestOptions(timeout_ms=timeout_ms)))

    fast, slow = admit(250.0), admit(60_000.0)
    assert fast.deadline_s == pytest.approx(fast.arrival_s + 0.25, abs=1e-9)
    assert slow.deadline_s == pytest.approx(slow.arrival_s + 2.0, abs=1e-9)  # the server's bound
    before = time.perf_counter()
    with request_timeout(100):  # the header's deadline, earlier still
        both = admit(250.0)
    assert before + 0.1 <= both.deadline_s <= both.arrival_s + 0.1


def test_calibration_margin_is_the_quantile_of_recent_lateness() -> None:
    calibration = Calibration(quantile=0.9, window=50, every=10)
    rng = np.random.default_rng(1)
    errors = rng.exponential(0.01, 120)
    for i, late in enumerate(errors[:-1]):
        calibration.observe(0.005, 0.005 + late)
        if i == 8:
            assert calibration.margin_s == 0.0  # nothing computed before `every` observations
    calibration.observe(0.005, 0.005 + errors[-1])  # the 120th: recomputed
    want = np.quantile(0.005 + errors[-50:] - 0.005, 0.9)
    assert calibration.margin_s == pytest.approx(want, rel=1e-9)
    for _ in range(50):  # answers earlier than predicted: the margin never goes below 0
        calibration.observe(0.005, 0.001)
    assert calibration.margin_s == 0.0


def test_the_margin_counts_up_to_half_the_remaining_time() -> None:
    admission = Admission(AdmissionConfig(max_queue_delay_ms=None), max_batch_nodes=8)
    _measured(admission, 0.010, 8)
    admission.admit(_request(8))  # the next one: 10 ms wait, answer in 20 ms
    admission.backlog.calibration.margin_s = 10.0  # stalls: counted as half the time left
    with request_timeout(50):  # 20 + 25 <= 50
        admission.admit(_request(8))
    admission.backlog.dequeue(8)
    with request_timeout(35), pytest.raises(OverloadedError, match="deadline"):
        admission.admit(_request(8))  # 20 + 17.5 > 35
    admission.backlog.calibration.margin_s = 0.0
    with request_timeout(35):
        admission.admit(_request(8))  # 20 <= 35 without the margin


def test_new_node_requests_are_refused_or_expire_by_their_deadline(pe_store, small_ckpt) -> None:
    overrides = {"admission.max_queue_delay_ms": None, "sampler.fanouts": [-1, -1]}
    config = ServeConfig.load(
        None, **{"store.path": str(pe_store), "model_path": str(small_ckpt), **overrides}
    )
    features = np.ones((2, 16), np.float32).tolist()
    edges = [[0, 5], [1, 17]]
    with build_engine(config) as engine:
        for _ in range(ServiceModel.MIN_BATCHES + 2):  # measured service time of this queue
            engine.predict_new_nodes(features, edges)
        inference = engine.new_nodes.inference()
        runs, release, entered = [0], threading.Event(), threading.Event()
        run = inference.infer

        def gated(*args: object, **kwargs: object) -> object:
            runs[0] += 1
            entered.set()
            assert release.wait(30)
            return run(*args, **kwargs)

        inference.infer = gated  # type: ignore[method-assign]

        def submit():  # type: ignore[no-untyped-def]
            return engine.submit(engine.request(new_nodes={"features": features, "edges": edges}))

        running = submit()
        assert entered.wait(30)
        queued = [submit() for _ in range(4)]
        predicted = engine.new_nodes.backlog.predict(2, time.perf_counter())
        assert predicted is not None and predicted.latency_s > 0
        with request_timeout(predicted.latency_s * 1e3 / 4), pytest.raises(OverloadedError):
            submit()
        with request_timeout(predicted.latency_s * 1e3 * 10):
            late = submit()  # admitted, then held past it
        time.sleep(predicted.latency_s * 10 + 0.1)
        release.set()
        assert all(f.result(30).values.shape == (2,) for f in [running, *queued])
        assert isinstance(late.exception(30), DeadlineExceededError)
        assert runs[0] == 5  # the expired request never ran
