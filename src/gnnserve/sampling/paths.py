"""Sampling paths as devices (Quiver §4.2): named ways to sample a batch, behind one interface.

- ``inline``: the latency path, one serial numba call builds every hop (``NeighborSampler`` whose
  parallel threshold no batch reaches);
- ``parallel``: the throughput path, hop by hop with the parallel numba kernel on every core
  (``NeighborSampler`` with threshold 1: every batch goes hop by hop, every non-empty hop is
  drawn in parallel);
- ``cuda``: registered only when torch sees a GPU. TODO: GPU sampling and GPU feature gather
  are not built yet; building this path raises :class:`SamplingPathError`, so a GPU machine
  never silently samples on the CPU under the name ``cuda``.

A served ``NeighborSampler`` chooses between the two CPU paths per batch: a batch whose summed
PSGS (expected sampled nodes) is below its ``parallel_threshold`` runs inline, the rest hop by
hop (:func:`path_for` states the rule). Calibration (``sampling.calibrate``) runs the same
batches through each path alone to measure where that threshold should be.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np
import torch

from gnnserve.errors import GnnServeError
from gnnserve.graph.base import GraphStore
from gnnserve.registry import Registry
from gnnserve.sampling.sampler import NeighborSampler
from gnnserve.types import SampledSubgraph

NEVER = 2**62  # a parallel threshold no batch's expected size reaches: always inline


class SamplingPathError(GnnServeError):
    """A sampling path that cannot run on this machine or is not built yet."""


class PathSampler(Protocol):
    """What every sampling path builds: seeds in, a SampledSubgraph out."""

    def sample(self, seeds: np.ndarray) -> SampledSubgraph:
        """The computation graph of ``seeds`` (checked)."""

    def sample_valid(self, seeds: np.ndarray) -> SampledSubgraph:
        """The same for seeds already validated (int64 ids of the graph, at least one)."""

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
    """All-core throughput path: hop by hop, each hop drawn by the parallel numba kernel."""
    return NeighborSampler(graph, fanouts, seed, parallel_threshold=1, cost=cost)


def _cuda_path(
    graph: GraphStore, fanouts: list[int], seed: int = 0, cost: np.ndarray | None = None
) -> PathSampler:
    """TODO (issue 13 part 1, GPU): CUDA sampling with GPU feature gather is not built."""
    raise SamplingPathError(
        "the cuda sampling path is not implemented yet (GPU sampling and feature gather); "
        f"use one of the CPU paths {cpu_paths()}",
        "path",
    )


if torch.cuda.is_available():  # pragma: no cover - GPU machines only
    SAMPLING_PATHS.register("cuda")(_cuda_path)


def cpu_paths() -> list[str]:
    """The CPU paths, latency path first."""
    return ["inline", "parallel"]


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


def path_for(expected_size: float, threshold: float) -> str:
    """The CPU path a ``NeighborSampler`` with ``parallel_threshold = threshold`` takes for a
    batch of summed PSGS ``expected_size``: inline below the threshold, parallel from it on."""
    return "inline" if expected_size < threshold else "parallel"
