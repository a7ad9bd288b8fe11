"""Layer-wise full-graph precompute against plain PyG per-layer outputs, and the CLI."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from gnnserve.cli import main
from gnnserve.data.writer import GraphData, write_store
from gnnserve.embeddings.base import ArrayEmbeddings
from gnnserve.embeddings.precompute import (
    chunk_block,
    chunk_bounds,
    layer_chunk_edges,
    precompute_embeddings,
)
from gnnserve.embeddings.stores import default_embeddings_dir, open_embeddings
from gnnserve.errors import InvalidInputError
from gnnserve.features import open_feature_store
from gnnserve.graph import open_graph_store
from gnnserve.models.checkpoint import load_checkpoint, save_checkpoint
from gnnserve.models.zoo import GNN, ModelConfig
from tests.conftest import make_checkpoint, random_simple_graph
from tests.embeddings.reference import layer_outputs

N, F = 80, 6
ISOLATED = (0, 41, 79)  # no edge in or out
LOOP_ONLY = 57  # a self loop and nothing else


def _edges() -> np.ndarray:
    ei = random_simple_graph(N, 500, seed=3)
    bad = np.isin(ei, (*ISOLATED, LOOP_ONLY)).any(axis=0)
    loops = np.array([[5, 12, LOOP_ONLY], [5, 12, LOOP_ONLY]])  # 5 and 12 also have neighbours
    return np.concatenate([ei[:, ~bad], loops], axis=1)


@pytest.fixture(scope="module")
def graph_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    rng = np.random.default_rng(1)
    x = rng.standard_normal((N, F)).astype(np.float32)
    out = tmp_path_factory.mktemp("pe") / "g"
    write_store(GraphData("pe", N, _edges(), x), out)
    return out


def _model(arch: str, layers: int, seed: int = 0) -> GNN:
    torch.manual_seed(seed)
    config = ModelConfig(arch, in_dim=F, hidden_dim=8, out_dim=3, num_layers=layers, heads=2)
    return GNN(config)


def _reference(model: GNN, store: Path) -> list[np.ndarray]:
    features = open_feature_store(store)
    x = features.get(np.arange(N))
    return [o.numpy() for o in layer_outputs(model, x, torch.from_numpy(_edges()))]


def test_the_graph_has_what_the_cases_need(graph_store: Path) -> None:
    graph = open_graph_store(graph_store)
    deg = graph.in_degree()
    assert (deg[list(ISOLATED)] == 0).all() and deg[LOOP_ONLY] == 1
    assert 5 in graph.neighbors(5) and deg[5] > 1


@pytest.mark.parametrize("chunk_edges", [2_000_000, 7])
@pytest.mark.parametrize("layers", [2, 3])
@pytest.mark.parametrize("arch", ["gcn", "sage", "gat"])
def test_precompute_equals_full_graph_layer_outputs(
    graph_store: Path, arch: str, layers: int, chunk_edges: int
) -> None:
    graph, features = open_graph_store(graph_store), open_feature_store(graph_store)
    model = _model(arch, layers)
    model.train()  # precompute must run in eval mode (no dropout) and restore the mode
    pes = precompute_embeddings(
        model, graph, features, model_version="m@1", chunk_edges=chunk_edges, progress=False
    )
    assert model.training
    assert isinstance(pes, ArrayEmbeddings)
    assert pes.meta.model_version == "m@1" and pes.meta.graph_version == graph.version
    assert pes.meta.num_nodes == N and pes.meta.dims == [8] * (layers - 1) + [3]
    ref = _reference(model, graph_store)
    assert pes.num_layers == layers == len(ref)
    for layer, want in enumerate(ref, start=1):
        got = pes.layer(layer)
        assert got.dtype == np.float32 and got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-5, err_msg=f"layer {layer}")


def test_chunks_respect_the_edge_budget_and_cover_every_node(graph_store: Path) -> None:
    indptr, indices = open_graph_store(graph_store).csr()
    for budget in (1, 7, 50, 10**9):
        b = chunk_bounds(indptr, budget)
        assert b[0] == 0 and b[-1] == N and (np.diff(b) >= 1).all()
        edges = indptr[b[1:]] - indptr[b[:-1]]
        sizes = np.diff(b)
        assert ((edges <= budget) | (sizes == 1)).all()
        assert (sizes <= budget).all()
    assert chunk_bounds(indptr, 10**9).size == 2
    assert chunk_bounds(indptr, 7).size - 1 > 10  # the small budget really makes many chunks


def test_chunk_block_puts_destinations_first_and_keeps_every_in_edge(graph_store: Path) -> None:
    indptr, indices = open_graph_store(graph_store).csr()
    lo, hi = 3, 15
    block, src_ids = chunk_block(indptr, indices, lo, hi)
    assert block.n_dst == hi - lo and block.n_src == src_ids.size
    np.testing.assert_array_equal(src_ids[: hi - lo], np.arange(lo, hi))
    assert np.unique(src_ids).size == src_ids.size  # distinct sources
    src, dst = block.edge_index.numpy()
    got = sorted(zip(src_ids[src].tolist(), (dst + lo).tolist(), strict=True))
    want = sorted((int(u), v) for v in range(lo, hi) for u in indices[indptr[v] : indptr[v + 1]])
    assert got == want


def test_writing_to_a_directory_returns_a_file_backed_store(
    graph_store: Path, tmp_path: Path
) -> None:
    graph, features = open_graph_store(graph_store), open_feature_store(graph_store)
    model = _model("gcn", 3)
    mem = precompute_embeddings(  # same chunks: the same float operations in the same order
        model, graph, features, model_version="m@1", chunk_edges=20, progress=False
    )
    out = tmp_path / "pe"
    disk = precompute_embeddings(
        model, graph, features, model_version="m@1", out_dir=out, chunk_edges=20, progress=False
    )
    assert sorted(p.name for p in out.iterdir()) == [
        "layer1.bin",
        "layer2.bin",
        "layer3.bin",
        "meta.json",
    ]
    assert isinstance(disk.layer(1), np.memmap)
    assert disk.meta == mem.meta
    for layer in (1, 2, 3):
        np.testing.assert_array_equal(disk.layer(layer), mem.layer(layer))
        np.testing.assert_array_equal(open_embeddings(out).layer(layer), mem.layer(layer))
    # a second run into the same directory replaces it, stale deeper layers included
    again = precompute_embeddings(
        _model("gcn", 2, seed=1), graph, features, model_version="m@2", out_dir=out, progress=False
    )
    assert open_embeddings(out).meta.model_version == again.meta.model_version == "m@2"
    assert sorted(p.name for p in out.iterdir()) == ["layer1.bin", "layer2.bin", "meta.json"]


def test_chunk_bytes_shrink_chunks_of_wide_layers_only() -> None:
    assert layer_chunk_edges(2_000_000, 512 << 20, 4735) == (512 << 20) // (8 * 4735)
    assert layer_chunk_edges(1000, 512 << 20, 16) == 1000  # the edge cap still applies
    assert layer_chunk_edges(1000, 1, 4735) == 1  # never below one edge (one node per chunk)


def test_byte_budget_gives_the_same_embeddings(graph_store: Path) -> None:
    graph, features = open_graph_store(graph_store), open_feature_store(graph_store)
    model = _model("sage", 3)
    whole = precompute_embeddings(model, graph, features, model_version="m", progress=False)
    tiny = precompute_embeddings(
        model, graph, features, model_version="m", chunk_bytes=8 * F * 5, progress=False
    )
    for layer in (1, 2, 3):
        np.testing.assert_allclose(tiny.layer(layer), whole.layer(layer), rtol=0, atol=1e-5)


def test_rejects_bad_arguments(graph_store: Path) -> None:
    graph, features = open_graph_store(graph_store), open_feature_store(graph_store)
    with pytest.raises(InvalidInputError, match="chunk_bytes"):
        precompute_embeddings(
            _model("sage", 2), graph, features, model_version="m", chunk_bytes=0, progress=False
        )
    with pytest.raises(InvalidInputError, match="chunk_edges"):
        precompute_embeddings(
            _model("sage", 2), graph, features, model_version="m", chunk_edges=0, progress=False
        )
    torch.manual_seed(0)
    wide = GNN(ModelConfig("sage", in_dim=F + 1, hidden_dim=8, out_dim=3))
    with pytest.raises(InvalidInputError, match="wide"):
        precompute_embeddings(wide, graph, features, model_version="m", progress=False)


def test_progress_bar_goes_to_stderr(graph_store: Path, capsys: pytest.CaptureFixture) -> None:
    graph, features = open_graph_store(graph_store), open_feature_store(graph_store)
    precompute_embeddings(_model("sage", 2), graph, features, model_version="m", chunk_edges=100)
    captured = capsys.readouterr()
    assert captured.out == "" and "precompute" in captured.err


def test_cli_writes_the_same_embeddings_as_in_process(
    small_store: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    store = tmp_path / "store"
    shutil.copytree(small_store, store)  # the default output goes inside the store
    ckpt = make_checkpoint(store, tmp_path / "gcn-ckpt", arch="gcn")
    argv = ["precompute", "--store", str(store), "--model", str(ckpt)]
    code = main([*argv, "--chunk-edges", "4000", "--torch-threads", "1", "--no-progress"])
    assert code == 0
    report = json.loads(capsys.readouterr().out)
    out = default_embeddings_dir(store, ckpt)
    assert out == store / "embeddings" / "gcn-ckpt" and Path(report["out"]) == out
    loaded = load_checkpoint(ckpt)
    graph, features = open_graph_store(store), open_feature_store(store)
    want = precompute_embeddings(
        loaded.model, graph, features, model_version=loaded.version, progress=False
    )  # other chunks than the CLI's, so the sums run in another order: equal to rounding
    assert report["model_version"] == loaded.version
    assert report["graph_version"] == graph.version and report["num_nodes"] == graph.num_nodes
    assert report["bytes"] == sum(p.stat().st_size for p in out.iterdir())
    assert report["bytes"] > 4 * graph.num_nodes * (32 + 4) and report["seconds"] >= 0
    mem, mapped = open_embeddings(out, "memory"), open_embeddings(out, "mmap")
    assert mem.meta == mapped.meta == want.meta
    for layer in (1, 2):
        np.testing.assert_array_equal(mem.layer(layer), mapped.layer(layer))
        np.testing.assert_allclose(mem.layer(layer), want.layer(layer), rtol=0, atol=1e-6)

    explicit = tmp_path / "elsewhere"
    assert main([*argv, "--out", str(explicit), "--backend", "mmap", "--no-progress"]) == 0
    capsys.readouterr()
    got = open_embeddings(explicit).layer(2)
    np.testing.assert_allclose(got, want.layer(2), rtol=0, atol=1e-6)


def test_cli_refuses_a_checkpoint_of_another_store(
    small_store: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    meta = json.loads((small_store / "meta.json").read_text())
    torch.manual_seed(0)
    config = ModelConfig("sage", in_dim=meta["feature_dim"], hidden_dim=8, out_dim=4)
    ckpt = tmp_path / "other"
    save_checkpoint(ckpt, GNN(config), config, {"store_checksum": "0" * 32})
    out = tmp_path / "pe"
    argv = ["precompute", "--store", str(small_store), "--model", str(ckpt), "--out", str(out)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "0" * 32 in err and meta["checksum"] in err
    assert not out.exists()


def test_cli_update_log_gives_the_pes_of_the_updated_graph_and_leaves_the_log(
    small_store: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    from gnnserve.dynamic.store import DynamicStore

    store = tmp_path / "store"
    shutil.copytree(small_store, store)
    ckpt = make_checkpoint(store, tmp_path / "sage-ckpt", arch="sage")
    log = tmp_path / "updates.log"
    graph, features = open_graph_store(store), open_feature_store(store)
    n = graph.num_nodes
    src0 = int(graph.neighbors(0)[0])  # an existing edge src0 -> 0 to delete
    live = DynamicStore(graph, features, log)
    live.apply([{"op": "add_node", "features": [0.5] * features.dim}])
    live.apply(
        [{"op": "add_edge", "src": n, "dst": 1}, {"op": "delete_edge", "src": src0, "dst": 0}]
    )
    live.close()
    logged = log.read_bytes() + b'{"torn'  # a half-written record, as beside a live writer
    log.write_bytes(logged)

    argv = ["precompute", "--store", str(store), "--model", str(ckpt), "--no-progress"]
    assert main([*argv, "--update-log", str(log), "--out", str(tmp_path / "pe")]) == 0
    report = json.loads(capsys.readouterr().out)
    assert log.read_bytes() == logged  # read only: the torn tail is the writer's to repair
    replayed = DynamicStore(open_graph_store(store), open_feature_store(store), log, read_only=True)
    assert report["graph_version"] == replayed.graph.version
    assert report["graph_version"].endswith(".2") and report["num_nodes"] == n + 1
    want = precompute_embeddings(
        load_checkpoint(ckpt).model,
        replayed.graph,
        replayed.features,
        model_version="m",
        progress=False,
    )
    got = open_embeddings(tmp_path / "pe")
    for layer in (1, 2):
        np.testing.assert_allclose(got.layer(layer), want.layer(layer), rtol=0, atol=1e-6)
    replayed.close()

    assert main([*argv, "--update-log", str(tmp_path / "missing.log")]) == 2
    assert "no update log" in capsys.readouterr().err
