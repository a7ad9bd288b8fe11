"""DynamicStore: random updates match a reference multiset; samples see one version;
listeners get every batch."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from gnnserve.dynamic.store import DynamicStore
from gnnserve.dynamic.updates import UpdateRejectedError
from gnnserve.features import open_feature_store
from gnnserve.graph import open_graph_store
from gnnserve.graph.events import DELETE, INSERT, UpdateListener
from gnnserve.sampling import NeighborSampler
from gnnserve.sampling.presample import PreSampler


def _reference(store: Path) -> tuple[Counter[tuple[int, int]], int]:
    graph = open_graph_store(store)
    indptr, indices = graph.csr()
    dst = np.repeat(np.arange(graph.num_nodes), np.diff(indptr))
    return Counter(zip(np.asarray(indices).tolist(), dst.tolist(), strict=True)), graph.num_nodes


def _open(store: Path, log: Path) -> DynamicStore:
    return DynamicStore(open_graph_store(store), open_feature_store(store), log, fsync="never")


def _random_batch(rng, edges: Counter, n: int, dim: int) -> list[dict]:
    ops: list[dict] = []
    for _ in range(int(rng.integers(1, 30))):
        r = rng.random()
        live = [e for e, c in edges.items() if c > 0]
        if r < 0.45:
            u, v = (int(x) for x in rng.integers(0, n, 2))
            ops.append({"op": "add_edge", "src": u, "dst": v})
            edges[(u, v)] += 1
        elif r < 0.85 and live:
            u, v = live[int(rng.integers(len(live)))]
            ops.append({"op": "delete_edge", "src": u, "dst": v})
            edges[(u, v)] -= 1
        elif r < 0.93:
            ops.append({"op": "add_node", "features": rng.standard_normal(dim).tolist()})
            n += 1
        else:
            node = int(rng.integers(n))
            ops.append({"op": "upsert_features", "node": node, "features": [1.0] * dim})
    return ops


def _assert_same(store: DynamicStore, edges: Counter, n: int) -> None:
    g = store.graph
    assert g.num_nodes == n and g.num_edges == sum(edges.values())
    indptr, indices = g.csr()
    dst = np.repeat(np.arange(n), np.diff(indptr))
    got = Counter(zip(np.asarray(indices).tolist(), dst.tolist(), strict=True))
    assert got == +edges


def test_random_updates_match_reference_and_survive_compaction(small_store: Path, tmp_path) -> None:
    edges, n = _reference(small_store)
    store = _open(small_store, tmp_path / "log")
    rng = np.random.default_rng(0)
    for i in range(60):
        ops = _random_batch(rng, edges, n, 16)
        n += sum(op["op"] == "add_node" for op in ops)
        result = store.apply(ops)
        assert result.seq == i + 1 and result.graph_version.endswith(f".{i + 1}")
        if i % 20 == 19:
            store.compact()
    _assert_same(store, edges, n)
    assert store.graph.fragmentation() < 0.5
    store.close()
    replayed = _open(small_store, tmp_path / "log")  # the log rebuilds exactly the same graph
    assert replayed.replayed == 60 and replayed.graph.seq == 60
    _assert_same(replayed, edges, n)
    replayed.close()


def test_samples_hold_only_current_edges(small_store: Path, tmp_path) -> None:
    edges, n = _reference(small_store)
    store = _open(small_store, tmp_path / "log")
    rng = np.random.default_rng(1)
    sampler = NeighborSampler(store.graph, [5, 5])
    for _ in range(10):
        ops = _random_batch(rng, edges, n, 16)
        n += sum(op["op"] == "add_node" for op in ops)
        store.apply(ops)
        seeds = rng.integers(0, n, 32)
        sg = sampler.sample(seeds)
        for block in sg.blocks:
            src, dst = block.edge_index.numpy()
            for u, v in zip(sg.nodes[src].tolist(), sg.nodes[dst].tolist(), strict=True):
                assert edges[(u, v)] > 0
    store.close()


def test_features_follow_upserts_and_new_nodes(small_store: Path, tmp_path) -> None:
    store = _open(small_store, tmp_path / "log")
    n = store.graph.num_nodes
    result = store.apply(
        [
            {"op": "add_node", "features": [2.0] * 16},
            {"op": "add_edge", "src": 3, "dst": n},
            {"op": "upsert_features", "node": 3, "features": [-1.0] * 16},
        ]
    )
    assert result.new_nodes == [n]
    assert store.features.get(np.array([n, 3])).tolist() == [[2.0] * 16, [-1.0] * 16]
    assert store.graph.neighbors(n).tolist() == [3]
    store.close()


@pytest.mark.parametrize(
    ("ops", "field"),
    [
        ([{"op": "add_edge", "src": 0, "dst": 10**9}], "ops[1].dst"),
        ([{"op": "delete_edge", "src": 0, "dst": 0}], "ops[1]"),
        ([{"op": "add_node", "features": [1.0]}], "ops[1].features"),
        (
            [{"op": "upsert_features", "node": 1, "features": [float("nan")] * 16}],
            "ops[1].features",
        ),
        ([{"op": "rename"}], "ops[1].op"),
        ([{"op": "add_edge", "src": "1", "dst": 2}], "ops[1].src"),
    ],
)
def test_a_rejected_batch_changes_nothing(small_store: Path, tmp_path, ops, field) -> None:
    store = _open(small_store, tmp_path / "log")
    before = (store.graph.num_edges, store.graph.num_nodes, store.graph.seq)
    log_size = (tmp_path / "log").stat().st_size
    good_first = [{"op": "add_edge", "src": 1, "dst": 2}]
    with pytest.raises(UpdateRejectedError) as info:
        store.apply(good_first + ops)
    assert info.value.errors[0]["field"] == field
    assert (store.graph.num_edges, store.graph.num_nodes, store.graph.seq) == before
    assert (tmp_path / "log").stat().st_size == log_size
    store.close()


def test_log_of_another_store_is_refused(small_store: Path, tmp_path) -> None:
    from gnnserve.data.writer import GraphData, write_store
    from gnnserve.errors import StoreFormatError

    store = _open(small_store, tmp_path / "log")
    store.apply([{"op": "add_edge", "src": 1, "dst": 2}])
    store.close()
    other = tmp_path / "other"
    write_store(GraphData("o", 3, np.array([[0, 1], [1, 2]]), np.zeros((3, 16), np.float32)), other)
    with pytest.raises(StoreFormatError, match="written for store"):
        _open(other, tmp_path / "log")


@pytest.mark.parametrize(
    ("op", "index"),
    [
        ({"op": "add_node", "features": [0.0] * 15 + [1e39]}, 0),
        ({"op": "upsert_features", "node": 4, "features": [-1e39] + [0.0] * 15}, 1),
        ({"op": "add_edge", "src": 1, "dst": 10**6}, 1),
    ],
)
def test_replay_refuses_a_record_the_api_would_reject(
    small_store: Path, tmp_path, op: dict, index: int
) -> None:
    from gnnserve.dynamic.wal import UpdateLog
    from gnnserve.errors import StoreFormatError

    log_path = tmp_path / "log"
    store = _open(small_store, log_path)
    store.apply([{"op": "add_edge", "src": 1, "dst": 2}])
    store.close()
    # a record written before values were checked after the float32 cast (or by hand)
    ops = [op] if index == 0 else [{"op": "add_edge", "src": 3, "dst": 4}, op]
    writer = UpdateLog(log_path, fsync="never")
    writer.append(2, ops)
    writer.append(3, [{"op": "add_edge", "src": 5, "dst": 6}])
    writer.close()
    before = log_path.read_bytes()
    with pytest.raises(StoreFormatError) as info:
        _open(small_store, log_path)
    assert info.value.field == "wal"
    message = info.value.message
    assert "seq 2" in message and f"op {index}" in message and f"ops[{index}]" in message
    assert log_path.read_bytes() == before  # neither truncated nor appended to


def _version_a_reader_pins(store: DynamicStore) -> str:
    """The version a reader pinning now (in another thread) reads; it must not wait."""
    got: list[str] = []

    def read() -> None:
        got.append(store.view.acquire_read())
        store.view.release_read()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(5)
    assert got, "a reader waited for the writer"
    return got[0]


class _Recorder:
    """An UpdateListener writing each call, and the store's state then, into a shared list."""

    def __init__(self, name: str, store: DynamicStore, calls: list, check_unseen: bool) -> None:
        self.name, self.store, self.calls, self.check_unseen = name, store, calls, check_unseen

    def _state(self) -> tuple[int, int]:
        graph = self.store.graph
        if self.check_unseen:  # readers cannot see a batch before its listeners have it
            pinned = _version_a_reader_pins(self.store)
            assert pinned == f"{graph.meta.checksum}.{graph.seq - 1}", "listener called late"
        return graph.num_nodes, graph.seq

    def on_add_nodes(self, count: int) -> None:
        self.calls.append((self.name, "nodes", count, self._state()))

    def on_edge_events(self, kinds, srcs, dsts, neighbors_of) -> None:  # type: ignore[no-untyped-def]
        after = {v: sorted(neighbors_of(v).tolist()) for v in set(dsts.tolist())}
        events = list(zip(kinds.tolist(), srcs.tolist(), dsts.tolist(), strict=True))
        self.calls.append((self.name, "edges", events, after, self._state()))


def test_listeners_get_each_batch_in_order_after_it_applied(small_store: Path, tmp_path) -> None:
    edges, n = _reference(small_store)
    store = _open(small_store, tmp_path / "log")
    rng = np.random.default_rng(2)
    store.apply([{"op": "add_edge", "src": 0, "dst": 1}])
    edges[(0, 1)] += 1
    calls: list = []
    for name in ("a", "b"):  # subscribed after batch 1: they see batches 2.. only
        assert isinstance(_Recorder(name, store, calls, False), UpdateListener)
        store.subscribe(_Recorder(name, store, calls, check_unseen=name == "a"))
    want: list = []
    for seq in range(2, 12):
        ops = _random_batch(rng, edges, n, 16)
        added = sum(op["op"] == "add_node" for op in ops)
        n += added
        store.apply(ops)
        events = [
            (INSERT if op["op"] == "add_edge" else DELETE, op["src"], op["dst"])
            for op in ops
            if op["op"] in ("add_edge", "delete_edge")
        ]
        after: dict[int, list[int]] = {e[2]: [] for e in events}
        for (u, v), copies in edges.items():
            if v in after:
                after[v] += [u] * copies
        after = {v: sorted(us) for v, us in after.items()}
        for name in ("a", "b"):
            if added:
                want.append((name, "nodes", added, (n, seq)))
            if events:
                want.append((name, "edges", events, after, (n, seq)))
    assert calls == want
    store.close()


def test_presampler_is_an_update_listener(small_store: Path) -> None:
    graph = open_graph_store(small_store)
    assert isinstance(PreSampler(*graph.csr(), [2], seed=0), UpdateListener)


def test_the_changing_graph_imports_nothing_above_it() -> None:
    """dynamic/ sits beside sampling/ and above graph/: no import from graph storage upwards."""
    code = (
        "import sys, gnnserve.dynamic.store, gnnserve.dynamic.warmup, gnnserve.dynamic.logtool\n"
        "import gnnserve.graph, gnnserve.graph.events\n"
        "print(' '.join(sorted(m for m in sys.modules if m.startswith('gnnserve.'))))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    loaded = out.stdout.split()
    above = ("sampling", "models", "embeddings", "newnodes", "engine", "deploy", "server")
    assert not [m for m in loaded if m.split(".")[1] in above], loaded
    assert "gnnserve.dynamic.store" in loaded
