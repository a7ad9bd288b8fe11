"""Incremental refresh against a full precompute: after a random batch (deleted and inserted
edges, rewritten features, added nodes), refreshing only the affected rows of the old PEs gives
every PE of a full precompute on the new graph (within 1e-5), for GCN, SAGE and GAT, also in
chunks smaller than one node's in-edges."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from gnnserve.embeddings.affected import AffectedSets, out_adjacency
from gnnserve.embeddings.refresh import refresh_layers, rows_block
from gnnserve.features import open_feature_store
from gnnserve.graph import open_graph_store
from gnnserve.models.zoo import GNN, ModelConfig
from tests.embeddings.test_affected import F, N, _batch, _pes


@pytest.mark.parametrize(
    ("arch", "layers", "chunk_edges"), [("gcn", 3, 50), ("sage", 2, 2_000_000), ("gat", 2, 7)]
)
def test_a_refresh_equals_a_full_precompute(
    tmp_path: Path, arch: str, layers: int, chunk_edges: int
) -> None:
    rng = np.random.default_rng(layers + chunk_edges)
    old, new, (x, x_new), changes = _batch(rng)
    torch.manual_seed(1)
    model = GNN(ModelConfig(arch, in_dim=F, hidden_dim=16, out_dim=4, num_layers=layers, heads=2))
    before, want = _pes(model, old, x, tmp_path / "old"), _pes(model, new, x_new, tmp_path / "new")
    graph, features = open_graph_store(tmp_path / "new"), open_feature_store(tmp_path / "new")
    sets = AffectedSets(layers, model.needs_degree).compute(*out_adjacency(*graph.csr()), changes)
    got = refresh_layers(model, graph, features, [b.copy() for b in before], sets, chunk_edges)
    for layer, (g, w) in enumerate(zip(got, want, strict=True)):
        assert g.shape == (N + 2, w.shape[1])
        np.testing.assert_allclose(g, w, rtol=0, atol=1e-5, err_msg=f"layer {layer + 1}")
    assert sum(s.size for s in sets) < layers * (N + 2)  # it did not recompute everything


def test_rows_block_holds_every_in_edge_of_its_rows() -> None:
    indptr, indices = np.array([0, 2, 3, 3, 5]), np.array([1, 3, 0, 0, 2])  # in-neighbours
    block, src_ids = rows_block(indptr[:-1], np.diff(indptr), indices, np.array([3, 0]))
    assert src_ids.tolist() == [3, 0, 2, 1] and (block.n_src, block.n_dst) == (4, 2)  # first seen
    edges = {(int(src_ids[s]), [3, 0][d]) for s, d in block.edge_index.T.tolist()}
    assert edges == {(0, 3), (2, 3), (1, 0), (3, 0)}
