"""Synthetic generators: SBM structure and learnability, R-MAT determinism and skew."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numba
import numpy as np
import pytest

from gnnserve.data import generators
from gnnserve.data.writer import GraphData, write_store
from gnnserve.errors import InvalidInputError

# --- SBM ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def small_sbm() -> GraphData:
    return generators.sbm(num_nodes=4000, num_classes=4, feature_dim=16, avg_degree=12, seed=1)


def test_sbm_is_deterministic() -> None:
    a = generators.sbm(num_nodes=1000, num_classes=4, seed=5)
    b = generators.sbm(num_nodes=1000, num_classes=4, seed=5)
    c = generators.sbm(num_nodes=1000, num_classes=4, seed=6)
    np.testing.assert_array_equal(a.edge_index, b.edge_index)
    np.testing.assert_array_equal(a.x, b.x)
    np.testing.assert_array_equal(np.asarray(a.y), np.asarray(b.y))
    assert not np.array_equal(np.asarray(a.y), np.asarray(c.y))


def test_sbm_is_undirected_simple_and_sized(small_sbm: GraphData) -> None:
    g, n = small_sbm, small_sbm.num_nodes
    src, dst = g.edge_index
    assert not (src == dst).any()
    keys = src * n + dst
    assert np.unique(keys).size == keys.size  # no repeated edge
    np.testing.assert_array_equal(np.sort(keys), np.sort(dst * n + src))  # both directions
    assert abs(keys.size / n - 12) < 0.6  # mean degree
    assert g.x.shape == (n, 16) and g.x.dtype == np.float32
    np.testing.assert_array_equal(np.bincount(np.asarray(g.y)), [1000] * 4)


def test_sbm_homophily_matches_the_ratio(small_sbm: GraphData) -> None:
    y = np.asarray(small_sbm.y)
    same = float((y[small_sbm.edge_index[0]] == y[small_sbm.edge_index[1]]).mean())
    assert same == pytest.approx(6.0 / (6.0 + 4 - 1), abs=0.03)


def test_sbm_masks_are_a_60_20_20_partition(small_sbm: GraphData) -> None:
    masks = [small_sbm.train_mask, small_sbm.val_mask, small_sbm.test_mask]
    stacked = np.stack([np.asarray(m) for m in masks])
    np.testing.assert_array_equal(stacked.sum(axis=0), np.ones(4000))
    assert stacked.sum(axis=1).tolist() == [2400, 800, 800]


def test_sbm_features_carry_class_signal(small_sbm: GraphData) -> None:
    y, x = np.asarray(small_sbm.y), small_sbm.x
    train = np.asarray(small_sbm.train_mask)
    means = np.stack([x[train & (y == c)].mean(axis=0) for c in range(4)])
    pred = np.argmin(((x[:, None, :] - means[None]) ** 2).sum(-1), axis=1)
    acc = float((pred[~train] == y[~train]).mean())
    assert 0.4 < acc < 0.99  # informative, not trivial (chance 0.25)


def test_sbm_writes_a_store(small_sbm: GraphData, tmp_path: Path) -> None:
    meta = write_store(small_sbm, tmp_path / "s")
    assert meta.num_classes == 4 and meta.num_edges == small_sbm.edge_index.shape[1]
    assert "sbm(" in meta.source and "seed=1" in meta.source


def test_sbm_rejects_bad_parameters() -> None:
    with pytest.raises(InvalidInputError):
        generators.sbm(num_nodes=5, num_classes=8)
    with pytest.raises(InvalidInputError):
        generators.sbm(num_nodes=100, num_classes=2, avg_degree=-1)


@pytest.mark.slow
def test_default_sbm_is_learnable_by_graphsage() -> None:
    """The ``make demo`` graph: 2-layer GraphSAGE, 50 full-graph epochs, >= 85% test accuracy."""
    import torch
    import torch.nn.functional as F
    from torch_geometric.nn import SAGEConv

    g = generators.sbm()
    torch.manual_seed(0)
    x, ei = torch.from_numpy(g.x), torch.from_numpy(g.edge_index)
    y = torch.from_numpy(np.asarray(g.y))
    train, test = (
        torch.from_numpy(np.asarray(g.train_mask)),
        torch.from_numpy(np.asarray(g.test_mask)),
    )
    conv1, conv2 = SAGEConv(x.shape[1], 64), SAGEConv(64, 8)
    params = list(conv1.parameters()) + list(conv2.parameters())
    opt = torch.optim.Adam(params, lr=0.01, weight_decay=5e-4)
    for _ in range(50):
        opt.zero_grad()
        loss = F.cross_entropy(conv2(F.relu(conv1(x, ei)), ei)[train], y[train])
        loss.backward()
        opt.step()
    with torch.no_grad():
        pred = conv2(F.relu(conv1(x, ei)), ei).argmax(1)
    assert float((pred[test] == y[test]).float().mean()) >= 0.85


# --- R-MAT ----------------------------------------------------------------------------------

N_SMALL, E_SMALL = 2**14, 2**17


@pytest.fixture(scope="module")
def small_rmat() -> np.ndarray:
    return generators.rmat_edges(N_SMALL, E_SMALL, seed=0)


def test_rmat_count_range_and_no_self_loops(small_rmat: np.ndarray) -> None:
    assert small_rmat.shape == (2, E_SMALL) and small_rmat.dtype == np.int64
    assert small_rmat.min() >= 0 and small_rmat.max() < N_SMALL
    assert not (small_rmat[0] == small_rmat[1]).any()


def test_rmat_is_deterministic_and_thread_independent(small_rmat: np.ndarray) -> None:
    np.testing.assert_array_equal(generators.rmat_edges(N_SMALL, E_SMALL, seed=0), small_rmat)
    threads = numba.get_num_threads()
    numba.set_num_threads(1)
    try:
        single = generators.rmat_edges(N_SMALL, E_SMALL, seed=0)
    finally:
        numba.set_num_threads(threads)
    np.testing.assert_array_equal(single, small_rmat)
    assert not np.array_equal(generators.rmat_edges(N_SMALL, E_SMALL, seed=1), small_rmat)


def test_rmat_degrees_are_skewed(small_rmat: np.ndarray) -> None:
    degree = np.bincount(small_rmat.ravel(), minlength=N_SMALL)
    assert degree.max() > 50 * degree.mean()
    top = np.sort(degree)[::-1]
    assert top[: N_SMALL // 100].sum() > 0.2 * degree.sum()  # top 1% of nodes: >20% of endpoints


def test_rmat_unpermuted_hub_is_node_zero() -> None:
    edges = generators.rmat_edges(N_SMALL, E_SMALL, seed=0, permute=False)
    assert int(np.argmax(np.bincount(edges[0], minlength=N_SMALL))) == 0


def test_rmat_non_power_of_two_and_features(tmp_path: Path) -> None:
    g = generators.rmat(num_nodes=3000, num_edges=20_000, feature_dim=8, seed=2)
    assert g.edge_index.max() < 3000 and g.x.shape == (3000, 8) and g.y is None
    np.testing.assert_array_equal(g.x, generators.rmat(3000, 20_000, 8, seed=2).x)
    meta = write_store(g, tmp_path / "r")
    assert meta.num_edges == 20_000 and meta.num_classes == 0 and not meta.has_labels


@pytest.mark.parametrize(
    "kwargs",
    [{"a": 0.5, "b": 0.3, "c": 0.3}, {"a": 0.0}, {"b": 0.0, "c": 0.0}, {"num_nodes": 1}],
)
def test_rmat_rejects_bad_parameters(kwargs: dict[str, Any]) -> None:
    args: dict[str, Any] = {"num_nodes": 64, "num_edges": 10} | kwargs
    with pytest.raises(InvalidInputError):
        generators.rmat_edges(**args)
