"""The CUDA path of precomputation and new-node inference equals the CPU path (runs on a GPU only).

The model is moved to the GPU; stores, plans and sampling stay on the host, as in serving.
"""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest
import torch

from gnnserve.data.writer import GraphData, write_store
from gnnserve.embeddings.precompute import precompute_embeddings
from gnnserve.features import open_feature_store
from gnnserve.graph import open_graph_store
from gnnserve.models.zoo import GNN, ModelConfig
from gnnserve.newnodes.inference import NewNodeInference
from gnnserve.newnodes.parse import parse_new_nodes
from tests.conftest import random_simple_graph

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

N, FEAT, HIDDEN, CLASSES = 500, 16, 32, 4
# TF32 matmuls are off below; what is left is float32 summation order on the GPU
TOL = dict(atol=1e-4, rtol=1e-4)


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    ei = random_simple_graph(N, 6 * N, 0)
    ei = np.unique(np.concatenate([ei, ei[::-1]], axis=1), axis=1)
    x = np.random.default_rng(0).standard_normal((N, FEAT)).astype(np.float32)
    out = tmp_path_factory.mktemp("gpu") / "store"
    write_store(GraphData("gpu", N, ei, x), out)
    return out


@pytest.fixture(autouse=True)
def no_tf32() -> None:
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False


@pytest.mark.parametrize("arch,k", [("gcn", 2), ("sage", 3), ("gat", 3)])
def test_cuda_matches_cpu(store: Path, arch: str, k: int) -> None:
    graph, features = open_graph_store(store), open_feature_store(store)
    torch.manual_seed(0)
    cpu_model = GNN(ModelConfig(arch, FEAT, HIDDEN, CLASSES, num_layers=k)).eval()
    gpu_model = copy.deepcopy(cpu_model).cuda()
    cpu_pes = precompute_embeddings(cpu_model, graph, features, model_version="m", progress=False)
    gpu_pes = precompute_embeddings(gpu_model, graph, features, model_version="m", progress=False)
    for layer in range(1, k):
        torch.testing.assert_close(
            torch.from_numpy(np.asarray(gpu_pes.layer(layer))),
            torch.from_numpy(np.asarray(cpu_pes.layer(layer))),
            **TOL,
        )
    rng = np.random.default_rng(1)
    new = parse_new_nodes(
        rng.standard_normal((20, FEAT)),
        np.stack([rng.integers(0, 20, 80), rng.integers(0, N, 80)], axis=1),
        [[0, 1], [2, 3]],
        num_nodes=N,
        feature_dim=FEAT,
    )
    cpu = NewNodeInference(cpu_model, graph, features, cpu_pes)
    gpu = NewNodeInference(gpu_model, graph, features, cpu_pes)
    for mode in ("full", "ns", "pe", "srpe"):
        want = cpu.run(new, mode=mode, gamma=0.3)
        got = gpu.run(new, mode=mode, gamma=0.3)
        assert got.logits.device.type == "cpu"  # results come back to the host
        torch.testing.assert_close(got.logits, want.logits, **TOL)
        torch.testing.assert_close(got.embedding, want.embedding, **TOL)
        np.testing.assert_array_equal(got.recomputed, want.recomputed)
