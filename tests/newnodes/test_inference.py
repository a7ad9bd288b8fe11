"""New-node inference (full / ns / pe / srpe) against independent plain-PyG full-graph forwards.

References: ``layer_outputs`` on the graph G+ (exact), on ``srpe_graph(..., S)`` (G'), and
``semantic_reference`` below, which is the SRPE definition written as whole-graph PyG layers: every
layer runs on G' over all nodes, and before layers 2..k the rows of nodes outside C = Q + S are
replaced by their precomputed embeddings. The latter is exact for every model and depth; G' alone
is exact except for GCN when a node read from its PE has an in-neighbour whose degree the request
changed (its PE was normalised with the stored degree), see ``test_gcn_pe_keeps_stored_norm``.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch_geometric.nn.conv.gcn_conv import gcn_norm

from gnnserve.data.writer import GraphData, write_store
from gnnserve.embeddings.base import ArrayEmbeddings, EmbeddingMeta
from gnnserve.errors import InvalidInputError
from gnnserve.features import open_feature_store
from gnnserve.graph import GraphStore, open_graph_store
from gnnserve.models.zoo import GNN, ModelConfig
from gnnserve.newnodes.inference import NewNodeInference, default_fanouts
from gnnserve.newnodes.parse import parse_new_nodes
from gnnserve.types import NewNodes
from tests.conftest import random_simple_graph
from tests.embeddings.reference import layer_outputs, request_edges, srpe_graph

N, FEAT, HIDDEN, CLASSES = 80, 8, 16, 3
LOOP_NODE = 3  # has a self loop in the stored graph and is a candidate of REQUEST
TOL = 1e-5
ARCHS = ["gcn", "sage", "gat"]


@dataclass
class Setup:
    """A stored graph, a model and its PEs (plain-PyG layer outputs on the stored graph)."""

    edge_index: np.ndarray  # int64 [2, E] stored directed edges
    x: torch.Tensor  # float32 [N, F]
    graph: GraphStore
    model: GNN
    pes: list[torch.Tensor]  # h^(1..k) on the stored graph
    engine: NewNodeInference


def stored_graph(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric random graph with one self loop (on LOOP_NODE) and features."""
    ei = random_simple_graph(N, 4 * N, seed)
    ei = np.unique(np.concatenate([ei, ei[::-1], [[LOOP_NODE], [LOOP_NODE]]], axis=1), axis=1)
    x = np.random.default_rng(seed).standard_normal((N, FEAT)).astype(np.float32)
    return ei, x


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    ei, x = stored_graph()
    out = tmp_path_factory.mktemp("srpe") / "store"
    write_store(GraphData("srpe", N, ei, x), out)
    return out


def build(store: Path, arch: str, k: int, seed: int = 0) -> Setup:
    """Engine over ``store`` for a seeded random ``arch`` model with ``k`` layers."""
    graph, features = open_graph_store(store), open_feature_store(store)
    indptr, indices = graph.csr()
    dst = np.repeat(np.arange(N), np.diff(indptr))
    ei = np.stack([np.asarray(indices, np.int64), dst])
    x = features.get(np.arange(N))
    torch.manual_seed(seed)
    model = GNN(ModelConfig(arch, FEAT, HIDDEN, CLASSES, num_layers=k)).eval()
    outs = layer_outputs(model, x, torch.from_numpy(ei))
    meta = EmbeddingMeta("m@0", graph.version, N, [int(o.size(1)) for o in outs])
    pes = ArrayEmbeddings(meta, [o.numpy() for o in outs])
    return Setup(ei, x, graph, model, outs, NewNodeInference(model, graph, features, pes))


_CACHE: dict[tuple[str, int], Setup] = {}


@pytest.fixture(scope="module")
def setups(store: Path):  # type: ignore[no-untyped-def]
    def get(arch: str, k: int) -> Setup:
        if (arch, k) not in _CACHE:
            _CACHE[(arch, k)] = build(store, arch, k)
        return _CACHE[(arch, k)]

    yield get
    _CACHE.clear()


def request(seed: int = 1) -> NewNodes:
    """5 new nodes: shared and duplicated candidates, the self-loop node, new-new edges,
    one node reachable only through a new-new edge (3) and one isolated node (4)."""
    rng = np.random.default_rng(seed)
    edges = [[0, LOOP_NODE], [0, 10], [0, 11], [0, 12], [1, LOOP_NODE], [1, 11], [1, 20], [1, 20]]
    edges += [[2, 30], [2, 31]] + [[int(rng.integers(0, 3)), int(v)] for v in rng.choice(N, 6)]
    return parse_new_nodes(
        rng.standard_normal((5, FEAT)),
        edges,
        [[0, 1], [2, 3]],
        num_nodes=N,
        feature_dim=FEAT,
    )


def independent_request(setup: Setup, seed: int = 2) -> NewNodes:
    """New nodes whose candidates are pairwise non-adjacent (G' is exact for 2-layer GCN)."""
    rng = np.random.default_rng(seed)
    adj = set(map(tuple, setup.edge_index.T.tolist()))
    chosen: list[int] = []
    for v in rng.permutation(N).tolist():
        if v != LOOP_NODE and all((v, u) not in adj and (u, v) not in adj for u in chosen):
            chosen.append(v)
        if len(chosen) == 6:
            break
    edges = [[i % 3, v] for i, v in enumerate(chosen)] + [[0, chosen[1]]]
    return parse_new_nodes(
        rng.standard_normal((3, FEAT)), edges, [[1, 2]], num_nodes=N, feature_dim=FEAT
    )


def all_features(s: Setup, new: NewNodes) -> torch.Tensor:
    return torch.cat([s.x, new.features])


def gplus_logits(s: Setup, new: NewNodes) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact logits and last-layer inputs of the queries on G+."""
    outs = layer_outputs(s.model, all_features(s, new), srpe_graph(s.edge_index, N, new, None))
    emb = outs[-2][N:] if len(outs) > 1 else new.features
    return outs[-1][N:], emb


def gprime_logits(s: Setup, new: NewNodes, recomputed: np.ndarray) -> torch.Tensor:
    outs = layer_outputs(
        s.model, all_features(s, new), srpe_graph(s.edge_index, N, new, recomputed)
    )
    return outs[-1][N:]


@torch.inference_mode()
def semantic_reference(
    s: Setup, new: NewNodes, recomputed: np.ndarray
) -> tuple[torch.Tensor, torch.Tensor]:
    """The SRPE definition as whole-graph PyG layers on G' with PE substitution outside C."""
    model, m = s.model, new.count
    x = all_features(s, new)
    edge_index = srpe_graph(s.edge_index, N, new, recomputed)
    weight = None
    if model.config.arch == "gcn":
        edge_index, weight = gcn_norm(edge_index, None, x.size(0), False, True, dtype=x.dtype)
    computed = torch.zeros(N + m, dtype=torch.bool)
    computed[N:] = True
    computed[torch.from_numpy(np.asarray(recomputed, np.int64))] = True
    h, emb = x, x[N:]
    for i, conv in enumerate(model.convs):
        if i > 0:
            pe = torch.cat([s.pes[i - 1], torch.zeros(m, s.pes[i - 1].size(1))])
            h = torch.where(computed[:, None], h, pe)
        if i == len(model.convs) - 1:
            emb = h[N:]
        h = conv(h, edge_index, weight) if weight is not None else conv(h, edge_index)
        if i < len(model.convs) - 1:
            h = F.relu(h)
    return h[N:], emb


def close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return bool(torch.allclose(a, b, atol=TOL, rtol=0))


# ------------------------------------------------------------------ exactness


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("k", [2, 3])
@pytest.mark.parametrize(
    ("gamma", "policy"),
    [
        (0.0, "query_edges_ratio"),
        (0.4, "query_edges_ratio"),
        (0.4, "importance"),
        (0.4, "random"),
        (0.4, "oracle"),
        (1.0, "query_edges_ratio"),
    ],
)
def test_srpe_matches_definition(setups, arch: str, k: int, gamma: float, policy: str) -> None:
    s = setups(arch, k)
    new = request()
    res = s.engine.run(new, mode="srpe", gamma=gamma, policy=policy, seed=3)
    logits, emb = semantic_reference(s, new, res.recomputed)
    assert close(res.logits, logits)
    assert close(res.embedding, emb)
    cands = s.engine.candidates(new)
    assert res.num_candidates == cands.count
    assert res.recomputed.size == int(np.ceil(gamma * cands.count - 1e-9))
    assert np.isin(res.recomputed, cands.nodes).all()


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("k", [2, 3])
def test_gamma_one_is_exact(setups, arch: str, k: int) -> None:
    """S = R: every candidate recomputed equals the exact G+ forward (GCN: at 2 layers; at 3 the
    PEs of 2-hop nodes keep the stored degrees of their neighbours, as the definition says)."""
    s = setups(arch, k)
    new = request()
    res = s.engine.run(new, gamma=1.0)
    np.testing.assert_array_equal(res.recomputed, s.engine.candidates(new).nodes)
    exact, emb = gplus_logits(s, new)
    if arch == "gcn" and k == 3:
        assert close(res.logits, semantic_reference(s, new, res.recomputed)[0])
        assert not close(res.logits, exact)  # documents the GCN normalisation effect
    else:
        assert close(res.logits, exact)
        assert close(res.embedding, emb)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize(
    ("gamma", "policy"),
    [(0.2, "query_edges_ratio"), (0.5, "importance"), (0.5, "random"), (0.7, "oracle")],
)
def test_two_layers_any_budget_equals_gprime(setups, arch: str, gamma: float, policy: str) -> None:
    s = setups(arch, 2)
    new = request() if arch != "gcn" else independent_request(s)
    res = s.engine.run(new, gamma=gamma, policy=policy, seed=5)
    assert 0 < res.recomputed.size < res.num_candidates
    assert close(res.logits, gprime_logits(s, new, res.recomputed))


def test_gcn_pe_keeps_stored_norm(setups) -> None:
    """2-layer GCN, candidate u reused with an in-neighbour w recomputed: PE(u) was normalised
    with w's stored degree, G' would use the increased one; SRPE follows the definition."""
    s = setups("gcn", 2)
    deg = np.bincount(s.edge_index[1], minlength=N)
    pairs = [
        (w, u)
        for w, u in s.edge_index.T.tolist()
        if w != u and LOOP_NODE not in (w, u) and 2 * deg[u] > deg[w]
    ]
    w, u = pairs[0]  # edge w -> u, and w's ratio 2/(d_w+2) beats u's 1/(d_u+1)
    rng = np.random.default_rng(0)
    new = parse_new_nodes(
        rng.standard_normal((2, FEAT)),
        [[0, w], [0, w], [1, u]],
        None,
        num_nodes=N,
        feature_dim=FEAT,
    )
    res = s.engine.run(new, gamma=0.5)
    np.testing.assert_array_equal(res.recomputed, [w])
    assert close(res.logits, semantic_reference(s, new, res.recomputed)[0])
    assert not close(res.logits, gprime_logits(s, new, res.recomputed))


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("k", [2, 3])
def test_pe_mode_equals_gprime_without_recomputation(setups, arch: str, k: int) -> None:
    s = setups(arch, k)
    new = request()
    res = s.engine.run(new, mode="pe", gamma=0.9)
    assert res.recomputed.size == 0
    assert close(res.logits, gprime_logits(s, new, np.empty(0, np.int64)))
    assert close(res.logits, s.engine.run(new, mode="srpe", gamma=0.0).logits)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("k", [2, 3])
def test_full_is_exact_and_ns_all_equals_full(setups, arch: str, k: int) -> None:
    s = setups(arch, k)
    new = request()
    full = s.engine.run(new, mode="full")
    exact, emb = gplus_logits(s, new)
    assert close(full.logits, exact)
    assert close(full.embedding, emb)
    ns = s.engine.run(new, mode="ns", fanouts=[-1] * k, seed=9)
    assert torch.equal(ns.logits, full.logits)
    assert full.sizes.edges == ns.sizes.edges


def test_one_layer_model(store: Path) -> None:
    s = build(store, "sage", 1)
    new = request()
    exact, _ = gplus_logits(s, new)
    for mode in ("full", "pe", "srpe"):
        res = s.engine.run(new, mode=mode, gamma=0.5)
        assert close(res.logits, exact)
        assert torch.equal(res.embedding, new.features)


# ------------------------------------------------------------------ structure


def gplus_in_edges(s: Setup, new: NewNodes) -> dict[int, list[int]]:
    """Brute force: G+ in-neighbour multiset of every node."""
    ei = np.concatenate([s.edge_index, request_edges(new, N)], axis=1)
    out: dict[int, list[int]] = {}
    for a, b in ei.T.tolist():
        out.setdefault(b, []).append(a)
    return out


@pytest.mark.parametrize("k", [1, 2, 3])
def test_srpe_plan_structure(store: Path, setups, k: int) -> None:
    s = setups("sage", k) if k > 1 else build(store, "sage", 1)
    new = request()
    plan = s.engine.plan(new, gamma=0.5)
    into = gplus_in_edges(s, new)
    queries = list(range(N, N + new.count))
    computed = queries + plan.recomputed.tolist()
    assert plan.recomputed.tolist() == sorted(plan.recomputed.tolist())
    for layer in range(k):
        block, sources = plan.block(layer), plan.sources(layer)
        dst = queries if layer == k - 1 else computed
        assert sources[: block.n_dst].tolist() == dst and block.n_src == sources.size
        rest = sources[block.n_dst :].tolist()
        assert rest == sorted(set(rest)) and not set(rest) & set(dst)
        src_local, dst_local = block.edge_index.tolist()
        got: dict[int, list[int]] = {}
        for a, b in zip(src_local, dst_local, strict=True):
            got.setdefault(int(sources[b]), []).append(int(sources[a]))
        for v in dst:
            assert sorted(got.get(v, [])) == sorted(into.get(v, [])), (layer, v)
        assert set(rest) == {u for v in dst for u in into.get(v, [])} - set(dst)
    res = s.engine.run(new, gamma=0.5)
    assert res.sizes.edges == plan.edges_per_layer()
    assert res.sizes.input_rows == plan.sources(0).size


@pytest.mark.parametrize("fanouts", [[2, 1], [3, 2]])
def test_ns_samples_gplus_edges_within_fanouts(setups, fanouts: list[int]) -> None:
    s = setups("sage", 2)
    new = request()
    into = gplus_in_edges(s, new)
    sub = s.engine.sample(new, fanouts, seed=4)
    assert sub.nodes[: new.count].tolist() == list(range(N, N + new.count))
    hops = sub.blocks[::-1]  # hop 0 (nearest the seeds) first
    for fanout, block in zip(fanouts, hops, strict=True):
        src, dst = block.edge_index.numpy()
        for d in range(block.n_dst):
            v = int(sub.nodes[d])
            picked = sub.nodes[src[dst == d]].tolist()
            assert len(picked) == min(len(into.get(v, [])), fanout)
            pool = list(into.get(v, []))
            for u in picked:  # a sub-multiset of the G+ in-edges
                pool.remove(u)
    again = s.engine.run(new, mode="ns", fanouts=fanouts, seed=4)
    assert torch.equal(again.logits, s.engine.run(new, mode="ns", fanouts=fanouts, seed=4).logits)
    assert again.sizes.edges == [b.edge_index.size(1) for b in sub.blocks]
    other = [s.engine.sample(new, fanouts, seed=q).blocks[-1].edge_index for q in range(5, 9)]
    assert any(not torch.equal(e, sub.blocks[-1].edge_index) for e in other)


def test_default_fanouts(setups) -> None:
    assert default_fanouts(2) == (25, 10) and default_fanouts(3) == (15, 10, 5)
    s = setups("gat", 3)
    new = request()
    assert torch.equal(
        s.engine.run(new, mode="ns", seed=1).logits,
        s.engine.run(new, mode="ns", fanouts=(15, 10, 5), seed=1).logits,
    )


def test_result_fields_and_timings(setups) -> None:
    s = setups("gcn", 2)
    new = request()
    res = s.engine.run(new, gamma=0.5)
    assert res.mode == "srpe" and res.logits.shape == (5, CLASSES)
    assert res.embedding.shape == (5, HIDDEN) and res.recomputed.dtype == np.int64
    t = res.timings
    assert min(t.plan_ms, t.fetch_ms, t.compute_ms) >= 0
    assert t.total_ms >= t.plan_ms + t.fetch_ms + t.compute_ms
    assert res.sizes.computed == 5 + res.recomputed.size
    assert res.sizes.pe_rows > 0 and set(res.sizes.as_dict()) >= {"edges", "input_rows"}


def test_concurrent_requests_match_sequential(setups) -> None:
    s = setups("gat", 2)
    reqs = [request(seed) for seed in range(6)]
    expected = [s.engine.run(r, gamma=0.5).logits for r in reqs]
    got: dict[int, torch.Tensor] = {}

    def work(i: int) -> None:
        for _ in range(3):
            got[i] = s.engine.run(reqs[i], gamma=0.5).logits

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(reqs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i, want in enumerate(expected):
        assert torch.equal(got[i], want)


# ------------------------------------------------------------------ validation


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"mode": "exact"}, "mode"),
        ({"mode": 3}, "mode"),
        ({"gamma": 1.5}, "gamma"),
        ({"gamma": -0.1}, "gamma"),
        ({"gamma": "0.1"}, "gamma"),
        ({"gamma": True}, "gamma"),
        ({"policy": "best"}, "policy"),
        ({"policy": None}, "policy"),
        ({"mode": "ns", "fanouts": [5]}, "fanouts"),
        ({"mode": "ns", "fanouts": [5, 0]}, "fanouts"),
        ({"mode": "ns", "fanouts": [5, "x"]}, "fanouts"),
        ({"mode": "ns", "fanouts": "5,5"}, "fanouts"),
        ({"mode": "ns", "fanouts": [5, 2.5]}, "fanouts"),
        ({"seed": "1"}, "seed"),
    ],
)
def test_run_rejects_bad_options(setups, kwargs: dict, field: str) -> None:
    s = setups("sage", 2)
    with pytest.raises(InvalidInputError) as err:
        s.engine.run(request(), **kwargs)
    assert err.value.field == field


def test_run_revalidates_new_nodes(setups) -> None:
    s = setups("sage", 2)
    bad = NewNodes(torch.zeros(2, FEAT), np.array([[0, N]]), np.empty((0, 2), np.int64))
    with pytest.raises(InvalidInputError) as err:
        s.engine.run(bad)
    assert err.value.field == "new_nodes.edges"


def test_embeddings_must_fit_model_and_graph(store: Path) -> None:
    graph, features = open_graph_store(store), open_feature_store(store)
    model = GNN(ModelConfig("sage", FEAT, HIDDEN, CLASSES, num_layers=3)).eval()

    def pes(n: int, dims: list[int]) -> ArrayEmbeddings:
        meta = EmbeddingMeta("m", graph.version, n, dims)
        return ArrayEmbeddings(meta, [np.zeros((n, d), np.float32) for d in dims])

    for bad in (pes(N, [HIDDEN]), pes(N - 1, [HIDDEN, HIDDEN]), pes(N, [HIDDEN, 7])):
        with pytest.raises(InvalidInputError) as err:
            NewNodeInference(model, graph, features, bad)
        assert err.value.field == "embeddings"
    NewNodeInference(model, graph, features, pes(N, [HIDDEN, HIDDEN]))  # k-1 layers suffice
    with pytest.raises(InvalidInputError) as err:
        NewNodeInference(model, graph, features, pes(N, [HIDDEN] * 3), importance=np.ones(3))
    assert err.value.field == "importance"
