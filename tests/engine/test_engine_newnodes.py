"""New-node requests through the Engine: equal to NewNodeInference run directly, typed errors at
submit, shared admission bound, graceful stop, and never an answer from stale PEs."""

from __future__ import annotations

import asyncio
import logging
import shutil
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import torch

from gnnserve.config import ServeConfig
from gnnserve.embeddings.stores import default_embeddings_dir, open_embeddings
from gnnserve.engine.engine import Engine
from gnnserve.engine.loader import build_engine
from gnnserve.errors import (
    DeadlineExceededError,
    InvalidInputError,
    MissingEmbeddingsError,
    OverloadedError,
    ShuttingDownError,
    StaleEmbeddingsError,
    TooManyNodesError,
    UnavailableError,
)
from gnnserve.features import open_feature_store
from gnnserve.graph import open_graph_store
from gnnserve.models.checkpoint import load_checkpoint
from gnnserve.newnodes.inference import NewNodeInference, NewNodeResult
from gnnserve.newnodes.parse import parse_new_nodes
from gnnserve.types import Result
from tests.conftest import write_embeddings

FEATURES = np.random.default_rng(3).standard_normal((3, 16)).astype(np.float32).tolist()
EDGES = [[0, 5], [0, 17], [1, 5], [2, 1999], [1, 42], [0, 100], [2, 17]]
NEW_EDGES = [[0, 1]]


def config(store: Path, ckpt: Path, **overrides: object) -> ServeConfig:
    """A ServeConfig over ``store`` / ``ckpt`` (full-neighbourhood sampling) plus overrides."""
    base = {"store.path": str(store), "model_path": str(ckpt), "sampler.fanouts": [-1, -1]}
    return ServeConfig.load(None, **{**base, **overrides})


def direct(
    store: Path,
    ckpt: Path,
    pes: Path,
    mode: str = "srpe",
    gamma: float = 0.1,
    policy: str = "query_edges_ratio",
    features: object = FEATURES,
    edges: object = EDGES,
    new_edges: object = NEW_EDGES,
) -> NewNodeResult:
    """The single-process computation, on freshly opened stores, model and PEs."""
    graph, feats = open_graph_store(store), open_feature_store(store)
    new = parse_new_nodes(
        features, edges, new_edges, num_nodes=graph.num_nodes, feature_dim=feats.dim
    )
    inference = NewNodeInference(load_checkpoint(ckpt).model, graph, feats, open_embeddings(pes))
    return inference.run(new, mode, gamma, policy)


def submit_new(
    engine: Engine,
    features: object = FEATURES,
    edges: object = EDGES,
    new_edges: object = None,
    **options: object,
) -> Future[Result]:
    """Submit a new-node request (validated by ``engine.request``)."""
    new = {"features": features, "edges": edges, "new_edges": new_edges}
    return engine.submit(engine.request(new_nodes=new, **options))  # type: ignore[arg-type]


class _Gate:
    """Holds ``target.name`` calls until released."""

    def __init__(self, target: object, name: str) -> None:
        self.event = threading.Event()
        self.entered = threading.Event()
        inner = getattr(target, name)

        def gated(*args: object, **kwargs: object) -> object:
            self.entered.set()
            assert self.event.wait(30)
            return inner(*args, **kwargs)

        setattr(target, name, gated)


@pytest.mark.parametrize(
    ("mode", "gamma", "policy"),
    [("srpe", 0.1, "query_edges_ratio"), ("srpe", 0.5, "importance"), ("full", 0.1, "random")],
)
def test_results_equal_new_node_inference(pe_store, small_ckpt, mode, gamma, policy) -> None:
    pes = default_embeddings_dir(pe_store, small_ckpt)
    with build_engine(config(pe_store, small_ckpt)) as engine:
        got = {
            out: engine.predict_new_nodes(
                FEATURES, EDGES, NEW_EDGES, out, mode=mode, gamma=gamma, policy=policy
            )
            for out in ("probs", "label", "embedding")
        }
        want = direct(pe_store, small_ckpt, pes, mode, gamma, policy)
    probs = got["probs"]
    info = probs.new_nodes
    assert isinstance(probs, Result) and info is not None
    assert torch.equal(probs.values, torch.softmax(want.logits, 1))
    assert torch.equal(got["label"].values, want.logits.argmax(1))
    assert torch.equal(got["embedding"].values, want.embedding)
    assert torch.equal(info.embedding, want.embedding) and torch.equal(info.logits, want.logits)
    assert probs.nodes.tolist() == [0, 1, 2]
    assert probs.model_version == engine.runner.version
    assert probs.graph_version == engine.graph.version
    assert info.mode == mode and info.num_candidates == want.num_candidates == 5
    if mode == "srpe":
        assert (info.gamma, info.policy) == (gamma, policy)
        np.testing.assert_array_equal(info.recomputed, want.recomputed)
        assert info.recomputed.size == want.recomputed.size >= 1
    else:
        assert (info.gamma, info.policy, info.recomputed.size) == (None, None, 0)
    t = probs.timings
    assert t.batch_size == 3 and t.total_ms >= t.compute_ms > 0 and t.sample_ms > 0
    assert t.queue_ms >= 0 and t.fetch_ms >= 0


def test_defaults_come_from_the_config(pe_store, small_ckpt) -> None:
    overrides = {"embeddings.mode": "pe", "embeddings.policy": "random"}
    with build_engine(config(pe_store, small_ckpt, **overrides)) as engine:
        result = engine.predict_new_nodes(FEATURES, EDGES)
        ns = engine.predict_new_nodes(FEATURES, EDGES, mode="ns", fanouts=[2, 2], seed=4)
    info = result.new_nodes
    assert info is not None and ns.new_nodes is not None
    assert (info.mode, info.gamma, info.policy, info.recomputed.size) == ("pe", 0.0, None, 0)
    assert result.output.value == "label" and ns.new_nodes.mode == "ns"


def test_async_and_concurrent_with_existing_nodes(pe_store, small_ckpt) -> None:
    with build_engine(config(pe_store, small_ckpt)) as engine:
        first = asyncio.run(engine.apredict_new_nodes(FEATURES, EDGES, output="probs"))
        with ThreadPoolExecutor(4) as pool:
            new = [
                pool.submit(engine.predict_new_nodes, FEATURES, EDGES, NEW_EDGES, "probs")
                for _ in range(6)
            ]
            old = [pool.submit(engine.predict, [i, 2 * i], "probs") for i in range(20)]
            results = [f.result(60) for f in new]
            assert all(f.result(60).values.shape == (2, 4) for f in old)
    again = results[0]
    assert all(torch.equal(r.values, again.values) for r in results)
    assert len({r.request_id for r in results}) == 6
    assert first.values.shape == (3, 4)


BAD = [
    ({"features": [[0.0] * 15]}, InvalidInputError, "new_nodes.features"),
    ({"features": [[float("nan")] * 16]}, InvalidInputError, "new_nodes.features"),
    ({"features": [[1e39] * 16]}, InvalidInputError, "new_nodes.features"),
    ({"features": []}, InvalidInputError, "new_nodes.features"),
    ({"features": [[0.0] * 16] * 5}, TooManyNodesError, "new_nodes.features"),
    ({"edges": [[0, 2000]]}, InvalidInputError, "new_nodes.edges"),
    ({"edges": [[3, 1]]}, InvalidInputError, "new_nodes.edges"),
    ({"edges": [[0, 1, 2]]}, InvalidInputError, "new_nodes.edges"),
    ({"edges": [[0, 1.5]]}, InvalidInputError, "new_nodes.edges"),
    ({"new_edges": [[1, 1]]}, InvalidInputError, "new_nodes.new_edges"),
    ({"new_edges": [[0, 3]]}, InvalidInputError, "new_nodes.new_edges"),
    ({"mode": "exact"}, InvalidInputError, "mode"),
    ({"policy": "best"}, InvalidInputError, "policy"),
    ({"gamma": 1.5}, InvalidInputError, "gamma"),
    ({"gamma": True}, InvalidInputError, "gamma"),
    ({"fanouts": [5]}, InvalidInputError, "fanouts"),
    ({"seed": 1.5}, InvalidInputError, "seed"),
    ({"output": "logits"}, InvalidInputError, "output"),
]


@pytest.mark.parametrize(("change", "error", "field"), BAD)
def test_bad_requests_raise_at_submit_and_queue_nothing(
    pe_store, small_ckpt, change, error, field
) -> None:
    engine = build_engine(config(pe_store, small_ckpt, **{"embeddings.max_new_nodes": 4}))
    request = {"features": FEATURES, "edges": EDGES, "new_edges": NEW_EDGES, **change}
    with engine:
        with pytest.raises(error) as info:
            submit_new(engine, **request)
        assert info.value.field == field and info.value.message
        assert engine.queue_depth == 0
        assert engine.predict_new_nodes(FEATURES, EDGES).values.numel() == 3


def test_without_embeddings_new_nodes_get_409_and_existing_nodes_work(
    small_store, small_ckpt
) -> None:
    with build_engine(config(small_store, small_ckpt)) as engine:
        with pytest.raises(MissingEmbeddingsError) as info:
            submit_new(engine)
        assert info.value.http_status == 409 and "gnnserve precompute" in info.value.message
        assert engine.predict([1, 2]).values.numel() == 2


def test_explicit_stale_embeddings_refuse_to_start(small_store, small_ckpt, tmp_path) -> None:
    stale = write_embeddings(small_store, small_ckpt, tmp_path / "pes", "other@000000000000")
    with pytest.raises(StaleEmbeddingsError, match="gnnserve precompute"):
        build_engine(config(small_store, small_ckpt, **{"embeddings.path": str(stale)}))


def test_stale_default_embeddings_are_refused_per_request(
    small_store, small_ckpt, tmp_path, caplog
) -> None:
    store = tmp_path / "store"
    shutil.copytree(small_store, store)
    write_embeddings(store, small_ckpt, default_embeddings_dir(store, small_ckpt), "old@0")
    with caplog.at_level(logging.WARNING), build_engine(config(store, small_ckpt)) as engine:
        with pytest.raises(StaleEmbeddingsError, match="gnnserve precompute"):
            submit_new(engine)
        assert engine.predict([3]).values.numel() == 1
    assert any("new-node requests will be refused" in r.message for r in caplog.records)


def _updatable(pe_store: Path, ckpt: Path, log: Path, **overrides: object) -> Engine:
    pes = default_embeddings_dir(pe_store, ckpt)
    return build_engine(
        config(
            pe_store,
            ckpt,
            **{"store.update_log": str(log), "embeddings.path": str(pes), **overrides},
        )
    )


def test_graph_update_makes_fixed_embeddings_stale(pe_store, small_ckpt, tmp_path) -> None:
    pes = default_embeddings_dir(pe_store, small_ckpt)
    fixed = {"embeddings.refresh": False}
    with _updatable(pe_store, small_ckpt, tmp_path / "log", **fixed) as engine:
        before = engine.predict_new_nodes(FEATURES, EDGES, NEW_EDGES, "probs")
        assert before.graph_version.endswith(".0")
        want = direct(pe_store, small_ckpt, pes)
        assert torch.equal(before.values, torch.softmax(want.logits, 1))
        engine.apply_updates([{"op": "add_edge", "src": 1, "dst": 2}])
        with pytest.raises(StaleEmbeddingsError, match="gnnserve precompute"):
            submit_new(engine)
        assert engine.predict([2]).graph_version.endswith(".1")
    # the log now holds a batch: at start-up without a refresher the explicit PEs are stale,
    # the server refuses (with one, they are brought up to date: the restart test below)
    with pytest.raises(StaleEmbeddingsError):
        _updatable(pe_store, small_ckpt, tmp_path / "log", **fixed)


def test_update_while_queued_is_caught_when_run(pe_store, small_ckpt, tmp_path) -> None:
    fixed = {"embeddings.refresh": False}
    with _updatable(pe_store, small_ckpt, tmp_path / "log", **fixed) as engine:
        gate = _Gate(engine.new_nodes, "_run")  # before the read lock is taken
        future = submit_new(engine)
        assert gate.entered.wait(30)
        engine.apply_updates([{"op": "add_edge", "src": 1, "dst": 2}])
        gate.event.set()
        assert isinstance(future.exception(30), StaleEmbeddingsError)


UPDATES = [
    {"op": "add_edge", "src": 1, "dst": 2},
    {"op": "add_edge", "src": 7, "dst": 3},
    {"op": "upsert_features", "node": 4, "features": [0.25] * 16},
    {"op": "add_node", "features": [0.5] * 16},
    {"op": "add_edge", "src": 2000, "dst": 1},
]


def _reference_after(
    engine: Engine,
    ckpt: Path,
    mode: str,
    features: object = FEATURES,
    edges: object = EDGES,
    new_edges: object = NEW_EDGES,
) -> NewNodeResult:
    """The request answered from scratch on the engine's graph as it is now: a full
    precompute of the PEs and a fresh inference over them."""
    from gnnserve.embeddings.precompute import precompute_embeddings

    store = engine.updates
    assert store is not None
    model = load_checkpoint(ckpt).model.eval()
    pes = precompute_embeddings(
        model, store.graph, store.features, model_version="x", progress=False
    )
    new = parse_new_nodes(
        features, edges, new_edges, num_nodes=store.graph.num_nodes, feature_dim=16
    )
    return NewNodeInference(model, store.graph, store.features, pes).run(new, mode)


@pytest.mark.parametrize("mode", ["srpe", "pe"])
def test_refreshed_embeddings_answer_as_a_full_precompute_after_updates(
    pe_store, small_ckpt, tmp_path, mode
) -> None:
    with _updatable(pe_store, small_ckpt, tmp_path / "log") as engine:
        for step in range(2):
            engine.apply_updates(UPDATES if step == 0 else UPDATES[:3])
            got = engine.predict_new_nodes(FEATURES, EDGES, NEW_EDGES, "probs", mode=mode)
            info = got.new_nodes
            assert info is not None and got.graph_version.endswith(f".{step + 1}")
            assert info.pe_version == got.graph_version and info.pe_lag == 0
            want = _reference_after(engine, small_ckpt, mode)
            torch.testing.assert_close(got.values, torch.softmax(want.logits, 1), atol=1e-5, rtol=0)
            # one new node with one edge: a single candidate, nothing else to read PEs for
            one, edge = FEATURES[:1], [[0, 17]]
            got = engine.predict_new_nodes(one, edge, None, "probs", mode=mode)
            want = _reference_after(engine, small_ckpt, mode, one, edge, None)
            torch.testing.assert_close(got.values, torch.softmax(want.logits, 1), atol=1e-5, rtol=0)
        assert engine.new_nodes.fresh is not None
        assert engine.new_nodes.fresh.refresher.stats.batches == 2


def test_a_restart_over_the_log_answers_new_nodes_as_before_it(
    pe_store, small_ckpt, tmp_path
) -> None:
    """PEs precomputed on the base store, a log of batches (one adds a node) and a restart:
    the PEs are brought up to the replayed version at start-up, and the answer equals the one
    before the restart and a full precompute at that version."""
    log = tmp_path / "log"
    with _updatable(pe_store, small_ckpt, log) as engine:
        engine.apply_updates(UPDATES)
        engine.apply_updates(UPDATES[:3])
        before = engine.predict_new_nodes(FEATURES, EDGES, NEW_EDGES, "probs", mode="srpe")
    with _updatable(pe_store, small_ckpt, log) as engine:
        after = engine.predict_new_nodes(FEATURES, EDGES, NEW_EDGES, "probs", mode="srpe")
        want = _reference_after(engine, small_ckpt, "srpe")
        _assert_pes_equal_a_full_precompute(engine, small_ckpt)
    assert after.graph_version == before.graph_version and after.graph_version.endswith(".2")
    assert after.new_nodes is not None and after.new_nodes.pe_lag == 0
    torch.testing.assert_close(after.values, before.values, atol=1e-5, rtol=0)
    torch.testing.assert_close(after.values, torch.softmax(want.logits, 1), atol=1e-5, rtol=0)


def _assert_pes_equal_a_full_precompute(engine: Engine, ckpt: Path) -> None:
    """Every row of every layer of the refresher's PEs equals a full precompute now."""
    from gnnserve.embeddings.precompute import precompute_embeddings

    store, fresh = engine.updates, engine.new_nodes.fresh
    assert store is not None and fresh is not None
    published = fresh.refresher.current()
    assert published.graph_version == store.graph.version
    model = load_checkpoint(ckpt).model.eval()
    full = precompute_embeddings(
        model, store.graph, store.features, model_version="x", progress=False
    )
    every = np.arange(store.graph.num_nodes)
    for layer in range(1, full.num_layers + 1):
        got = published.pes.get(layer, every).numpy()
        np.testing.assert_allclose(got, full.layer(layer), rtol=0, atol=1e-5)


def test_pe_staleness_answers_with_the_lag_or_503_at_the_deadline(
    pe_store, small_ckpt, tmp_path
) -> None:
    staleness = {"embeddings.pe_staleness": 1}
    with _updatable(pe_store, small_ckpt, tmp_path / "log", **staleness) as engine:
        fresh = engine.new_nodes.fresh
        assert fresh is not None
        start = fresh.refresher.current()
        gate = _Gate(fresh.refresher, "_refresh_once")
        engine.apply_updates(UPDATES[:1])  # no node added: the old PEs cover every node
        assert gate.entered.wait(30)
        lagging = engine.predict_new_nodes(FEATURES, EDGES, NEW_EDGES, "probs")
        assert lagging.new_nodes is not None and lagging.new_nodes.pe_lag == 1
        assert lagging.new_nodes.pe_version == start.graph_version != lagging.graph_version
        engine.apply_updates(UPDATES[1:2])  # two behind: beyond the bound
        with pytest.raises(UnavailableError, match="2 batches behind") as info:
            submit_new(engine, timeout_ms=300).result(30)
        assert info.value.http_status == 503 and info.value.field == "pe_staleness"
        gate.event.set()
        caught_up = engine.predict_new_nodes(FEATURES, EDGES, NEW_EDGES, "probs")
        assert caught_up.new_nodes is not None and caught_up.new_nodes.pe_lag <= 1


def test_shared_admission_bound_deadline_and_graceful_stop(pe_store, small_ckpt) -> None:
    overrides = {"admission.max_queue_requests": 3, "admission.timeout_s": 0.2}
    engine = build_engine(config(pe_store, small_ckpt, **overrides)).start()
    gate = _Gate(engine.new_nodes.inference(), "infer")  # in the worker, past the deadline check
    running = submit_new(engine, output="probs")
    assert gate.entered.wait(30)
    waiting = submit_new(engine)
    existing = engine.submit(engine.request([1]))
    assert existing.result(30).values.numel() == 1  # existing nodes do not wait on new ones
    late = submit_new(engine)  # three in flight, all held behind the gate: the bound is reached
    with pytest.raises(OverloadedError):
        submit_new(engine)
    with pytest.raises(OverloadedError):  # one bound for both kinds of request
        engine.submit(engine.request([1]))
    threading.Event().wait(0.3)
    stopper = threading.Thread(target=engine.stop)
    stopper.start()  # refuses new requests at once, then drains the accepted ones
    while not engine.admission.closed:
        threading.Event().wait(0.01)
    with pytest.raises(ShuttingDownError):
        submit_new(engine)
    gate.event.set()
    stopper.join(30)
    assert running.result(0).values.shape == (3, 4)
    assert isinstance(waiting.exception(0), DeadlineExceededError)
    assert isinstance(late.exception(0), DeadlineExceededError)
    assert engine.queue_depth == 0
