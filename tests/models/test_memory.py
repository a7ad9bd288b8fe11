"""Peak-memory measurement against known allocations; the MLP predictor on an exact synthetic
function and on real GCN forwards; its files round-trip and refuse another model's."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from gnnserve.errors import StoreFormatError
from gnnserve.features import open_feature_store
from gnnserve.graph import open_graph_store
from gnnserve.models import peakmem
from gnnserve.models.memory import (
    PREDICTOR_META,
    PREDICTOR_WEIGHTS,
    MemoryPredictor,
    PeakMemoryUnavailableError,
    checkpoint_identity,
    feature_names,
    peak_memory,
    profile,
    request_features,
)
from gnnserve.models.runner import ModelRunner
from gnnserve.models.zoo import GNN, ModelConfig
from gnnserve.sampling.sampler import NeighborSampler
from gnnserve.types import Block, MiniBatch, SampledSubgraph
from tests.conftest import make_checkpoint

MB = 1 << 20


def _allocate(mb: int) -> float:
    return float(np.ones(mb * MB // 8).sum())  # every page written, freed on return


def test_peak_of_a_known_allocation_and_measurements_are_independent() -> None:
    for mb in (64, 16, 48, 4):  # a smaller peak after a larger one: the mark was reset
        total, peak = peak_memory(lambda mb=mb: _allocate(mb))
        assert total == mb * MB // 8
        assert abs(peak - mb * MB) <= 0.03 * mb * MB + 2 * MB, (mb, peak / MB)
    assert peak_memory(lambda: None)[1] < 2 * MB


def test_unresettable_high_water_mark_is_a_typed_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(peakmem, "CLEAR_REFS", tmp_path)  # a directory: not writable as a file
    with pytest.raises(PeakMemoryUnavailableError, match="high-water mark") as info:
        peak_memory(lambda: None)
    assert str(tmp_path) in info.value.message


def test_request_features_are_per_block_counts() -> None:
    blocks = [
        Block(torch.zeros((2, 5), dtype=torch.int64), n_src=7, n_dst=3),
        Block(torch.zeros((2, 2), dtype=torch.int64), n_src=3, n_dst=1),
    ]
    subgraph = SampledSubgraph(np.arange(7), blocks, 1, np.array([0]))
    np.testing.assert_array_equal(request_features(subgraph), [7, 3, 5, 3, 1, 2])
    assert feature_names(2)[3:] == ["block1.n_src", "block1.n_dst", "block1.edges"]


def synthetic(n: int, seed: int, layers: int = 2, dim: int = 100) -> tuple[np.ndarray, np.ndarray]:
    """Nested per-layer counts and bytes = 4*dim*sum(n_src) + 16*edges + 2 MB, 1% noise."""
    rng = np.random.default_rng(seed)
    n_dst = rng.integers(1, 200, n).astype(np.float64)
    cols = []
    for _ in range(layers):  # from the seeds outwards
        edges = n_dst * rng.uniform(3, 10, n)
        n_src = n_dst + edges * rng.uniform(0.3, 0.9, n)
        cols.append((n_src, n_dst, edges))
        n_dst = n_src
    X = np.stack([c for block in reversed(cols) for c in block], axis=1)
    y = 4 * dim * X[:, 0::3].sum(1) + 16 * X[:, 2::3].sum(1) + 2 * MB
    return X, y * (1 + 0.01 * rng.standard_normal(n))


@pytest.fixture(scope="module")
def fitted() -> tuple[MemoryPredictor, np.ndarray, np.ndarray]:
    X, y = synthetic(200, seed=0)
    Xt, yt = synthetic(200, seed=1)
    return MemoryPredictor(2).fit(X, y, seed=0, validation=(Xt, yt)), Xt, yt


def test_fit_learns_a_smooth_memory_function(fitted) -> None:
    predictor, Xt, yt = fitted
    errors = predictor.evaluate(Xt, yt)
    assert errors["mean_rel_error"] < 0.05 and errors["max_rel_error"] < 0.25
    assert predictor.info.held_out == errors and predictor.info.train_size == 200
    rel = np.abs(predictor.predict(Xt) - yt) / yt  # independent of evaluate()
    assert rel.mean() == pytest.approx(errors["mean_rel_error"])


def test_save_load_round_trip_beside_a_checkpoint(fitted, small_store: Path, tmp_path: Path):
    predictor, Xt, _ = fitted
    ckpt = make_checkpoint(small_store, tmp_path / "ckpt", arch="gcn")
    predictor.info.model_version = ""  # taken from the checkpoint on save
    doc = json.loads(predictor.save(ckpt).read_text())
    identity = checkpoint_identity(ckpt)
    assert identity is not None and doc["model_version"] == identity[1]
    assert doc["num_layers"] == 2 and doc["feature_layout"] == feature_names(2)
    loaded = MemoryPredictor.load_if_present(ckpt.as_uri())  # a path or a file URL
    assert loaded is not None and loaded.info == predictor.info
    np.testing.assert_array_equal(loaded.predict(Xt), predictor.predict(Xt))
    assert MemoryPredictor.load_if_present(tmp_path) is None


def test_load_refuses_another_model(fitted, small_store: Path, tmp_path: Path) -> None:
    predictor, _, _ = fitted
    ckpt = make_checkpoint(small_store, tmp_path / "ckpt", arch="gcn")
    predictor.info.model_version = ""
    predictor.save(ckpt)
    json_path = str(ckpt / PREDICTOR_META)
    with pytest.raises(StoreFormatError, match="model version") as info:
        MemoryPredictor.load(ckpt, model_version="other@0123456789ab")
    assert json_path in info.value.message
    with pytest.raises(StoreFormatError, match="layer count"):
        MemoryPredictor.load(ckpt, num_layers=3)
    three = MemoryPredictor(3).fit(*synthetic(50, seed=2, layers=3), epochs=10)
    three.save(ckpt)  # the checkpoint has 2 layers
    with pytest.raises(StoreFormatError, match="layer count") as info:
        MemoryPredictor.load(ckpt)
    assert json_path in info.value.message
    predictor.save(ckpt)
    (ckpt / PREDICTOR_WEIGHTS).write_bytes(b"tampered")
    with pytest.raises(StoreFormatError, match=PREDICTOR_WEIGHTS):
        MemoryPredictor.load(ckpt)


def real_gcn_held_out(store: str) -> dict[str, float]:
    """Profile 72 real GCN forwards on ``store``, fit on 54, and return the held-out errors and
    the peaks' range (run by the test in a fresh process: see there)."""
    graph, features = open_graph_store(store), open_feature_store(store)
    torch.manual_seed(0)
    config = ModelConfig(arch="gcn", in_dim=16, hidden_dim=128, out_dim=4, num_layers=2)
    runner = ModelRunner(GNN(config), "gcn-test")
    sampler = NeighborSampler(graph, [10, 10], seed=0)
    rng = np.random.default_rng(0)

    def request(subgraph: SampledSubgraph):  # what an inference function runs per request
        ids = subgraph.input_nodes
        degree = torch.from_numpy(graph.gcn_degree(ids))
        return lambda: runner.forward(MiniBatch(subgraph, features.get_valid(ids), degree))

    samples = []
    for i in range(72):
        seeds = rng.choice(graph.num_nodes, int(np.exp(rng.uniform(np.log(10), np.log(600)))))
        subgraph = sampler.sample(seeds, rng_seed=i)
        samples.append((subgraph, request(subgraph)))
    X, y = profile(samples)
    assert X.shape == (72, 6) and (y > 0).all()
    predictor = MemoryPredictor(2).fit(X[:54], y[:54], validation=(X[54:], y[54:]))
    held_out = predictor.info.held_out
    assert held_out is not None
    return {**held_out, "min_mib": float(y.min() / MB), "max_mib": float(y.max() / MB)}


def test_profile_real_gcn_forwards(small_store: Path) -> None:
    # VmHWM is the process's: in the suite's process, threads other tests left running
    # (servers, pools) allocate during a measurement, so it runs in a fresh interpreter, as a
    # serverless profiler's worker does
    code = (
        "import json, sys; from tests.models.test_memory import real_gcn_held_out; "
        "print(json.dumps(real_gcn_held_out(sys.argv[1])))"
    )
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, "-c", code, str(small_store)],
        cwd=root, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    held_out = json.loads(done.stdout.strip().splitlines()[-1])
    print(
        f"real GCN peaks {held_out['min_mib']:.2f}-{held_out['max_mib']:.2f} MiB; held-out mean "
        f"rel error {held_out['mean_rel_error']:.3f}, max {held_out['max_rel_error']:.3f}"
    )
    assert held_out["mean_rel_error"] < 0.5
