"""The numba-cuda sampler: the numba CPU sampler's draws bit for bit, a launch count that grows
with the scan levels only (not with the batch), a clean scratch map, and a device pipeline that
answers as the host pipeline does. Here the kernels run under numba's CUDA simulator (set in
conftest.py); on a GPU machine the same tests run on the GPU, plus the ``gpu`` ones."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from numba import cuda

from gnnserve.engine.device_pipeline import DeviceFeatures, DevicePipeline
from gnnserve.features import open_feature_store
from gnnserve.graph import open_graph_store
from gnnserve.graph.base import GraphStore
from gnnserve.models.checkpoint import load_checkpoint
from gnnserve.sampling import cuda_kernels as kern
from gnnserve.sampling.cuda_sampler import CudaSampler, _Launches
from gnnserve.sampling.sampler import NeighborSampler
from tests.conftest import GraphData, random_simple_graph, write_store
from tests.sampling.checks import check_sample, edge_set
from tests.sampling.test_device import _equal

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # uint64 wrap in the simulator


@pytest.fixture(scope="module")
def tiny_graph(tmp_path_factory: pytest.TempPathFactory) -> GraphStore:
    """200 nodes, 1,600 edges: small enough for the simulator."""
    n, rng = 200, np.random.default_rng(0)
    mask = rng.random(n)
    data = GraphData(
        "tiny", n, random_simple_graph(n, 1600, seed=0),
        rng.standard_normal((n, 4)).astype(np.float32), rng.integers(0, 2, n),
        mask < 0.6, (mask >= 0.6) & (mask < 0.8), mask >= 0.8,
    )  # fmt: skip
    out = tmp_path_factory.mktemp("cuda") / "tiny"
    write_store(data, out)
    return open_graph_store(out)


@pytest.mark.parametrize("fanouts", [[10, 5], [3, -1, 2], [25]])  # -1: every neighbour
def test_draws_equal_the_numba_sampler(tiny_graph: GraphStore, fanouts: list[int]) -> None:
    rng = np.random.default_rng(len(fanouts))
    cpu, gpu = NeighborSampler(tiny_graph, fanouts), CudaSampler(tiny_graph, fanouts)
    deg, edges = np.diff(tiny_graph.csr()[0]), edge_set(tiny_graph)
    for seeds in (np.array([7]), np.array([5, 9, 5])):  # one seed; several, one repeated
        key = int(rng.integers(0, 2**62))
        got = gpu.sample_valid(seeds, rng_seed=key)
        _equal(cpu.sample(seeds, rng_seed=key), got)
        check_sample(got, seeds, fanouts, edges, deg)


def _scan_launches(n: int) -> int:
    """Launches of an inclusive scan of n values: one per level, plus one offset add per level
    below the top."""
    return 1 if n <= kern.SCAN_BLOCK else 2 + _scan_launches(-(-n // kern.SCAN_BLOCK))


def test_inclusive_scan_at_every_level() -> None:
    rng = np.random.default_rng(3)
    for n in (
        1,
        kern.SCAN_BLOCK - 1,
        kern.SCAN_BLOCK,
        kern.SCAN_BLOCK + 1,
        260,
    ):  # 3 levels simulated
        values = rng.integers(0, 50, n)
        launches = _Launches()
        got = launches.inclusive_scan(cuda.to_device(values)).copy_to_host()
        np.testing.assert_array_equal(got, np.cumsum(values))
        assert launches.count == _scan_launches(n)


def test_launches_grow_with_scan_levels_not_with_the_batch(tiny_graph: GraphStore) -> None:
    sampler = CudaSampler(tiny_graph, [4, 2])
    for n_seeds in (1, 6):
        seeds = np.arange(n_seeds) * 7
        sample = sampler.sample_on_device(seeds, rng_seed=1)
        # seeds numbered (mark, flags scanned, assign), their rows, forget
        expected = 3 + _scan_launches(n_seeds) + 1
        for block in reversed(sample.blocks):  # hops, seeds' first
            n_edges = block.edge_index.shape[1]
            expected += 1 + _scan_launches(block.n_dst)  # counts scanned, draw
            expected += 3 + _scan_launches(n_edges) if n_edges else 0
        assert sample.launches == expected


def test_calls_draw_anew_and_leave_the_scratch_clean(tiny_graph: GraphStore) -> None:
    sampler = CudaSampler(tiny_graph, [3, 2])
    seeds = np.array([1, 2, 3])
    first, second = sampler.sample_valid(seeds), sampler.sample_valid(seeds)
    assert not np.array_equal(first.nodes, second.nodes)  # a fresh key per call
    scratch = sampler._scratch.get_nowait()
    assert (scratch.local_id.copy_to_host() == -1).all()
    assert (scratch.first.copy_to_host() == kern.UNSEEN_EDGE).all()
    sampler._scratch.put(scratch)
    _equal(sampler.sample_valid(seeds, 5), NeighborSampler(tiny_graph, [3, 2]).sample(seeds, 5))


def _host_answers(store: Path, ckpt: Path, fanouts: list[int], seeds: np.ndarray, key: int):  # type: ignore[no-untyped-def]
    graph, features = open_graph_store(store), open_feature_store(store)
    sample = NeighborSampler(graph, fanouts).sample(seeds, rng_seed=key)
    ids = sample.input_nodes
    model = load_checkpoint(ckpt).model.eval()
    with torch.inference_mode():
        logits, embedding = model.forward_blocks(
            features.get_valid(ids), sample.blocks, torch.from_numpy(graph.gcn_degree(ids))
        )
    rows = torch.from_numpy(sample.seed_rows)
    return logits[rows], embedding[rows]


def _pipeline(store: Path, ckpt: Path, fanouts: list[int], device: str) -> DevicePipeline:
    graph, features = open_graph_store(store), open_feature_store(store)
    hot = np.arange(0, graph.num_nodes, 2)  # half the rows on the device, half on the host
    rows = DeviceFeatures(features, hot, torch.device(device))
    return DevicePipeline(load_checkpoint(ckpt).model, graph, rows, fanouts)


def test_device_pipeline_answers_as_the_host_pipeline(small_store: Path, small_ckpt: Path) -> None:
    # the CPU under the simulator; a GPU machine runs the real device with half the rows pinned
    device = "cuda" if torch.cuda.is_available() else "cpu"
    pipeline = _pipeline(small_store, small_ckpt, [3, 2], device)
    seeds = np.array([4, 17, 4])
    logits, embedding = pipeline.predict(seeds, rng_seed=11)
    want_logits, want_embedding = _host_answers(small_store, small_ckpt, [3, 2], seeds, 11)
    if device == "cpu":
        assert torch.equal(logits, want_logits) and torch.equal(embedding, want_embedding)
    else:  # the same sample; the GPU's float sums run in another order
        torch.testing.assert_close(logits, want_logits, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(embedding, want_embedding, rtol=1e-4, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gpu_batches_equal_the_cpu(small_store: Path, small_ckpt: Path) -> None:
    graph = open_graph_store(small_store)
    rng = np.random.default_rng(4)
    for fanouts in ([25, 10], [-1, 3], [10, 5, 5]):
        cpu, gpu = NeighborSampler(graph, fanouts), CudaSampler(graph, fanouts)
        for n_seeds in (1, 64, 1024):
            seeds, key = rng.integers(0, graph.num_nodes, n_seeds), int(rng.integers(0, 2**62))
            _equal(cpu.sample(seeds, rng_seed=key), gpu.sample_valid(seeds, key))
    pipeline = _pipeline(small_store, small_ckpt, [25, 10], "cuda")
    seeds = rng.integers(0, graph.num_nodes, 1024)
    with warnings.catch_warnings():
        logits, embedding = pipeline.predict(seeds, rng_seed=3)
    want_logits, want_embedding = _host_answers(small_store, small_ckpt, [25, 10], seeds, 3)
    torch.testing.assert_close(logits, want_logits, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(embedding, want_embedding, rtol=1e-5, atol=1e-5)
