"""parse_new_nodes and check_new_nodes: accepted inputs and error paths (typed, with a field)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gnnserve.errors import InvalidInputError, TooManyNodesError
from gnnserve.newnodes.parse import check_new_nodes, parse_new_nodes

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
