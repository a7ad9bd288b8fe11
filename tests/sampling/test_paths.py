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
    path_for,
)
from tests.sampling.checks import check_sample, edge_set

FANOUTS = [10, 5]


def test_registry_lists_the_cpu_paths_and_cuda_only_with_a_gpu() -> None:
    want = ["inline", "parallel"] + (["cuda"] if torch.cuda.is_available() else [])
    assert available_paths() == sorted(want)


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
    assert (len(inline_calls), len(parallel_calls), len(serial_calls)) == (1, len(FANOUTS), 0)
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


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_path_is_a_typed_not_built_error(small_store: Path) -> None:
    with pytest.raises(SamplingPathError, match="not implemented"):
        build_path("cuda", open_graph_store(small_store), FANOUTS)
