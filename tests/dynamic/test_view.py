"""VersionedGraph: reads are the graph's; a read pins one version until released."""

from __future__ import annotations

import threading
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
        assert got is want  # the kernels get the graph's own arrays
    for got, want in zip(view.csr(), graph.csr(), strict=True):
        np.testing.assert_array_equal(got, want)
    ids = np.arange(graph.num_nodes)
    np.testing.assert_array_equal(view.gcn_degree(ids), graph.gcn_degree(ids))
    np.testing.assert_array_equal(view.in_degree(), graph.in_degree())
    assert view.neighbors(3).tolist() == graph.neighbors(3).tolist()
    store.close()


def test_the_graphs_methods_are_not_patched(small_store: Path, tmp_path: Path) -> None:
    store = _open(small_store, tmp_path / "log")
    assert not {"acquire_read", "release_read"} & set(vars(store.graph))
    assert type(store.graph).acquire_read is GraphStore.acquire_read
    store.close()


def test_a_read_pins_its_version_until_released(small_store: Path, tmp_path: Path) -> None:
    store = _open(small_store, tmp_path / "log")
    version = store.view.acquire_read()
    assert version == store.graph.version
    applied = threading.Event()

    def write() -> None:
        store.apply([{"op": "add_edge", "src": 1, "dst": 2}])
        applied.set()

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    assert not applied.wait(0.2), "a batch was applied under a pinned version"
    assert store.graph.version == version
    done = threading.Event()
    threading.Thread(target=lambda: (store.view.release_read(), done.set()), daemon=True).start()
    assert done.wait(5)  # another thread may end the read (the engine's fetch stage does)
    assert applied.wait(5)
    writer.join(5)
    assert store.view.acquire_read() == store.graph.version == f"{store.graph.meta.checksum}.1"
    store.view.release_read()
    store.close()
