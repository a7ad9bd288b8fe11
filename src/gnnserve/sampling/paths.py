"""Sampling paths as devices (Quiver §4.2): named ways to sample a batch, behind one interface.

- ``inline``: the latency path, one serial numba call builds every hop (``NeighborSampler`` whose
  parallel threshold no batch reaches);
- ``parallel``: the throughput path, hop by hop with the parallel numba kernel on every core
  (``NeighborSampler`` with threshold 1: every batch goes hop by hop, each hop of at least
  ``PARALLEL_DRAW_EDGES`` edges drawn in parallel): exactly what a served sampler runs for a
  batch past its routing point, so calibration measures the path that is served;
- ``cuda``: registered only when torch sees a GPU:
  :class:`~gnnserve.sampling.cuda_sampler.CudaSampler` with the adjacency in GPU memory, each
  hop a few numba-cuda kernel launches (count, scan, draw, relabel); the throughput path there.
  Features are gathered on the GPU by the tiered store's ``gpu`` tier (``serve --tiers
  gpu=...``), or, with the model on the GPU too, by
  :class:`~gnnserve.engine.device_pipeline.DevicePipeline`;
- ``cuda-torch``: :class:`~gnnserve.sampling.device.DeviceSampler` on the GPU (the previous
  GPU path: whole-frontier torch operations, ~20 launches per Floyd step), GPU machines only;
- ``torch``: that ``DeviceSampler`` on the CPU (torch's intra-op threads). Slower than the numba
  paths for small batches.

All paths draw the same sample for the same draw key (tested). A served ``NeighborSampler``
chooses per batch: a batch whose summed PSGS (expected sampled nodes) is below its
``parallel_threshold`` runs inline, the rest on its throughput path, hop by hop in parallel by
default or on the calibrated ``throughput`` sampler (:func:`path_for` states the rule).
Calibration (``sampling.calibrate``) runs the same batches through the latency path and one
throughput path (:func:`throughput_path`: ``cuda`` where present) to measure that threshold.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np
import torch

from gnnserve.errors import GnnServeError
from gnnserve.graph.base import GraphStore
from gnnserve.registry import Registry
from gnnserve.sampling.cuda_sampler import CudaSampler
from gnnserve.sampling.device import DeviceSampler
from gnnserve.sampling.sampler import NeighborSampler
from gnnserve.types import SampledSubgraph

NEVER = 2**62  # a parallel threshold no batch's expected size reaches: always inline


class SamplingPathError(GnnServeError):
    """A sampling path that cannot run on this machine or is not built yet."""


class PathSampler(Protocol):
    """What every sampling path builds: seeds in, a SampledSubgraph out."""

    def sample(self, seeds: np.ndarray) -> SampledSubgraph:
        """The computation graph of ``seeds`` (checked)."""

    def sample_valid(self, seeds: np.ndarray, rng_seed: int | None = None) -> SampledSubgraph:
        """The same for seeds already validated (int64 ids of the graph, at least one); the
        draw key ``rng_seed`` fixes the sample, the same one on every path."""

    def expected_size(self, seeds: np.ndarray) -> float:
        """Expected sampled nodes of ``seeds`` (their summed PSGS when known)."""


SAMPLING_PATHS: Registry[PathSampler] = Registry("sampling path")


@SAMPLING_PATHS.register("inline")
def inline_path(
    graph: GraphStore, fanouts: list[int], seed: int = 0, cost: np.ndarray | None = None
) -> NeighborSampler:
    """Single-thread latency path: every batch in one serial numba call."""
    return NeighborSampler(graph, fanouts, seed, parallel_threshold=NEVER, cost=cost)


@SAMPLING_PATHS.register("parallel")
def parallel_path(
    graph: GraphStore, fanouts: list[int], seed: int = 0, cost: np.ndarray | None = None
) -> NeighborSampler:
    """All-core throughput path: hop by hop, each large hop drawn by the parallel numba kernel
    (the served sampler's own throughput path)."""
    return NeighborSampler(graph, fanouts, seed, parallel_threshold=1, cost=cost)


@SAMPLING_PATHS.register("torch")
def torch_path(
    graph: GraphStore, fanouts: list[int], seed: int = 0, cost: np.ndarray | None = None
) -> DeviceSampler:
    """The device sampler on the CPU: vectorised torch over torch's intra-op threads."""
    return DeviceSampler(graph, fanouts, seed, cost, device="cpu")


def cuda_path(
    graph: GraphStore, fanouts: list[int], seed: int = 0, cost: np.ndarray | None = None
) -> CudaSampler:
    """GPU throughput path: the adjacency in GPU memory, each hop a few numba-cuda kernels."""
    _need_cuda("cuda")
    return CudaSampler(graph, fanouts, seed, cost)


def cuda_torch_path(
    graph: GraphStore, fanouts: list[int], seed: int = 0, cost: np.ndarray | None = None
) -> DeviceSampler:
    """The torch device sampler on the GPU (whole-frontier tensor operations)."""
    _need_cuda("cuda-torch")
    return DeviceSampler(graph, fanouts, seed, cost, device="cuda")


def _need_cuda(path: str) -> None:
    if not torch.cuda.is_available():
        raise SamplingPathError(f"the {path} sampling path needs a CUDA device", "path")


if torch.cuda.is_available():  # pragma: no cover - GPU machines only
    SAMPLING_PATHS.register("cuda")(cuda_path)
    SAMPLING_PATHS.register("cuda-torch")(cuda_torch_path)


def cpu_paths() -> list[str]:
    """The numba CPU paths, latency path first."""
    return ["inline", "parallel"]


def throughput_path() -> str:
    """The throughput path calibrated by default: ``cuda`` where torch sees a GPU, else
    ``parallel``."""
    return "cuda" if "cuda" in SAMPLING_PATHS.names() else "parallel"


def available_paths() -> list[str]:
    """Names of the paths registered on this machine (``cuda`` only where torch sees a GPU)."""
    return SAMPLING_PATHS.names()


def build_path(
    name: str,
    graph: GraphStore,
    fanouts: list[int],
    seed: int = 0,
    cost: np.ndarray | None = None,
) -> PathSampler:
    """The sampler of path ``name`` over ``graph`` (InvalidInputError for an unknown name,
    SamplingPathError for a path this machine cannot run)."""
    return SAMPLING_PATHS.create(name, graph, fanouts, seed, cost)


def path_for(expected_size: float, threshold: float, throughput: str = "parallel") -> str:
    """The path a ``NeighborSampler`` with ``parallel_threshold = threshold`` takes for a
    batch of summed PSGS ``expected_size``: inline below the threshold, its ``throughput``
    path from it on."""
    return "inline" if expected_size < threshold else throughput
