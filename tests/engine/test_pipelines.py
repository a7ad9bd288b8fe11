"""Multiplexed pipelines with one shared batch queue (Quiver §4.3): same answers, and a slow
batch holds only its own pipeline."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor, wait

import numpy as np
import pytest
import torch

from gnnserve.engine.loader import build_engine
from tests.engine.conftest import serve_config


def test_three_pipelines_answer_like_the_full_graph_forward(
    small_store, small_ckpt, reference
) -> None:
    logits, _ = reference
    rng = np.random.default_rng(1)
    requests = [rng.integers(0, 2000, int(rng.integers(1, 6))).tolist() for _ in range(300)]
    batches: list[str] = []
    with build_engine(serve_config(small_store, small_ckpt, **{"batcher.pipelines": 3})) as engine:
        engine.observers.append(lambda b: batches.append(threading.current_thread().name))
        with ThreadPoolExecutor(16) as pool:
            results = list(pool.map(lambda r: engine.predict(r, "probs", timeout_s=60), requests))
    for req, res in zip(requests, results, strict=True):
        assert res.nodes.tolist() == req
        torch.testing.assert_close(res.values, torch.softmax(logits[req], 1), atol=1e-5, rtol=0)
    assert {"gnnserve-compute", "gnnserve-compute-1", "gnnserve-compute-2"} >= set(batches)
    assert len(set(batches)) > 1, "one pipeline took every batch"


def test_pipelines_take_batches_from_the_shared_queue_one_at_a_time(
    small_store, small_ckpt
) -> None:
    """The batcher is not thread-safe: the executor's lock lets one pipeline at a time form a
    batch (counted: the most callers inside ``next_batch`` at once)."""
    engine = build_engine(serve_config(small_store, small_ckpt, **{"batcher.pipelines": 3}))
    real, inside, most, guard = engine.batcher.next_batch, [0], [0], threading.Lock()

    def counted():
        with guard:
            inside[0] += 1
            most[0] = max(most[0], inside[0])
        try:
            return real()
        finally:
            with guard:
                inside[0] -= 1

    engine.batcher.next_batch = counted  # type: ignore[method-assign]
    with engine, ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda n: engine.predict([n]), range(60)))
    assert most[0] == 1


class _HoldFor:
    """A runner that holds a batch seeding ``node`` in compute until ``release`` is set."""

    def __init__(self, runner, node: int) -> None:
        self.runner, self.node = runner, node
        self.held, self.release = threading.Event(), threading.Event()
        self.version, self.model = runner.version, runner.model
        self.shape_output = runner.shape_output

    def forward(self, batch):
        sub = batch.subgraph
        if self.node in sub.nodes[: sub.num_seeds]:
            self.held.set()
            assert self.release.wait(60)
        return self.runner.forward(batch)


@pytest.mark.parametrize("pipelines", [1, 2])
def test_a_straggler_holds_only_its_own_pipeline(small_store, small_ckpt, pipelines) -> None:
    """Order, not time: with two pipelines every request behind the straggler is answered
    while it is still held in compute; with one, none is."""
    engine = build_engine(serve_config(small_store, small_ckpt, **{"batcher.pipelines": pipelines}))
    hold = _HoldFor(engine.runner, node=7)
    engine.runner = hold  # type: ignore[assignment]
    with engine:
        engine.predict([1])  # warm
        slow = engine.submit(engine.request([7]))
        assert hold.held.wait(30)  # the straggler is in compute
        fast = [engine.submit(engine.request([node])) for node in (1, 2, 3, 4, 5)]
        try:
            if pipelines == 1:
                done, _ = wait(fast, timeout=1.0)
                assert not done  # one pipeline: the requests behind the straggler wait for it
            else:
                for future in fast:
                    future.result(30)  # another pipeline answers while the straggler is held
                assert not slow.done()
        finally:
            hold.release.set()
        slow.result(30)
        for future in fast:
            future.result(30)


@pytest.mark.parametrize("kernel_threads", [None, 1])
def test_stage_threads_run_their_kernels_on_the_configured_threads(
    small_store, small_ckpt, kernel_threads
) -> None:
    import numba

    config = serve_config(small_store, small_ckpt, **{"compute.kernel_threads": kernel_threads})
    engine = build_engine(config)
    seen: dict[str, int] = {}
    sample, fetch = engine.executor.sample, engine.executor._fetch  # type: ignore[attr-defined]

    def spy(name, real):  # type: ignore[no-untyped-def]
        def wrapped(batch):  # type: ignore[no-untyped-def]
            seen[name] = numba.get_num_threads()
            return real(batch)

        return wrapped

    engine.executor.sample = spy("sample", sample)  # type: ignore[method-assign]
    engine.executor._fetch = spy("fetch", fetch)  # type: ignore[attr-defined]
    with engine:
        engine.predict([1, 2, 3])
    want = kernel_threads or numba.config.NUMBA_NUM_THREADS
    assert seen == {"sample": want, "fetch": want}
