"""Sampling paths: the registry, the kernel each CPU path runs, equal samples on both."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from gnnserve.errors import InvalidInputError
from gnnserve.graph import open_graph_store
from gnnserve.sampling import kernels
from gnnserve.sampling.metrics import psgs
from gnnserve.sampling.paths import (
    SamplingPathError,
    available_paths,
    build_path,
    cuda_path,
    cuda_torch_path,
    path_for,
    throughput_path,
)
from gnnserve.sampling.sampler import NeighborSampler
from tests.sampling.checks import check_sample, edge_set

FANOUTS = [10, 5]


def test_registry_lists_the_cpu_paths_and_cuda_only_with_a_gpu() -> None:
    gpu = ["cuda", "cuda-torch"] if torch.cuda.is_available() else []
    want = ["inline", "parallel", "torch", *gpu]
    assert available_paths() == sorted(want)
    assert throughput_path() == ("cuda" if torch.cuda.is_available() else "parallel")


@pytest.fixture(autouse=True)
def _kernels_compiled(small_store: Path) -> None:
    """Compile every sampling kernel before a test replaces one with a spy: a jitted kernel
    compiled while ``kernels.draw_serial`` is a Python spy fails to type (and the failure sticks
    to the process), which a cold numba cache (a fresh machine) made these tests meet."""
    graph = open_graph_store(small_store)
    seeds = np.arange(4, dtype=np.int64)
    for threshold, draw_edges in ((2**62, 0), (1, 2**62), (1, 0)):  # inline, serial, parallel
        NeighborSampler(
            graph, FANOUTS, parallel_threshold=threshold, parallel_draw_edges=draw_edges
        ).sample(seeds)


def _spy(monkeypatch: pytest.MonkeyPatch, name: str) -> list[int]:
    """Count the calls of the real kernel ``kernels.<name>`` (it still runs)."""
    calls: list[int] = []
    real = getattr(kernels, name)

    def counted(*args: object) -> object:
        calls.append(1)
        return real(*args)

    monkeypatch.setattr(kernels, name, counted)
    return calls


@pytest.mark.parametrize("n_seeds", [1, 300])
def test_each_path_runs_its_kernel_and_both_sample_the_same(
    small_store: Path, monkeypatch: pytest.MonkeyPatch, n_seeds: int
) -> None:
    graph = open_graph_store(small_store)
    cost = psgs(graph, FANOUTS)
    seeds = np.random.default_rng(n_seeds).choice(graph.num_nodes, n_seeds, replace=False)
    inline_calls = _spy(monkeypatch, "sample_inline")
    parallel_calls = _spy(monkeypatch, "draw_parallel")
    serial_calls = _spy(monkeypatch, "draw_serial")
    inline = build_path("inline", graph, FANOUTS, cost=cost).sample(seeds, rng_seed=7)
    assert (len(inline_calls), len(parallel_calls)) == (1, 0)
    parallel = build_path("parallel", graph, FANOUTS, cost=cost).sample(seeds, rng_seed=7)
    calibrated = (len(inline_calls), len(parallel_calls), len(serial_calls))
    # the calibrated throughput path is the one a served sampler runs past its routing point
    NeighborSampler(graph, FANOUTS, parallel_threshold=1, cost=cost).sample(seeds, rng_seed=7)
    served = (len(inline_calls), len(parallel_calls), len(serial_calls))
    assert calibrated[0] == 1 and sum(calibrated[1:]) == len(FANOUTS)
    assert np.subtract(served, calibrated).tolist() == [0, *calibrated[1:]]
    assert calibrated[1] == (0 if n_seeds == 1 else len(FANOUTS))  # big hops in parallel
    deg = np.diff(graph.csr()[0])
    edges = edge_set(graph)
    for sg in (inline, parallel):
        check_sample(sg, seeds, FANOUTS, edges, deg)
    np.testing.assert_array_equal(inline.nodes, parallel.nodes)
    for a, b in zip(inline.blocks, parallel.blocks, strict=True):
        assert torch.equal(a.edge_index, b.edge_index)


def test_path_for_states_the_served_samplers_choice(
    small_store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    graph = open_graph_store(small_store)
    cost = psgs(graph, FANOUTS)
    sampler = build_path("inline", graph, FANOUTS, cost=cost)
    seeds = np.arange(40, dtype=np.int64)
    size = float(cost[seeds].sum())
    inline_calls = _spy(monkeypatch, "sample_inline")
    for threshold, want in ((size + 1, "inline"), (size, "parallel"), (1, "parallel")):
        sampler.parallel_threshold = int(np.ceil(threshold))  # type: ignore[attr-defined]
        before = len(inline_calls)
        sampler.sample(seeds)
        took = "inline" if len(inline_calls) > before else "parallel"
        assert took == path_for(size, threshold) == want


def test_unknown_path_is_refused_naming_the_choices(small_store: Path) -> None:
    graph = open_graph_store(small_store)
    with pytest.raises(InvalidInputError, match="inline") as info:
        build_path("gpu-magic", graph, FANOUTS)
    assert info.value.field == "sampling path"


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA device")
def test_cuda_path_without_a_gpu_is_a_typed_error(small_store: Path) -> None:
    for build in (cuda_path, cuda_torch_path):
        with pytest.raises(SamplingPathError, match="needs a CUDA device"):
            build(open_graph_store(small_store), FANOUTS)
    with pytest.raises(InvalidInputError, match="torch"):  # unregistered: the choices named
        build_path("cuda", open_graph_store(small_store), FANOUTS)


@pytest.mark.parametrize("path", ["torch", "cuda", "cuda-torch"])
def test_a_throughput_sampler_takes_the_batches_at_the_threshold(
    small_store: Path, monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    if path not in available_paths():
        pytest.skip("needs a CUDA device")
    graph = open_graph_store(small_store)
    cost = psgs(graph, FANOUTS)
    device = build_path(path, graph, FANOUTS, cost=cost)
    served = NeighborSampler(graph, FANOUTS, cost=cost, throughput=device)  # type: ignore[arg-type]
    reference = NeighborSampler(graph, FANOUTS, cost=cost)
    calls: list[int] = []
    real = device.sample_valid
    monkeypatch.setattr(device, "sample_valid", lambda *a: calls.append(1) or real(*a))
    seeds = np.arange(40, dtype=np.int64)
    size = float(cost[seeds].sum())
    for threshold, want in ((size + 1, 0), (size, 1)):
        served.parallel_threshold = reference.parallel_threshold = int(np.ceil(threshold))
        before = len(calls)
        got, expected = served.sample(seeds, rng_seed=5), reference.sample(seeds, rng_seed=5)
        assert len(calls) - before == want
        np.testing.assert_array_equal(got.nodes, expected.nodes)
        for a, b in zip(got.blocks, expected.blocks, strict=True):
            assert torch.equal(a.edge_index, b.edge_index)
