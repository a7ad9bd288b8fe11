"""Affected sets against brute force: every PE recomputed on the graph after a random batch
(inserted and deleted edges, rewritten features, added nodes with edges); the nodes outside
``A_l`` keep their layer-``l`` embedding, and most nodes inside it change (the sets are not
everything). GCN (degree-normalised), SAGE and GAT."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from gnnserve.data.writer import GraphData, write_store
from gnnserve.embeddings.affected import AffectedSets, BatchChanges, out_adjacency
from gnnserve.embeddings.precompute import precompute_embeddings
from gnnserve.features import open_feature_store
from gnnserve.graph import open_graph_store
from gnnserve.models.zoo import GNN, ModelConfig
from tests.conftest import random_simple_graph

N, F = 400, 8


def _pes(model: GNN, edges: np.ndarray, x: np.ndarray, out: Path) -> list[np.ndarray]:
    write_store(GraphData("g", x.shape[0], edges, x), out)
    store = precompute_embeddings(
        model, open_graph_store(out), open_feature_store(out), model_version="m", progress=False
    )
    return [store.layer(i + 1) for i in range(model.config.num_layers)]


def _batch(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray, BatchChanges]:
    """(old edges, new edges, new features, the batch's changes): 6 edges deleted, 6 inserted,
    5 feature rows rewritten, 2 nodes added with 3 edges each."""
    old = random_simple_graph(N, 1600, seed=int(rng.integers(1 << 30)))
    x = rng.standard_normal((N, F)).astype(np.float32)
    keep = np.ones(old.shape[1], bool)
    gone = rng.choice(old.shape[1], 6, replace=False)
    keep[gone] = False
    present = set(map(tuple, old.T.tolist()))
    fresh: list[tuple[int, int]] = []
    while len(fresh) < 6:
        s, d = (int(v) for v in rng.integers(0, N, 2))
        if s != d and (s, d) not in present and (s, d) not in fresh:
            fresh.append((s, d))
    added = np.array([N, N + 1])
    links = [(int(a), int(rng.integers(0, N))) for a in added for _ in range(3)]
    links = [(s, d) if i % 2 else (d, s) for i, (s, d) in enumerate(links)]  # in and out edges
    new = np.concatenate([old[:, keep], np.array(fresh + links).T], axis=1)
    rows = rng.choice(N, 5, replace=False)
    x_new = np.concatenate([x, rng.standard_normal((2, F)).astype(np.float32)])
    x_new[rows] = rng.standard_normal((5, F)).astype(np.float32)
    dsts = np.concatenate([old[1, gone], np.array(fresh + links)[:, 1]])
    return old, new, (x, x_new), BatchChanges(dsts, rows, added)  # type: ignore[return-value]


@pytest.mark.parametrize(("arch", "layers"), [("gcn", 2), ("gcn", 3), ("sage", 2), ("gat", 2)])
def test_nodes_outside_the_affected_sets_keep_their_embeddings(
    tmp_path: Path, arch: str, layers: int
) -> None:
    rng = np.random.default_rng(layers * 7 + len(arch))
    old, new, (x, x_new), changes = _batch(rng)
    torch.manual_seed(0)
    model = GNN(ModelConfig(arch, in_dim=F, hidden_dim=16, out_dim=4, num_layers=layers, heads=2))
    before, after = _pes(model, old, x, tmp_path / "old"), _pes(model, new, x_new, tmp_path / "new")
    new_store = open_graph_store(tmp_path / "new")
    sets = AffectedSets(layers, model.needs_degree).compute(
        *out_adjacency(*new_store.csr()), changes
    )
    for layer, affected in enumerate(sets):
        inside = np.zeros(N + 2, bool)
        inside[affected] = True
        assert inside[N:].all()  # the added nodes
        same = np.isclose(before[layer], after[layer][:N], rtol=0, atol=1e-6).all(axis=1)
        assert same[~inside[:N]].all(), np.flatnonzero(~inside[:N] & ~same)
        changed = (~same[inside[:N]]).mean()
        assert changed > 0.6, (layer, changed)  # tight: not everything "might" change
        assert layer or inside.sum() < 0.5 * (N + 2)  # A_1: not the whole graph
        if layer:
            assert np.isin(sets[layer - 1], affected).all()  # sets grow with depth


def test_sets_follow_out_edges_and_refuse_bad_ids() -> None:
    # 0 -> 1 -> 2 -> 3, and 4 -> 0; in-neighbour CSR of that graph
    indptr, indices = np.array([0, 1, 2, 3, 4, 4]), np.array([4, 0, 1, 2])
    out = out_adjacency(indptr, indices)
    sage = AffectedSets(3, degree_normalised=False)
    got = sage.compute(*out, BatchChanges(np.zeros(0, np.int64), features=np.array([0])))
    assert [s.tolist() for s in got] == [[0, 1], [0, 1, 2], [0, 1, 2, 3]]
    gcn = AffectedSets(2, degree_normalised=True)  # 1 gained an in-edge: its degree changed
    got = gcn.compute(*out, BatchChanges(np.array([1])))
    assert [s.tolist() for s in got] == [[1, 2], [1, 2, 3]]
    assert [s.tolist() for s in sage.compute(*out, BatchChanges(np.array([1])))][0] == [1]
    with pytest.raises(ValueError, match="features holds ids outside"):
        sage.compute(*out, BatchChanges(np.zeros(0, np.int64), features=np.array([5])))
