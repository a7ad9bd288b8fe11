"""Model zoo: the block forward equals an independent plain-PyG full-graph forward on cora."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torch_geometric.nn import GATConv, GCNConv, SAGEConv

from gnnserve.data.importers import load_npz
from gnnserve.data.writer import GraphData, write_store
from gnnserve.errors import InvalidInputError
from gnnserve.features import open_feature_store
from gnnserve.graph import GraphStore, open_graph_store
from gnnserve.models.arch.gcn import gcn_block_weights
from gnnserve.models.zoo import GNN, MODELS, ModelConfig
from gnnserve.sampling import NeighborSampler
from gnnserve.types import Block

CORA = Path(__file__).resolve().parents[2].parent / "shared" / "datasets" / "cora.npz"
ARCHS = ["gcn", "sage", "gat"]
TOL = 1e-5


@pytest.fixture(scope="module")
def cora(tmp_path_factory: pytest.TempPathFactory) -> tuple[GraphStore, torch.Tensor]:
    """Cora written as a store with the real writer; (graph, all features)."""
    if not CORA.is_file():
        pytest.skip(f"cora dataset not found at {CORA}")
    out = tmp_path_factory.mktemp("cora") / "store"
    write_store(load_npz(CORA), out)
    graph = open_graph_store(out)
    x = open_feature_store(out).get(np.arange(graph.num_nodes))
    return graph, x


def full_blocks(graph: GraphStore, seeds: np.ndarray, num_layers: int) -> tuple[np.ndarray, list]:
    """Test reference: every in-neighbour of every node reached so far, hop by hop (plain python).

    Returns (local -> global ids, blocks input layer first) with the sampler's id contract.
    """
    indptr, indices = graph.csr()
    nodes = [int(s) for s in seeds]
    local = {v: i for i, v in enumerate(nodes)}
    blocks = []
    for _ in range(num_layers):
        n_dst = len(nodes)
        src, dst = [], []
        for d in range(n_dst):
            v = nodes[d]
            for u in indices[indptr[v] : indptr[v + 1]].tolist():
                if u not in local:
                    local[u] = len(nodes)
                    nodes.append(u)
                src.append(local[u])
                dst.append(d)
        edge_index = torch.tensor([src, dst], dtype=torch.int64)
        blocks.append(Block(edge_index, n_src=len(nodes), n_dst=n_dst))
    return np.array(nodes, dtype=np.int64), blocks[::-1]


class Reference(torch.nn.Module):
    """An independent stack of default PyG layers (GCNConv normalises itself)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        dims = [cfg.in_dim] + [cfg.hidden_dim] * (cfg.num_layers - 1) + [cfg.out_dim]
        layers: list[torch.nn.Module] = []
        for i in range(cfg.num_layers):
            last = i == cfg.num_layers - 1
            if cfg.arch == "gcn":
                layers.append(GCNConv(dims[i], dims[i + 1]))
            elif cfg.arch == "sage":
                layers.append(SAGEConv(dims[i], dims[i + 1]))
            elif last:
                layers.append(GATConv(dims[i], dims[i + 1], heads=1, concat=False))
            else:
                layers.append(GATConv(dims[i], dims[i + 1] // cfg.heads, heads=cfg.heads))
        self.convs = torch.nn.ModuleList(layers)

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """(logits, representation fed to the last layer) of every node."""
        hidden = x
        for i, conv in enumerate(self.convs):
            if i == len(self.convs) - 1:
                hidden = x
            x = conv(x, edge_index)
            if i < len(self.convs) - 1:
                x = torch.relu(x)
        return x, hidden


def _models(arch: str, layers: int, in_dim: int) -> tuple[GNN, Reference]:
    torch.manual_seed(7)
    cfg = ModelConfig(arch, in_dim=in_dim, hidden_dim=32, out_dim=7, num_layers=layers)
    model = GNN(cfg).eval()
    ref = Reference(cfg).eval()
    ref.load_state_dict(model.state_dict())  # same values; strict: same parameter set
    return model, ref


def _full_edge_index(graph: GraphStore) -> torch.Tensor:
    indptr, indices = graph.csr()
    dst = np.repeat(np.arange(graph.num_nodes), np.diff(indptr))
    return torch.from_numpy(np.stack([np.asarray(indices, dtype=np.int64), dst]))


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max())


@pytest.mark.parametrize("layers", [2, 3])
@pytest.mark.parametrize("arch", ARCHS)
def test_block_forward_equals_pyg_reference(cora, arch: str, layers: int) -> None:
    graph, x = cora
    model, ref = _models(arch, layers, x.size(1))
    seeds = np.random.default_rng(layers).choice(graph.num_nodes, 64, replace=False)
    nodes, blocks = full_blocks(graph, seeds, layers)
    deg = torch.from_numpy(graph.in_degree(nodes).astype(np.float32))
    with torch.inference_mode():
        want, want_emb = ref(x, _full_edge_index(graph))
        logits, emb = model.forward_blocks(x[nodes], blocks, deg)
        full = model(x, _full_edge_index(graph))
    assert logits.shape == (64, 7) and emb.shape == (64, 32)
    assert want.abs().max() > 0.05  # a non-trivial comparison
    assert _max_diff(logits, want[seeds]) < TOL
    assert _max_diff(emb, want_emb[seeds]) < TOL
    assert _max_diff(full, want) < TOL


@pytest.mark.parametrize("layers", [2, 3])
@pytest.mark.parametrize("arch", ARCHS)
def test_sampler_full_fanout_equals_reference(cora, arch: str, layers: int) -> None:
    graph, x = cora
    model, ref = _models(arch, layers, x.size(1))
    seeds = np.random.default_rng(10 + layers).choice(graph.num_nodes, 100, replace=False)
    sg = NeighborSampler(graph, [-1] * layers).sample(seeds)
    nodes = sg.input_nodes
    deg = torch.from_numpy(graph.in_degree(nodes).astype(np.float32))
    with torch.inference_mode():
        want, _ = ref(x, _full_edge_index(graph))
        logits, _ = model.forward_blocks(x[nodes], sg.blocks, deg)
    assert _max_diff(logits[sg.seed_rows], want[seeds]) < TOL


def test_sampled_gcn_weights_rescale_by_sampled_share(cora) -> None:
    """Sampled GCN weights scale by d_i / s_i: for f(j) = sqrt(d_j + 1) every sample gives the
    full-neighbourhood aggregate sqrt(d_i + 1) exactly (the estimate is unbiased in general)."""
    graph, _ = cora
    seeds = np.arange(300)
    for fanout in (1, 2, -1):
        sg = NeighborSampler(graph, [fanout], seed=fanout).sample(seeds)
        deg = torch.from_numpy(graph.in_degree(sg.input_nodes).astype(np.float32))
        edge_index, weight = gcn_block_weights(sg.blocks[0], deg)
        f = (deg + 1).sqrt()
        out = torch.zeros(sg.num_seeds).index_add_(0, edge_index[1], weight * f[edge_index[0]])
        torch.testing.assert_close(out, f[: sg.num_seeds], rtol=1e-5, atol=0)


@pytest.mark.parametrize("arch", ARCHS)
def test_graph_with_self_loops_and_duplicates(tmp_path: Path, arch: str) -> None:
    """Self loops and repeated edges: GAT/SAGE match as is; GCN when in_degree omits loops."""
    rng = np.random.default_rng(0)
    n = 60
    ei = np.concatenate([rng.integers(0, n, (2, 300)), np.tile(np.arange(0, n, 3), (2, 1))], 1)
    ei = np.concatenate([ei, ei[:, :20]], 1)  # 20 repeated edges
    x = rng.standard_normal((n, 8)).astype(np.float32)
    write_store(GraphData("loops", n, ei, x), tmp_path / "s")
    graph = open_graph_store(tmp_path / "s")
    model, ref = _models(arch, 2, 8)
    nodes, blocks = full_blocks(graph, np.arange(0, n, 2), 2)
    loops = np.bincount(ei[1][ei[0] == ei[1]], minlength=n)
    deg = torch.from_numpy((graph.in_degree() - loops)[nodes].astype(np.float32))
    xt = torch.from_numpy(x)
    with torch.inference_mode():
        want, _ = ref(xt, _full_edge_index(graph))
        logits, _ = model.forward_blocks(xt[nodes], blocks, deg)
    assert _max_diff(logits, want[:n:2]) < TOL


def test_config_validation_and_round_trip() -> None:
    cfg = ModelConfig("gat", in_dim=8, hidden_dim=16, out_dim=3, num_layers=2, heads=4)
    assert ModelConfig.from_dict(cfg.to_dict()) == cfg
    assert MODELS.names() == ["gat", "gcn", "sage"]
    bad = [
        {"arch": "mlp"},
        {"hidden_dim": 0},
        {"num_layers": 1.5},
        {"dropout": 1.0},
        {"hidden_dim": 10},  # not a multiple of 4 heads
    ]
    for change in bad:
        with pytest.raises(InvalidInputError):
            ModelConfig.from_dict({**cfg.to_dict(), **change})
    with pytest.raises(InvalidInputError, match="unknown"):
        ModelConfig.from_dict({**cfg.to_dict(), "extra": 1})
    with pytest.raises(InvalidInputError, match="incomplete"):
        ModelConfig.from_dict({"arch": "gcn"})


def test_forward_blocks_rejects_mismatched_blocks() -> None:
    model = GNN(ModelConfig("sage", in_dim=4, hidden_dim=8, out_dim=2, num_layers=2))
    block = Block(torch.zeros((2, 0), dtype=torch.int64), n_src=3, n_dst=2)
    with pytest.raises(InvalidInputError, match="blocks"):
        model.forward_blocks(torch.zeros(3, 4), [block], torch.zeros(3))
    with pytest.raises(InvalidInputError, match="x must be"):
        model.forward_blocks(torch.zeros(3, 5), [block, block], torch.zeros(3))


@pytest.mark.parametrize(
    "change, field, limit",
    [
        ({"in_dim": 10**9}, "in_dim", "1048576"),
        ({"hidden_dim": 10**9}, "hidden_dim", "1048576"),
        ({"out_dim": (1 << 20) + 1}, "out_dim", "1048576"),
        ({"num_layers": 10**6}, "num_layers", "16"),
        ({"num_layers": 17}, "num_layers", "16"),
        ({"heads": 65}, "heads", "64"),
        ({"dropout": "0.5"}, "dropout", "number"),
        ({"dropout": float("nan")}, "dropout", r"\[0, 1\)"),
        ({"arch": ["gcn"]}, "arch", "unknown architecture"),
        # every field in bounds, yet 2^40 parameters: over the 2^31 model limit
        ({"hidden_dim": 1 << 20, "num_layers": 3}, "hidden_dim", "2,147,483,648"),
    ],
)
def test_config_fields_are_bounded(change: dict, field: str, limit: str) -> None:
    base = ModelConfig("gat", in_dim=8, hidden_dim=64, out_dim=3, num_layers=2, heads=4)
    with pytest.raises(InvalidInputError, match=limit) as err:
        ModelConfig.from_dict({**base.to_dict(), **change})
    assert err.value.field == field


def test_limits_themselves_are_accepted() -> None:
    ModelConfig("gat", in_dim=8, hidden_dim=64, out_dim=3, num_layers=16, heads=64, dropout=0.0)
    ModelConfig("gcn", in_dim=1 << 20, hidden_dim=8, out_dim=1 << 20, num_layers=2)


@pytest.mark.parametrize("arch", ARCHS)
def test_num_parameters_counts_the_built_model(arch: str) -> None:
    cfg = ModelConfig(arch, in_dim=12, hidden_dim=24, out_dim=5, num_layers=3, heads=4)
    assert cfg.num_parameters() == sum(p.numel() for p in GNN(cfg).parameters())
