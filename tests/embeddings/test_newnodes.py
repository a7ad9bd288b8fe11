"""parse_new_nodes error paths and the AdjacencyOverlay's view of G+ (checked by brute force)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from gnnserve.data.writer import GraphData, write_store
from gnnserve.embeddings.newnodes import AdjacencyOverlay, check_new_nodes, parse_new_nodes
from gnnserve.errors import InvalidInputError, TooManyNodesError
from gnnserve.graph import GraphStore, open_graph_store
from gnnserve.types import NewNodes
from tests.conftest import random_simple_graph
from tests.embeddings.reference import request_edges

N, FEAT = 50, 4
FEATS = "new_nodes.features"
EDGES = "new_nodes.edges"
NEW_EDGES = "new_nodes.new_edges"


def parse(features: object = None, edges: object = None, new_edges: object = None, **kw: object):  # type: ignore[no-untyped-def]
    if features is None:
        features = np.ones((3, FEAT))
    opts: dict = {"num_nodes": N, "feature_dim": FEAT} | kw
    return parse_new_nodes(features, edges, new_edges, **opts)


# ------------------------------------------------------------------ parsing


def test_accepts_lists_arrays_tensors_and_empty_edges() -> None:
    new = parse([[1, 2, 3, 4], [5, 6, 7, 8]], [[0, 3], [1, 49], [1, 49]], [[0, 1]])
    assert new.count == 2 and new.features.dtype == torch.float32
    assert new.features.shape == (2, FEAT)
    assert new.edges.dtype == np.int64 and new.edges.shape == (3, 2)  # duplicates kept
    np.testing.assert_array_equal(new.new_edges, [[0, 1]])
    for empty in (None, [], np.empty((0, 2)), [[]]):
        got = parse(torch.zeros(1, FEAT, dtype=torch.float64), empty, empty)
        assert got.edges.shape == (0, 2) and got.new_edges.shape == (0, 2)
        assert got.edges.dtype == np.int64
    floats = parse(edges=np.array([[0.0, 7.0]]))
    np.testing.assert_array_equal(floats.edges, [[0, 7]])
    assert parse(max_new_nodes=3).count == 3


@pytest.mark.parametrize(
    ("features", "words"),
    [
        ([[1.0, 2.0], [3.0]], "rectangular"),
        (np.ones(FEAT), "2-D"),
        (np.ones((2, FEAT, 1)), "2-D"),
        (np.ones((0, FEAT)), "at least one"),
        (np.ones((2, FEAT + 1)), "columns"),
        (np.array([["a"] * FEAT]), "real numbers"),
        (np.ones((1, FEAT), dtype=np.complex64), "real numbers"),
        (np.ones((1, FEAT), dtype=bool), "real numbers"),
        (np.array([[0.0, np.nan, 0.0, 0.0]]), "NaN"),
        (np.array([[0.0, 0.0, 0.0, -np.inf]]), "NaN"),
        (np.array([[0.0, 0.0, 1e39, 0.0]]), "overflow"),
    ],
)
def test_bad_features(features: object, words: str) -> None:
    with pytest.raises(InvalidInputError) as err:
        parse(features)
    assert err.value.field == FEATS and words in err.value.message


def test_too_many_new_nodes() -> None:
    with pytest.raises(TooManyNodesError) as err:
        parse(np.ones((4, FEAT)), max_new_nodes=3)
    assert err.value.field == FEATS and err.value.http_status == 413


@pytest.mark.parametrize(
    ("edges", "words"),
    [
        ([[0, 1, 2]], "shape"),
        ([0, 1], "shape"),
        ([[0, 1], [2]], "rectangular"),
        ([[0, 1.5]], "integer"),
        ([["0", "1"]], "integer"),
        ([[True, False]], "integer"),
        ([[0, np.nan]], "integer"),
        ([[3, 1]], "new node index 3"),
        ([[-1, 1]], "new node index -1"),
        ([[0, N]], f"existing node id {N}"),
        ([[0, -2]], "existing node id -2"),
    ],
)
def test_bad_edges(edges: object, words: str) -> None:
    with pytest.raises(InvalidInputError) as err:
        parse(edges=edges)
    assert err.value.field == EDGES and words in err.value.message


@pytest.mark.parametrize(
    ("new_edges", "words"),
    [
        ([[0, 1, 2]], "shape"),
        ([[0, 1], [1]], "rectangular"),
        ([[0.5, 1]], "integer"),
        ([[0, 3]], "new node index 3"),
        ([[-1, 0]], "new node index -1"),
        ([[2, 2]], "self loop (2, 2)"),
    ],
)
def test_bad_new_edges(new_edges: object, words: str) -> None:
    with pytest.raises(InvalidInputError) as err:
        parse(new_edges=new_edges)
    assert err.value.field == NEW_EDGES and words in err.value.message


def test_check_new_nodes_revalidates() -> None:
    good = parse(edges=[[0, 1]])
    assert check_new_nodes(good, N, FEAT).count == 3
    with pytest.raises(InvalidInputError) as err:
        check_new_nodes(good, N, FEAT + 1)
    assert err.value.field == FEATS
    with pytest.raises(InvalidInputError):
        check_new_nodes("nodes", N, FEAT)  # type: ignore[arg-type]


# ------------------------------------------------------------------ overlay


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
