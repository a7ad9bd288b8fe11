"""Engine test fixtures: the full-graph reference outputs of the small store's model."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from gnnserve.config import ServeConfig
from gnnserve.features import open_feature_store
from gnnserve.graph import open_graph_store
from gnnserve.models.checkpoint import load_checkpoint


@pytest.fixture(scope="session")
def reference(small_store: Path, small_ckpt: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """Full-graph logits and layer-1 embeddings of every node, plain PyG forward."""
    graph = open_graph_store(small_store)
    indptr, indices = graph.csr()
    dst = np.repeat(np.arange(graph.num_nodes), np.diff(indptr))
    edge_index = torch.from_numpy(np.stack([np.asarray(indices, np.int64), dst]))
    x = open_feature_store(small_store).get(np.arange(graph.num_nodes))
    model = load_checkpoint(small_ckpt).model
    with torch.inference_mode():
        hidden = torch.relu(model.convs[0](x, edge_index))
        return model(x, edge_index), hidden


def serve_config(store: Path, ckpt: Path, **overrides: object) -> ServeConfig:
    """A ServeConfig for ``store`` and ``ckpt`` with full-neighbourhood fanouts (answers equal a
    full-graph forward), plus ``overrides`` (dotted field -> value)."""
    fields: dict[str, object] = {
        "store.path": str(store),
        "model_path": str(ckpt),
        "sampler.fanouts": [-1, -1],
    }
    return ServeConfig.load(None, **{**fields, **overrides})
