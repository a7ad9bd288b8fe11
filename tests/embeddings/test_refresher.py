"""The background PE refresher: after the refresh of version v, every PE equals a full
precompute on the graph at v (GCN, SAGE, GAT); batches arriving during a refresh coalesce into
the next one; a reader's version is never changed under it."""

from __future__ import annotations

import threading
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

from gnnserve.data.generators import sbm
from gnnserve.data.writer import write_store
from gnnserve.dynamic.store import DynamicStore
from gnnserve.embeddings.chunked import CHUNK_ROWS, ChunkedEmbeddings
from gnnserve.embeddings.precompute import precompute_embeddings
from gnnserve.embeddings.refresher import PeRefresher
from gnnserve.features import open_feature_store
from gnnserve.graph import open_graph_store
from gnnserve.models.zoo import GNN, ModelConfig

N, F = 700, 8


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    data = sbm(num_nodes=N, num_classes=3, feature_dim=F, avg_degree=6.0, seed=5)
    out = tmp_path_factory.mktemp("refresher") / "store"
    write_store(data, out)
    return out


def _batch(rng: np.random.Generator, edges: Counter, n: int) -> tuple[list[dict], int]:
    """Inserts, deletes of live edges, feature rewrites and added nodes with edges."""
    ops: list[dict] = []
    for _ in range(int(rng.integers(5, 25))):
        r, live = rng.random(), [e for e, c in edges.items() if c > 0]
        if r < 0.45:
            u, v = (int(x) for x in rng.integers(0, n, 2))
            ops.append({"op": "add_edge", "src": u, "dst": v})
            edges[(u, v)] += 1
        elif r < 0.7 and live:
            u, v = live[int(rng.integers(len(live)))]
            ops.append({"op": "delete_edge", "src": u, "dst": v})
            edges[(u, v)] -= 1
        elif r < 0.85:
            ops.append({"op": "add_node", "features": rng.standard_normal(F).tolist()})
            ops.append({"op": "add_edge", "src": int(rng.integers(n)), "dst": n})
            edges[(ops[-1]["src"], n)] += 1
            n += 1
        else:
            node = int(rng.integers(n))
            ops.append({"op": "upsert_features", "node": node, "features": [0.5] * F})
    return ops, n


def _start(base: Path, tmp: Path, arch: str) -> tuple[GNN, DynamicStore, PeRefresher]:
    torch.manual_seed(0)
    model = GNN(ModelConfig(arch, in_dim=F, hidden_dim=12, out_dim=3, num_layers=2, heads=2))
    store = DynamicStore(
        open_graph_store(base), open_feature_store(base), tmp / "log", fsync="never"
    )
    pes = precompute_embeddings(
        model.eval(), store.graph, store.features, model_version="m@0", progress=False
    )
    layers = [pes.layer(i) for i in range(1, pes.num_layers + 1)]
    return model, store, PeRefresher(model, store, ChunkedEmbeddings.from_layers(pes.meta, layers))


def _edges(store: DynamicStore) -> Counter:
    indptr, indices = store.graph.csr()
    dst = np.repeat(np.arange(store.graph.num_nodes), np.diff(indptr))
    return Counter(zip(np.asarray(indices).tolist(), dst.tolist(), strict=True))


@pytest.mark.parametrize("arch", ["gcn", "sage", "gat"])
def test_every_refreshed_version_equals_a_full_precompute(
    base: Path, tmp_path: Path, arch: str
) -> None:
    model, store, refresher = _start(base, tmp_path, arch)
    try:
        rng, edges, n = np.random.default_rng(len(arch)), _edges(store), N
        for _ in range(6):
            ops, n = _batch(rng, edges, n)
            store.apply(ops)
            published = refresher.wait_for(store.graph.seq, timeout_s=60)
            assert published is not None and published.graph_version == store.graph.version
            full = precompute_embeddings(
                model, store.graph, store.features, model_version="m@0", progress=False
            )
            assert published.pes.meta.num_nodes == n == store.graph.num_nodes
            for layer in (1, 2):
                got = published.pes.get(layer, np.arange(n)).numpy()
                np.testing.assert_allclose(got, full.layer(layer), rtol=0, atol=1e-5)
        stats = refresher.stats
        assert stats.batches == 6 and stats.rows < 6 * 2 * n  # rows, not whole tables
    finally:
        refresher.close()
        store.close()


def test_batches_during_a_refresh_coalesce_and_readers_keep_their_version(
    base: Path, tmp_path: Path
) -> None:
    model, store, refresher = _start(base, tmp_path, "sage")
    gate, entered = threading.Event(), threading.Event()
    original = refresher._refresh_once

    def held() -> None:  # the first refresh waits until three batches are in
        entered.set()
        gate.wait(30)
        original()

    refresher._refresh_once = held  # type: ignore[method-assign]
    try:
        before = refresher.current()
        rows_before = before.pes.get(1, np.arange(N)).numpy().copy()
        rng, edges, n = np.random.default_rng(3), _edges(store), N
        for _ in range(3):
            ops, n = _batch(rng, edges, n)
            store.apply(ops)
            entered.wait(30)
        assert refresher.lag() == 3 and refresher.current() is before
        gate.set()
        published = refresher.wait_for(3, timeout_s=60)
        assert published is not None and published.seq == 3
        assert refresher.stats.refreshes == 1 and refresher.stats.batches == 3  # one refresh
        np.testing.assert_array_equal(before.pes.get(1, np.arange(N)).numpy(), rows_before)
        assert before.graph_version != published.graph_version
        shared = sum(
            a is b for a, b in zip(before.pes.chunks[0], published.pes.chunks[0], strict=False)
        )
        assert shared == 0 or N > CHUNK_ROWS  # one chunk here: copied, never written in place
    finally:
        refresher.close()
        store.close()


class _HoldingListener:
    """Holds the writer inside the listener calls (after the refresher was told of the batch,
    before the batch is published) until the refresher's thread has looked once."""

    def __init__(self, looked: threading.Event) -> None:
        self.looked = looked

    def on_add_nodes(self, count: int) -> None:
        pass

    def on_edge_events(self, kinds, srcs, dsts, neighbors_of) -> None:  # type: ignore[no-untyped-def]
        assert self.looked.wait(30)


def test_a_refresh_woken_before_its_batch_is_published_waits_for_it(
    base: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Listeners are told of a batch before readers can pin it (a slow listener after the
    refresher, as the answer cache is, widens that window): the refresher's thread finds
    nothing it can read yet, waits, and refreshes once the batch is published."""
    model, store, refresher = _start(base, tmp_path, "sage")
    looked, results = threading.Event(), []
    original = refresher._refresh_once

    def refresh_once() -> bool:
        try:
            results.append(original())
            return results[-1]
        finally:
            looked.set()

    refresher._refresh_once = refresh_once  # type: ignore[method-assign]
    store.subscribe(_HoldingListener(looked))
    try:
        store.apply([{"op": "add_edge", "src": 1, "dst": 2}])
        published = refresher.wait_for(store.graph.seq, timeout_s=30)
        refresher.close()  # the thread's last call has returned: results are complete
        assert published is not None and results[0] is False and results[-1] is True
        assert not [r for r in caplog.records if r.levelname == "ERROR"]
        full = precompute_embeddings(
            model, store.graph, store.features, model_version="m@0", progress=False
        )
        got = published.pes.get(2, np.arange(N)).numpy()
        np.testing.assert_allclose(got, full.layer(2), rtol=0, atol=1e-5)
    finally:
        refresher.close()
        store.close()
