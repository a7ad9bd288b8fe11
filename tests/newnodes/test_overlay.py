"""The AdjacencyOverlay's view of G+ (stored graph plus request edges), checked by brute force."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from gnnserve.data.writer import GraphData, write_store
from gnnserve.graph import GraphStore, open_graph_store
from gnnserve.newnodes.overlay import AdjacencyOverlay
from gnnserve.types import NewNodes
from tests.conftest import random_simple_graph
from tests.embeddings.reference import request_edges
from tests.newnodes.test_parse import FEAT, N, parse


@pytest.fixture(scope="module")
def graph(tmp_path_factory: pytest.TempPathFactory) -> tuple[GraphStore, np.ndarray]:
    ei = random_simple_graph(N, 300, seed=4)
    ei = np.concatenate([ei, [[5], [5]]], axis=1)  # a self loop
    out = tmp_path_factory.mktemp("overlay") / "store"
    write_store(GraphData("o", N, ei, np.zeros((N, FEAT), np.float32)), out)
    return open_graph_store(out), ei


def in_lists(edge_index: np.ndarray) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for a, b in edge_index.T.tolist():
        out.setdefault(b, []).append(a)
    return out


def random_new(seed: int, m: int = 4, e: int = 12) -> NewNodes:
    rng = np.random.default_rng(seed)
    edges = np.stack([rng.integers(0, m, e), rng.integers(0, N, e)], 1)
    edges = np.concatenate([edges, [[0, 5], [0, 5]]])
    return parse(np.ones((m + 1, FEAT)), edges, [[0, 1], [1, m - 1]])  # node m isolated


def check_view(view, graph: GraphStore, ei: np.ndarray, new: NewNodes) -> None:  # type: ignore[no-untyped-def]
    want = in_lists(np.concatenate([ei, request_edges(new, N)], axis=1))
    for v in range(N + new.count):
        lo, d = int(view.row_start[v]), int(view.degree[v])
        got = view.indices[lo : lo + d].tolist()
        assert sorted(got) == sorted(want.get(v, [])), v
    touched = sorted({int(b) for b in request_edges(new, N)[1]})
    assert view.touched.tolist() == touched
    extra = np.bincount(request_edges(new, N)[1], minlength=N + new.count)
    np.testing.assert_array_equal(view.extra_in(np.arange(N + new.count)), extra)


def snapshot(ov: AdjacencyOverlay) -> tuple[np.ndarray, ...]:
    base = ov.indices.size - ov.spare
    return ov.row_start.copy(), ov.degree.copy(), ov.indices[:base].copy()


def test_overlay_presents_gplus_and_restores(graph) -> None:
    g, ei = graph
    ov = AdjacencyOverlay(g, max_new_nodes=8, spare=256)
    before = snapshot(ov)
    for seed in range(5):
        new = random_new(seed)
        with ov.patched(new) as view:
            check_view(view, g, ei, new)
            assert view.local_id.size >= N + new.count and (view.local_id == -1).all()
        for a, b in zip(before, snapshot(ov), strict=True):
            np.testing.assert_array_equal(a, b)
    row_start, degree, indices = g.adjacency()
    for v in range(N):  # untouched copy equals the store
        lo, d = int(ov.row_start[v]), int(ov.degree[v])
        assert ov.indices[lo : lo + d].tolist() == indices[row_start[v] : row_start[v] + d].tolist()


def test_overlay_grows_rows_and_spare(graph) -> None:
    g, ei = graph
    ov = AdjacencyOverlay(g, max_new_nodes=1, spare=2)
    hub = int(np.bincount(ei[1], minlength=N).argmax())
    edges = [[i, hub] for i in range(6)] + [[i, (7 * i) % N] for i in range(6)]
    new = parse(np.ones((7, FEAT)), edges, [[5, 6]])
    with ov.patched(new) as view:
        check_view(view, g, ei, new)
    assert ov.capacity >= 7 and ov.spare >= 6
    with ov.patched(random_new(1)) as view:  # still right after growing
        check_view(view, g, ei, random_new(1))


def test_overlay_restores_after_an_error(graph) -> None:
    g, _ = graph
    ov = AdjacencyOverlay(g, max_new_nodes=8)
    before = snapshot(ov)
    with pytest.raises(RuntimeError), ov.patched(random_new(2)):
        raise RuntimeError("boom")
    for a, b in zip(before, snapshot(ov), strict=True):
        np.testing.assert_array_equal(a, b)


def test_overlay_isolated_request(graph) -> None:
    g, ei = graph
    ov = AdjacencyOverlay(g)
    new = parse(np.ones((2, FEAT)), [], [])
    with ov.patched(new) as view:
        assert view.touched.size == 0
        check_view(view, g, ei, new)
        np.testing.assert_array_equal(view.extra_in(np.array([0, N])), [0, 0])


def test_overlay_index_dtype_holds_new_ids(tmp_path: Path) -> None:
    ei = random_simple_graph(10, 30, seed=1)
    write_store(GraphData("d", 10, ei, np.zeros((10, FEAT), np.float32)), tmp_path / "s")
    g = open_graph_store(tmp_path / "s")
    ov = AdjacencyOverlay(g)
    assert np.iinfo(ov.indices.dtype).max > 10 + ov.capacity
