"""The architecture registry: a test-only architecture (GIN, tests/models/arch/gin.py) registered
from the test suite runs through every path unchanged, against independent plain-PyG forwards.

Paths: the block forward with full fanouts and a served engine (local), a checkpoint round trip,
layer-wise precompute, new-node inference (``full`` exact, ``srpe`` exact where every input of
the last layer is recomputed) and CGP (P = 2 Ray workers over gloo) against single-process SRPE.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from torch_geometric.nn import GINConv

from gnnserve.config import ServeConfig
from gnnserve.data.layout import read_meta
from gnnserve.data.writer import GraphData, write_store
from gnnserve.deploy.cgp import CGPService
from gnnserve.embeddings.precompute import precompute_embeddings
from gnnserve.engine.loader import build_engine
from gnnserve.errors import InvalidInputError, StoreFormatError
from gnnserve.features import FeatureStore, open_feature_store
from gnnserve.graph import GraphStore, open_graph_store
from gnnserve.models.arch import MODELS, register
from gnnserve.models.checkpoint import load_checkpoint, save_checkpoint
from gnnserve.models.zoo import GNN, ModelConfig
from gnnserve.newnodes.inference import NewNodeInference
from gnnserve.newnodes.parse import parse_new_nodes
from gnnserve.sampling import NeighborSampler
from gnnserve.types import NewNodes
from tests.conftest import random_simple_graph
from tests.models.arch.gin import GIN, GINParams

N, FEAT, HIDDEN, CLASSES = 150, 12, 16, 3
LOOP_NODE = 4  # a stored self loop, and a neighbour of the first new node
TOL = 1e-5
BUILT_IN = ["gat", "gcn", "sage"]


@pytest.fixture(scope="module", autouse=True)
def gin() -> Iterator[str]:
    """GIN registered for this module's tests only (test_zoo sees the built-ins alone)."""
    register(GIN)
    yield GIN.name
    MODELS.unregister(GIN.name)


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A symmetric random graph with one self loop, features and labels, as a store."""
    ei = random_simple_graph(N, 3 * N, seed=2)
    ei = np.unique(np.concatenate([ei, ei[::-1], [[LOOP_NODE], [LOOP_NODE]]], axis=1), axis=1)
    rng = np.random.default_rng(2)
    x = rng.standard_normal((N, FEAT)).astype(np.float32)
    out = tmp_path_factory.mktemp("gin") / "store"
    write_store(GraphData("gin", N, ei, x, rng.integers(0, CLASSES, N)), out)
    return out


def stores(store: Path) -> tuple[GraphStore, FeatureStore, torch.Tensor, torch.Tensor]:
    """(graph, features, all features x [N, F], the stored edges [2, E] as src -> dst)."""
    graph, features = open_graph_store(store), open_feature_store(store)
    indptr, indices = graph.csr()
    dst = np.repeat(np.arange(N), np.diff(indptr))
    edges = torch.from_numpy(np.stack([np.asarray(indices, np.int64), dst]))
    return graph, features, features.get(np.arange(N)), edges


def gin_model(k: int, seed: int = 0) -> GNN:
    """A seeded random GIN with a different ``eps`` per layer (none 0: the self term counts)."""
    torch.manual_seed(seed)
    model = GNN(ModelConfig("gin", FEAT, HIDDEN, CLASSES, num_layers=k)).eval()
    with torch.no_grad():
        for i, conv in enumerate(model.convs):
            conv.eps.fill_(0.3 + 0.4 * i)  # type: ignore[operator]
    return model


class Reference(torch.nn.Module):
    """An independent stack of plain PyG GINConv layers with the model's values."""

    def __init__(self, model: GNN) -> None:
        super().__init__()
        c = model.config
        dims = [c.in_dim] + [c.hidden_dim] * (c.num_layers - 1) + [c.out_dim]
        self.convs = torch.nn.ModuleList(
            GINConv(
                torch.nn.Sequential(
                    torch.nn.Linear(dims[i], dims[i + 1]),
                    torch.nn.ReLU(),
                    torch.nn.Linear(dims[i + 1], dims[i + 1]),
                ),
                train_eps=True,
            )
            for i in range(c.num_layers)
        )
        self.load_state_dict(model.state_dict())  # strict: the same parameter set
        self.eval()

    @torch.inference_mode()
    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> list[torch.Tensor]:
        """Every layer's output on the whole graph (ReLU on all but the last)."""
        outs, h = [], x
        for i, conv in enumerate(self.convs):
            h = conv(h, edge_index)
            h = torch.relu(h) if i < len(self.convs) - 1 else h
            outs.append(h)
        return outs


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max())


# ---------------------------------------------------------------------------------- registry


def test_registry_holds_gin_while_registered() -> None:
    assert MODELS.names() == sorted([*BUILT_IN, "gin"])
    with pytest.raises(ValueError, match="registered twice"):
        register(GIN)
    MODELS.unregister("gin")
    try:
        assert MODELS.names() == BUILT_IN
        with pytest.raises(InvalidInputError, match="unknown architecture 'gin'") as err:
            ModelConfig("gin", FEAT, HIDDEN, CLASSES)
        assert err.value.field == "arch"
    finally:
        register(GIN)
    with pytest.raises(KeyError):
        MODELS.unregister("nope")


@pytest.mark.slow  # a fresh interpreter importing torch and ray
def test_worker_side_imports_no_torch_geometric() -> None:
    """A CGP worker unpickles every architecture's exported layers without importing PyG."""
    layers = [GNN(ModelConfig(a, FEAT, HIDDEN, CLASSES)).cgp_layers() for a in BUILT_IN]
    layers.append(gin_model(2).cgp_layers())
    assert isinstance(layers[-1][0], GINParams)
    code = (
        "import pickle, sys\n"
        "import gnnserve.deploy.cgp.worker\n"
        "layers = pickle.load(sys.stdin.buffer)\n"
        "assert 'torch_geometric' not in sys.modules, 'torch_geometric imported'\n"
        "print(sorted({type(l).__name__ for ls in layers for l in ls}))\n"
    )
    root = Path(__file__).resolve().parents[3]
    out = subprocess.run(
        [sys.executable, "-c", code],
        input=pickle.dumps(layers),
        capture_output=True,
        cwd=root,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, out.stderr.decode()[-2000:]
    names = "['GATParams', 'GCNParams', 'GINParams', 'SAGEParams']"
    assert out.stdout.decode().strip() == names


# ---------------------------------------------------------------------------------- local path


@pytest.mark.parametrize("k", [2, 3])
def test_block_forward_equals_pyg_reference(store: Path, k: int) -> None:
    graph, _, x, edges = stores(store)
    model = gin_model(k)
    want = Reference(model)(x, edges)
    seeds = np.random.default_rng(k).choice(N, 40, replace=False)
    sg = NeighborSampler(graph, [-1] * k).sample(seeds)
    with torch.inference_mode():
        logits, emb = model.forward_blocks(x[sg.input_nodes], sg.blocks, torch.empty(0))
        full = model(x, edges)
    assert want[-1].abs().max() > 0.05  # a non-trivial comparison
    assert max_diff(logits[sg.seed_rows], want[-1][seeds]) < TOL
    assert max_diff(emb[sg.seed_rows], want[-2][seeds]) < TOL
    assert max_diff(full, want[-1]) < TOL


def test_checkpoint_round_trip(tmp_path: Path) -> None:
    model = gin_model(3, seed=1)
    version = save_checkpoint(tmp_path / "gin", model, model.config, {"store_checksum": "x"})
    loaded = load_checkpoint(tmp_path / "gin")
    assert loaded.version == version and loaded.config == model.config
    assert loaded.model.state_dict().keys() == model.state_dict().keys()
    for key, value in model.state_dict().items():
        assert torch.equal(loaded.model.state_dict()[key], value), key
    MODELS.unregister("gin")
    try:
        with pytest.raises(StoreFormatError, match="unknown architecture 'gin'"):
            load_checkpoint(tmp_path / "gin")
    finally:
        register(GIN)


def test_served_by_the_engine(store: Path, tmp_path: Path) -> None:
    """A GIN checkpoint served by a real engine (sampling, fetch, compute threads) with full
    fanouts gives the reference's probabilities and embeddings."""
    _, _, x, edges = stores(store)
    model = gin_model(2, seed=3)
    save_checkpoint(
        tmp_path / "gin", model, model.config, {"store_checksum": read_meta(store).checksum}
    )
    config = ServeConfig.load(
        None,
        **{
            "store.path": str(store),
            "model_path": str(tmp_path / "gin"),
            "sampler.fanouts": [-1, -1],
        },
    )
    hidden, logits = Reference(model)(x, edges)
    nodes = [0, LOOP_NODE, 77, LOOP_NODE, N - 1]
    with build_engine(config) as engine:
        probs = engine.predict(nodes, "probs").values
        emb = engine.predict(nodes, "embedding").values
    torch.testing.assert_close(probs, torch.softmax(logits[nodes], 1), atol=TOL, rtol=0)
    torch.testing.assert_close(emb, hidden[nodes], atol=TOL, rtol=0)


def test_precompute_equals_reference_layers(store: Path) -> None:
    graph, features, x, edges = stores(store)
    model = gin_model(3)
    pes = precompute_embeddings(model, graph, features, model_version="gin", chunk_edges=97)
    want = Reference(model)(x, edges)
    for layer, expected in enumerate(want, start=1):
        got = torch.from_numpy(np.asarray(pes.get(layer, np.arange(N))))
        assert max_diff(got, expected) < TOL, layer


# ---------------------------------------------------------------------------------- new nodes


def request(seed: int = 1) -> NewNodes:
    """5 new nodes: shared candidates, the self-loop node, new-new edges, an isolated node."""
    rng = np.random.default_rng(seed)
    edges = [[0, LOOP_NODE], [0, 10], [0, 11], [1, 11], [1, 20], [1, 20], [2, 30], [3, 40]]
    edges += [[int(rng.integers(0, 4)), int(v)] for v in rng.choice(N, 8)]
    x = rng.standard_normal((5, FEAT))
    return parse_new_nodes(x, edges, [[0, 1], [2, 3]], num_nodes=N, feature_dim=FEAT)


def g_plus(edges: torch.Tensor, new: NewNodes) -> torch.Tensor:
    """G+: the stored edges plus both directions of every request edge (queries are N + i)."""
    a = np.concatenate([new.edges[:, 0] + N, new.new_edges[:, 0] + N])
    b = np.concatenate([new.edges[:, 1], new.new_edges[:, 1] + N])
    extra = np.stack([np.concatenate([a, b]), np.concatenate([b, a])]).astype(np.int64)
    return torch.cat([edges, torch.from_numpy(extra)], dim=1)


def test_new_nodes_full_and_srpe(store: Path) -> None:
    """``full`` equals the reference on G+; with two layers and every candidate recomputed,
    every input of the last layer is exact and ``srpe`` equals it too."""
    graph, features, x, edges = stores(store)
    new = request()
    model = gin_model(2)
    pes = precompute_embeddings(model, graph, features, model_version="gin", progress=False)
    engine = NewNodeInference(model, graph, features, pes)
    hidden, logits = Reference(model)(torch.cat([x, new.features]), g_plus(edges, new))
    queries = N + np.arange(new.count)
    full = engine.run(new, mode="full")
    srpe = engine.run(new, mode="srpe", gamma=1.0)
    assert srpe.recomputed.size == full.num_candidates > 0
    for result in (full, srpe):
        assert max_diff(result.logits, logits[queries]) < TOL
        assert max_diff(result.embedding, hidden[queries]) < TOL
    pe_only = engine.run(new, mode="srpe", gamma=0.0)
    assert pe_only.recomputed.size == 0 and max_diff(pe_only.logits, logits[queries]) > TOL


@pytest.mark.slow
@pytest.mark.distributed
def test_cgp_matches_single_process_srpe(store: Path) -> None:
    """CGPService (2 Ray workers, gloo) answers what single-process SRPE answers."""
    graph, features, _, _ = stores(store)
    model = gin_model(3, seed=4)
    pes = precompute_embeddings(model, graph, features, model_version="gin", progress=False)
    single = NewNodeInference(model, graph, features, pes)
    with CGPService(model, graph, features, pes, num_workers=2) as service:
        for gamma, policy in [(0.0, "query_edges_ratio"), (0.5, "importance"), (1.0, "random")]:
            got = service.run(request(2), gamma, policy)
            want = single.run(request(2), mode="srpe", gamma=gamma, policy=policy)
            np.testing.assert_array_equal(got.recomputed, want.recomputed)
            assert max_diff(got.logits, want.logits) < TOL, gamma
            assert max_diff(got.embedding, want.embedding) < TOL, gamma
            assert got.traffic is not None and got.traffic.bytes_by["layer 3 partials"] > 0


def test_pyg_generated_modules_are_removed_when_the_process_exits(tmp_path) -> None:
    """PyG writes a ``propagate`` module per conv class and process into the temp dir; a
    process that imported gnnserve's architectures leaves none behind."""
    script = (
        "import sys, gnnserve.models.arch\n"
        "from torch_geometric.nn import SAGEConv, GATConv\n"
        "SAGEConv(4, 4), GATConv(4, 4)\n"
        "print('\\n'.join(m.__file__ for n, m in sys.modules.items()"
        " if n.startswith('torch_geometric.') and n.endswith(('_propagate', '_edge_updater'))))\n"
    )
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    out = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True
    ).stdout.split()
    assert len(out) == 3 and all(p.startswith(str(tmp_path)) for p in out)  # they were written
    assert list(tmp_path.iterdir()) == []  # and removed at exit
