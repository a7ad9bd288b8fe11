"""VersionedGraph / VersionedFeatures: a read pins one version, never waits for a writer, and
sees exactly that version (no torn batch, no edge or feature from a later one)."""

from __future__ import annotations

import sys
import threading
from collections import Counter
from pathlib import Path

import numpy as np

from gnnserve.dynamic.store import DynamicStore
from gnnserve.features import open_feature_store
from gnnserve.graph import open_graph_store
from gnnserve.graph.base import GraphStore


def _open(store: Path, log: Path) -> DynamicStore:
    return DynamicStore(open_graph_store(store), open_feature_store(store), log, fsync="never")


def test_view_reads_equal_the_graphs(small_store: Path, tmp_path: Path) -> None:
    store = _open(small_store, tmp_path / "log")
    store.apply(
        [{"op": "add_node", "features": [0.0] * 16}, {"op": "add_edge", "src": 5, "dst": 3}]
    )
    view, graph = store.view, store.graph
    assert view.mutable and view.version == graph.version == f"{graph.meta.checksum}.1"
    assert (view.num_nodes, view.num_edges) == (graph.num_nodes, graph.num_edges)
    for got, want in zip(view.adjacency(), graph.adjacency(), strict=True):
        assert got is want  # the kernels get the current copy's own arrays
    for got, want in zip(view.csr(), graph.csr(), strict=True):
        np.testing.assert_array_equal(got, want)
    ids = np.arange(graph.num_nodes)
    np.testing.assert_array_equal(view.gcn_degree(ids), graph.gcn_degree(ids))
    np.testing.assert_array_equal(view.in_degree(), graph.in_degree())
    assert view.neighbors(3).tolist() == graph.neighbors(3).tolist()
    store.close()


def test_both_copies_hold_the_same_rows_in_the_same_order(small_store: Path, tmp_path) -> None:
    """Fixed-seed sampling must not depend on which copy a read lands on."""
    store = _open(small_store, tmp_path / "log")
    rng = np.random.default_rng(0)
    for _ in range(5):
        u, v = rng.integers(0, 2000, (2, 50))
        store.apply(
            [{"op": "add_edge", "src": int(a), "dst": int(b)} for a, b in zip(u, v, strict=True)]
        )
        store.apply([{"op": "delete_edge", "src": int(u[i]), "dst": int(v[i])} for i in (0, 7)])
    store.compact()
    first, second = (side.graph for side in store._replicas._sides)
    assert first is not second and first.version == second.version
    for a, b in zip(first.csr(), second.csr(), strict=True):
        np.testing.assert_array_equal(a, b)
    store.close()


def test_the_graphs_methods_are_not_patched(small_store: Path, tmp_path: Path) -> None:
    store = _open(small_store, tmp_path / "log")
    assert not {"acquire_read", "release_read"} & set(vars(store.graph))
    assert type(store.graph).acquire_read is GraphStore.acquire_read
    store.close()


def test_a_pinned_read_holds_its_version_and_does_not_hold_back_new_readers(
    small_store: Path, tmp_path: Path
) -> None:
    store = _open(small_store, tmp_path / "log")
    view = store.view
    old = view.acquire_read()
    before = view.neighbors(2).tolist()
    store.apply([{"op": "add_edge", "src": 1, "dst": 2}])  # published: acknowledged
    newer: list[tuple[str, list[int]]] = []

    def read_new() -> None:  # a reader arriving now gets the new version without waiting
        newer.append((view.acquire_read(), view.neighbors(2).tolist()))
        view.release_read()

    reader = threading.Thread(target=read_new, daemon=True)
    reader.start()
    reader.join(120)  # generous: a busy machine (or a cold numba cache) is slow, not wrong
    assert newer and newer[0][0] == f"{store.graph.meta.checksum}.1"
    assert sorted(newer[0][1]) == sorted([*before, 1])
    assert view.version == old and view.neighbors(2).tolist() == before  # the pinned one
    applied = threading.Event()
    writer = threading.Thread(
        target=lambda: (store.apply([{"op": "add_edge", "src": 7, "dst": 2}]), applied.set()),
        daemon=True,
    )
    writer.start()  # the next batch needs the copy the pinned reader holds
    assert not applied.wait(0.2), "the writer changed a copy a reader still held"
    assert view.neighbors(2).tolist() == before
    pin = view.detach_read()  # hand the read to another thread, as the engine's stages do
    seen: list[list[int]] = []

    def finish() -> None:
        view.attach_read(pin)
        seen.append(view.neighbors(2).tolist())
        view.release_read()

    threading.Thread(target=finish, daemon=True).start()
    assert applied.wait(120)  # the writer went on once the last old reader left
    writer.join(120)
    assert seen == [before]
    assert view.acquire_read() == store.graph.version == f"{store.graph.meta.checksum}.2"
    assert sorted(view.neighbors(2).tolist()) == sorted([*before, 1, 7])
    view.release_read()
    store.close()


PROBES = 12  # nodes whose in-neighbours and features the stress test follows


def _stream(n: int, batches: int, seed: int) -> tuple[list[list[dict]], list[dict]]:
    """Batches that change the probe nodes, and each version's state of the probes."""
    rng = np.random.default_rng(seed)
    edges: dict[int, Counter[int]] = {p: Counter() for p in range(PROBES)}
    feats = {p: 0.0 for p in range(PROBES)}
    states = [_state(edges, feats, n)]
    stream = []
    for seq in range(1, batches + 1):
        ops: list[dict] = [{"op": "add_node", "features": [float(seq)] * 16}]
        n += 1
        for _ in range(40):
            dst = int(rng.integers(PROBES))
            live = [u for u, c in edges[dst].items() if c > 0]
            if live and rng.random() < 0.4:
                src = live[int(rng.integers(len(live)))]
                ops.append({"op": "delete_edge", "src": src, "dst": dst})
                edges[dst][src] -= 1
            else:
                src = int(rng.integers(n))
                ops.append({"op": "add_edge", "src": src, "dst": dst})
                edges[dst][src] += 1
        for p in rng.choice(PROBES, 3, replace=False).tolist():
            ops.append({"op": "upsert_features", "node": p, "features": [float(seq)] * 16})
            feats[p] = float(seq)
        stream.append(ops)
        states.append(_state(edges, feats, n))
    return stream, states


def _state(edges: dict[int, Counter[int]], feats: dict[int, float], n: int) -> dict:
    return {
        "n": n,
        "in": [sorted(edges[p].elements()) for p in range(PROBES)],
        "x": [feats[p] for p in range(PROBES)],
    }


def _observe(store: DynamicStore, hand_over: bool) -> tuple[str, dict]:
    """One pinned read of the probes; with ``hand_over`` half of it in a second thread."""
    view, probes = store.view, np.arange(PROBES)
    version = view.acquire_read()
    seen = {"n": view.num_nodes, "in": [sorted(view.neighbors(p).tolist()) for p in probes]}
    if hand_over:
        pin = view.detach_read()
        other = threading.Thread(target=lambda: (view.attach_read(pin), _features(store, seen)))
        other.start()
        other.join()
    else:
        _features(store, seen)
    return version, seen


def _features(store: DynamicStore, seen: dict) -> None:
    x = store.features.get(np.arange(PROBES)).numpy()
    assert (x == x[:, :1]).all()
    seen["x"] = x[:, 0].tolist()
    store.view.release_read()


def test_concurrent_readers_see_exactly_the_version_they_report(
    small_store: Path, tmp_path: Path
) -> None:
    """Writers and readers at once: every read equals the reference state of its version."""
    store = _open(small_store, tmp_path / "log")
    base = store.graph
    for p in range(PROBES):  # start the probes empty: the reference then knows every edge
        ops = [{"op": "delete_edge", "src": int(u), "dst": p} for u in base.neighbors(p)]
        ops += [{"op": "upsert_features", "node": p, "features": [0.0] * 16}]
        store.apply(ops)
    first = store.graph.seq
    stream, states = _stream(store.graph.num_nodes, 150, seed=1)
    done = threading.Event()
    reads: list[tuple[str, dict]] = []

    def write() -> None:
        for i, ops in enumerate(stream):
            store.apply(ops)
            if i % 50 == 49:
                store.compact()
        done.set()

    def read(hand_over: bool) -> None:
        while not done.is_set():
            reads.append(_observe(store, hand_over))

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # interleave the threads finely
    try:
        threads = [threading.Thread(target=write)]
        threads += [threading.Thread(target=read, args=(h,)) for h in (False, True)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
    finally:
        sys.setswitchinterval(interval)
    assert done.is_set()
    versions = set()
    for version, seen in reads:
        seq = int(version.rsplit(".", 1)[1]) - first
        assert seen == states[seq], f"read at version {version} saw another state"
        versions.add(seq)
    assert len(versions) > 20, "readers and the writer did not overlap"
    store.close()


def _blocks(subgraph) -> list[list[int]]:  # type: ignore[no-untyped-def]
    out = [subgraph.nodes.tolist()]
    return out + [b.edge_index.flatten().tolist() for b in subgraph.blocks]


def test_a_pre_sampler_reads_the_version_its_reader_pinned(small_store: Path, tmp_path) -> None:
    """A subscribed PreSampler has a twin per graph copy: a pinned reader keeps sampling the
    old reservoirs while a new reader already samples those after the batch."""
    from gnnserve.graph.events import DELETE, INSERT
    from gnnserve.sampling.presample import PreSampler

    store = _open(small_store, tmp_path / "log")
    presampler = PreSampler(*store.graph.csr(), [3, 2], seed=0)
    reference = PreSampler(*store.graph.csr(), [3, 2], seed=0)  # fed the same batch by hand
    store.subscribe(presampler)
    seeds = np.arange(40, dtype=np.int64)
    store.view.acquire_read()
    before = _blocks(presampler.sample(seeds))
    assert before == _blocks(reference.sample(seeds))
    victims = [(int(store.graph.neighbors(v)[0]), v) for v in range(20)]
    ops = [{"op": "delete_edge", "src": u, "dst": v} for u, v in victims]
    ops += [{"op": "add_edge", "src": 1000 + v, "dst": v} for v in range(20, 40)]
    writer = threading.Thread(target=store.apply, args=(ops,), daemon=True)
    writer.start()
    after: list = []

    def read_new() -> None:
        while not after:
            if store.view.acquire_read().endswith(".1"):
                after.append(_blocks(presampler.sample(seeds)))
            store.view.release_read()

    reader = threading.Thread(target=read_new, daemon=True)
    reader.start()
    reader.join(120)  # generous: a busy machine (or a cold numba cache) is slow, not wrong
    assert _blocks(presampler.sample(seeds)) == before  # this thread still reads version 0
    store.view.release_read()
    writer.join(120)
    kinds = np.array([DELETE] * 20 + [INSERT] * 20)
    srcs = np.array([op["src"] for op in ops])
    dsts = np.array([op["dst"] for op in ops])
    reference.on_edge_events(kinds, srcs, dsts, store.graph.neighbors)
    assert after == [_blocks(reference.sample(seeds))] and after[0] != before
    active, spare = store._replicas.both()  # the twins drew the same replacements
    assert _blocks(active.listeners[0].sample(seeds)) == _blocks(spare.listeners[0].sample(seeds))
    store.close()
