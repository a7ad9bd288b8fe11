"""bench/srpe_protocol.py: OMEGA's held-out workload (edges kept) and parameter-keyed caches."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from gnnserve.data.generators import sbm
from gnnserve.features import open_feature_store
from gnnserve.graph import open_graph_store
from tests.bench.loader import load_bench

protocol = load_bench("srpe_protocol")

N = 300


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small SBM graph (both edge directions, dense features) in the shared .npz format."""
    data = sbm(num_nodes=N, num_classes=3, feature_dim=8, avg_degree=12.0, seed=1)
    path = tmp_path_factory.mktemp("npz") / "tiny.npz"
    assert data.test_mask is not None and data.y is not None
    np.savez(
        path,
        edge_index=data.edge_index,
        num_nodes=N,
        x=data.x,
        y=data.y,
        train_mask=data.train_mask,
        val_mask=data.val_mask,
        test_mask=data.test_mask,
        name="tiny",
    )
    return path


def held_out(path: Path, work: protocol.Workload) -> np.ndarray:
    """Original ids of the held-out nodes, recovered from their features (unique rows)."""
    x = np.load(path)["x"].astype(np.float32)
    match = (x[None, :, :] == work.x[:, None, :]).all(-1)
    assert (match.sum(1) == 1).all()
    return match.argmax(1)


def test_edges_among_held_out_nodes_are_new_edges(dataset: Path, tmp_path: Path) -> None:
    work = protocol.split(dataset, tmp_path, fraction=0.5, seed=0)
    held = held_out(dataset, work)
    src, dst = np.load(dataset)["edge_index"]
    index = np.full(N, -1)
    index[held] = np.arange(held.size)
    both = (index[src] >= 0) & (index[dst] >= 0)
    pairs = {
        (min(a, b), max(a, b)) for a, b in zip(index[src[both]], index[dst[both]], strict=True)
    }
    assert pairs, "the fixture must have edges between held-out nodes"
    assert {tuple(e) for e in work.new_edges.tolist()} == pairs
    batch = 16
    sent = 0
    for idx, new in protocol.query_batches(work, batch):
        lo = int(idx[0])
        want = {(a - lo, b - lo) for a, b in pairs if lo <= a < lo + batch and lo <= b < lo + batch}
        assert {tuple(e) for e in new.new_edges.tolist()} == want
        sent += len(want)
    assert 0 < sent <= len(pairs)  # edges across two requests cannot be sent


def test_store_cache_is_keyed_by_seed_and_fraction(dataset: Path, tmp_path: Path) -> None:
    x = np.load(dataset)["x"].astype(np.float32)
    for fraction, seed in [(0.25, 0), (0.25, 1), (0.5, 1), (0.25, 0)]:
        work = protocol.split(dataset, tmp_path, fraction=fraction, seed=seed)
        keep = np.ones(N, bool)
        keep[held_out(dataset, work)] = False
        store = open_graph_store(work.store)
        assert store.num_nodes == keep.sum()
        got = open_feature_store(work.store).get(np.arange(store.num_nodes)).numpy()
        np.testing.assert_array_equal(got, x[keep])
    assert len({p.name for p in tmp_path.iterdir() if p.is_dir()}) == 3


def test_checkpoint_cache_is_keyed_by_training_parameters(dataset: Path, tmp_path: Path) -> None:
    work = protocol.split(dataset, tmp_path, fraction=0.25, seed=0)
    first = protocol.trained(work, "gcn", tmp_path, epochs=1, seed=0)
    stamp = (first / "config.json").stat().st_mtime_ns
    assert protocol.trained(work, "gcn", tmp_path, epochs=1, seed=0) == first  # reused
    assert (first / "config.json").stat().st_mtime_ns == stamp
    other_seed = protocol.trained(work, "gcn", tmp_path, epochs=1, seed=1)
    other_epochs = protocol.trained(work, "gcn", tmp_path, epochs=2, seed=0)
    assert len({first, other_seed, other_epochs}) == 3
    other = protocol.split(dataset, tmp_path, fraction=0.25, seed=1)
    assert protocol.trained(other, "gcn", tmp_path, epochs=1, seed=0) != first
