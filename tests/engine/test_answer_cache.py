"""The answer cache: a cached answer never differs from a recomputed one at the version it
reports, across a stream of graph updates; hits, drops and the byte budget are counted."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from gnnserve.config import ServeConfig
from gnnserve.engine.loader import build_engine
from gnnserve.models.checkpoint import load_checkpoint
from tests.conftest import make_checkpoint
from tests.embeddings.reference import layer_outputs


def _engine(store: Path, ckpt: Path, log: Path, mb: float = 8.0):  # type: ignore[no-untyped-def]
    config = ServeConfig.load(
        None,
        **{
            "store.path": str(store),
            "model_path": str(ckpt),
            "sampler.fanouts": [-1, -1],
            "store.update_log": str(log),
            "compute.result_cache_mb": mb,
            "embeddings.refresh": False,
        },
    )
    return build_engine(config)


def _reference(engine, ckpt: Path) -> np.ndarray:  # type: ignore[no-untyped-def]
    """Probabilities of every node by a plain PyG forward on the graph as it is now."""
    store = engine.updates
    graph = store.graph
    indptr, indices = graph.csr()
    dst = np.repeat(np.arange(graph.num_nodes), np.diff(indptr))
    edges = torch.from_numpy(np.stack([np.asarray(indices, np.int64), dst]))
    x = store.features.get_valid(np.arange(graph.num_nodes))
    model = load_checkpoint(ckpt).model.eval()
    return torch.softmax(layer_outputs(model, x, edges)[-1], 1).numpy()


@pytest.mark.parametrize("arch", ["gcn", "sage"])
def test_cached_answers_equal_recomputed_ones_across_updates(
    small_store: Path, tmp_path: Path, arch: str
) -> None:
    ckpt = make_checkpoint(small_store, tmp_path / arch, arch)
    rng = np.random.default_rng(1)
    with _engine(small_store, ckpt, tmp_path / "log") as engine:
        cache = engine.answer_cache
        assert cache is not None
        asked = [np.sort(rng.choice(2000, 6, replace=False)) for _ in range(40)]
        for _ in range(4):  # every round: ask, update, ask again
            want = _reference(engine, ckpt)
            for nodes in asked:
                got = engine.predict(nodes, "probs")
                np.testing.assert_allclose(got.values.numpy(), want[nodes], atol=1e-5, rtol=0)
                assert got.graph_version == engine.graph.version
            ops = [
                {"op": "add_edge", "src": int(rng.integers(2000)), "dst": int(rng.integers(2000))}
                for _ in range(3)
            ]
            ops.append(
                {"op": "upsert_features", "node": int(rng.integers(2000)), "features": [0.5] * 16}
            )
            engine.apply_updates(ops)
        stats = cache.stats
        assert stats.hits > 0 and stats.misses > 0 and stats.invalidated_nodes > 0
        assert stats.dropped > 0  # answers a batch could change were found and recomputed
        assert stats.hits + stats.misses == 4 * 40


def test_only_full_neighbourhood_requests_are_cached_and_the_budget_holds(
    small_store: Path, small_ckpt: Path, tmp_path: Path
) -> None:
    row_bytes = 4 * 4 + 120  # 4 classes of float32 + the entry estimate
    with _engine(small_store, small_ckpt, tmp_path / "log", mb=50 * row_bytes / 2**20) as engine:
        cache = engine.answer_cache
        assert cache is not None
        engine.predict([1, 2, 3], "probs", fanouts=[5, 5])  # sampled: not cached
        assert len(cache) == 0 and cache.stats.misses == 0
        for start in range(0, 120, 4):
            engine.predict(list(range(start, start + 4)), "probs")
        assert len(cache) <= 50 and cache.bytes <= cache.max_bytes and cache.stats.evicted > 0
        before = cache.stats.hits
        engine.predict([116, 117, 118, 119], "probs")  # the newest: still held
        assert cache.stats.hits == before + 1


def test_an_entry_serves_only_versions_it_is_valid_for(small_store: Path) -> None:
    from gnnserve.engine.answer_cache import AnswerCache
    from gnnserve.graph import open_graph_store

    seq = [5]
    cache = AnswerCache(open_graph_store(small_store), 1 << 20, 2, False, lambda: seq[0])
    rows = np.arange(6, dtype=np.float32).reshape(2, 3)
    cache.store(np.array([1, 2]), "probs", "abc.5", rows)
    np.testing.assert_array_equal(cache.lookup(np.array([2, 1]), "probs", "abc.5"), rows[::-1])
    assert cache.lookup(np.array([1]), "probs", "abc.4") is None  # computed after that version
    assert cache.lookup(np.array([1]), "label", "abc.5") is None  # another output kind
    seq[0] = 6
    cache.on_feature_rows(np.array([1]))  # batch 6 rewrote node 1: 1 and its out-neighbours
    assert cache.lookup(np.array([1]), "probs", "abc.6") is None
    assert cache.stats.dropped == 1 and len(cache) == 1
    graph = open_graph_store(small_store)
    indptr, indices = graph.csr()
    untouched = next(v for v in range(3, 2000) if 1 not in indices[indptr[v] : indptr[v + 1]])
    cache.store(np.array([untouched]), "probs", "abc.6", rows[:1])
    assert cache.lookup(np.array([untouched]), "probs", "abc.7") is not None
    cache.on_add_nodes(1100)  # more than the spare rows the cache started with
    last = np.array([2000 + 1099])
    cache.store(last, "probs", "abc.7", rows[:1])
    np.testing.assert_array_equal(cache.lookup(last, "probs", "abc.7"), rows[:1])
