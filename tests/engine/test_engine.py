"""Engine: results equal a full-graph PyG forward, batching keeps requests apart, admission."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import torch

from gnnserve.engine.loader import build_engine
from gnnserve.errors import (
    DeadlineExceededError,
    InvalidInputError,
    OverloadedError,
    ShuttingDownError,
    TooManyNodesError,
)
from gnnserve.models.checkpoint import load_checkpoint
from tests.engine.conftest import serve_config


def test_outputs_equal_full_graph_forward(small_store, small_ckpt, reference) -> None:
    logits, hidden = reference
    nodes = [5, 17, 5, 1999, 0]
    with build_engine(serve_config(small_store, small_ckpt)) as engine:
        probs = engine.predict(nodes, "probs").values
        labels = engine.predict(nodes, "label").values
        emb = engine.predict(nodes, "embedding").values
    torch.testing.assert_close(probs, torch.softmax(logits[nodes], 1), atol=1e-5, rtol=0)
    assert labels.tolist() == logits[nodes].argmax(1).tolist()
    torch.testing.assert_close(emb, hidden[nodes], atol=1e-5, rtol=0)


def test_concurrent_requests_are_batched_and_kept_apart(small_store, small_ckpt, reference) -> None:
    logits, _ = reference
    rng = np.random.default_rng(0)
    requests = [rng.integers(0, 2000, int(rng.integers(1, 6))).tolist() for _ in range(300)]
    sizes: list[int] = []
    with build_engine(serve_config(small_store, small_ckpt)) as engine:
        engine.observers.append(lambda b: sizes.append(len(b.tickets)))
        with ThreadPoolExecutor(16) as pool:
            results = list(pool.map(lambda r: engine.predict(r, "probs", timeout_s=60), requests))
    for req, res in zip(requests, results, strict=True):
        assert res.nodes.tolist() == req
        torch.testing.assert_close(res.values, torch.softmax(logits[req], 1), atol=1e-5, rtol=0)
    assert max(sizes) > 1, "concurrent requests were never coalesced"
    assert sum(sizes) == len(requests)


class _Gate:
    """Blocks the compute stage until released, to hold requests in flight."""

    def __init__(self, runner) -> None:
        self.runner, self.event = runner, threading.Event()
        self.version, self.model = runner.version, runner.model
        self.shape_output = runner.shape_output

    def forward(self, batch):
        assert self.event.wait(30)
        return self.runner.forward(batch)


def test_overload_is_refused_then_recovers(small_store, small_ckpt) -> None:
    engine = build_engine(
        serve_config(small_store, small_ckpt, **{"admission.max_queue_requests": 2})
    )
    gate = _Gate(engine.runner)
    engine.runner = gate  # type: ignore[assignment]
    with engine:
        first = [engine.submit(engine.request([1])), engine.submit(engine.request([2]))]
        with pytest.raises(OverloadedError):
            engine.submit(engine.request([3]))
        gate.event.set()
        assert [f.result(30).values.numel() for f in first] == [1, 1]
        assert engine.predict([3]).values.numel() == 1


def test_expired_request_is_dropped(small_store, small_ckpt) -> None:
    overrides = {"admission.timeout_s": 0.05, "batcher.max_batch_nodes": 1}
    engine = build_engine(serve_config(small_store, small_ckpt, **overrides))
    gate = _Gate(engine.runner)
    engine.runner = gate  # type: ignore[assignment]
    with engine:
        # fill the pipeline behind the gate
        stuck = [engine.submit(engine.request([i])) for i in range(1, 10)]
        late = [engine.submit(engine.request([i])) for i in range(10, 20)]
        threading.Event().wait(0.2)
        gate.event.set()
        for f in stuck:
            f.exception(30)
        errors = [f.exception(30) for f in late]
    assert any(isinstance(e, DeadlineExceededError) for e in errors)


def test_stop_finishes_accepted_requests(small_store, small_ckpt) -> None:
    engine = build_engine(serve_config(small_store, small_ckpt)).start()
    futures = [engine.submit(engine.request([i % 2000, (7 * i) % 2000])) for i in range(200)]
    engine.stop()
    assert all(f.done() and f.exception() is None for f in futures)
    with pytest.raises(ShuttingDownError):
        engine.submit(engine.request([1]))


@pytest.mark.parametrize(
    ("nodes", "output", "error", "field"),
    [
        ([], "label", InvalidInputError, "nodes"),
        ([-1], "label", InvalidInputError, "nodes"),
        ([2000], "label", InvalidInputError, "nodes"),
        ([1.5], "label", InvalidInputError, "nodes"),
        (["a"], "label", InvalidInputError, "nodes"),
        ([True], "label", InvalidInputError, "nodes"),
        ([2**70], "label", InvalidInputError, "nodes"),
        ([1], "logits", InvalidInputError, "output"),
        (list(range(5000)), "label", TooManyNodesError, "nodes"),
    ],
)
def test_bad_requests_raise_typed_errors(
    small_store, small_ckpt, nodes, output, error, field
) -> None:
    with build_engine(serve_config(small_store, small_ckpt)) as engine:
        with pytest.raises(error) as info:
            engine.predict(nodes, output)
        assert info.value.field == field
        assert engine.predict([1]).values.numel() == 1


def test_batch_cost_cap_splits_batches_by_psgs(small_store, small_ckpt, reference) -> None:
    """With max_batch_cost, no batch's summed PSGS exceeds the cap (unless a lone request does)."""
    logits, _ = reference
    engine = build_engine(serve_config(small_store, small_ckpt))
    cap = float(np.sort(engine.psgs)[-5:].sum())  # about five of the most expensive seeds
    engine = build_engine(serve_config(small_store, small_ckpt, **{"batcher.max_batch_cost": cap}))
    costs: list[float] = []
    engine.observers.append(lambda b: costs.append(float(engine.psgs[b.seeds].sum())))
    gate = _Gate(engine.runner)
    engine.runner = gate  # type: ignore[assignment]
    hubs = np.argsort(engine.psgs)[-40:].tolist()
    with engine:
        futures = [engine.submit(engine.request([h])) for h in hubs]
        gate.event.set()
        labels = [f.result(30).values.item() for f in futures]
    assert labels == logits[hubs].argmax(1).tolist()
    assert len(costs) > 1 and max(costs) <= cap + 1e-9


def test_gcn_with_self_loops_equals_pyg_gcn(tmp_path: Path) -> None:
    """A graph whose CSR holds self loops: served GCN equals a plain PyG GCNConv stack."""
    from torch_geometric.nn import GCNConv

    from gnnserve.data.writer import GraphData, write_store
    from tests.conftest import make_checkpoint, random_simple_graph

    n = 300
    ei = random_simple_graph(n, 2000, seed=5)
    loops = np.arange(0, n, 3)
    ei = np.concatenate([ei, np.stack([loops, loops])], axis=1)
    x = np.random.default_rng(5).standard_normal((n, 8)).astype(np.float32)
    write_store(GraphData("loops", n, ei, x, np.arange(n) % 3), tmp_path / "s")
    ckpt = make_checkpoint(tmp_path / "s", tmp_path / "gcn", arch="gcn")
    model = load_checkpoint(ckpt).model
    ref = [GCNConv(8, 32), GCNConv(32, 3)]
    for conv, mine in zip(ref, model.convs, strict=True):
        conv.load_state_dict(mine.state_dict())
    xt, et = torch.from_numpy(x), torch.from_numpy(ei)
    with torch.inference_mode():
        want = ref[1](torch.relu(ref[0](xt, et)), et)
    with build_engine(serve_config(tmp_path / "s", ckpt)) as engine:
        got = engine.predict(list(range(n)), "embedding").values
        logits_rows = engine.predict(list(range(0, n, 7)), "probs").values
    with torch.inference_mode():
        torch.testing.assert_close(got, torch.relu(ref[0](xt, et)), atol=1e-5, rtol=0)
    torch.testing.assert_close(logits_rows, torch.softmax(want[::7], 1), atol=1e-5, rtol=0)
