"""The served device path (``compute.device: cuda``): routed batches on the GPU (Quiver §4.2).

A batch that the planner routes to its throughput path (summed PSGS at or past the routing
point, default fanouts) runs in the local executor's stage threads as three device steps of
:class:`~gnnserve.engine.device_pipeline.DevicePipeline`: the sample stage draws it with the
numba-cuda sampler (same draws as the CPU samplers for the same key), the fetch stage gathers
its feature rows and degrees on the GPU, the compute stage runs a GPU copy of the served model
and copies the seeds' answers back, the only copy to the host. Inline batches stay on the CPU,
where a small batch is faster than a kernel launch. ``/metrics`` counts these batches under
the sampling path ``cuda``.

Feature rows go to GPU memory while they fit in half of what is free (highest in-degree
first); the rest stay in pinned host memory and are copied per batch. Without a GPU the
path runs under numba's CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``, tests) with CPU tensors.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from gnnserve.engine.device_pipeline import DeviceFeatures, DevicePipeline
from gnnserve.errors import InvalidInputError
from gnnserve.sampling.cuda_kernels import SIMULATED
from gnnserve.sampling.cuda_sampler import DeviceSample

if TYPE_CHECKING:
    from gnnserve.config import ServeConfig
    from gnnserve.engine.batcher import Batch
    from gnnserve.engine.executor import ExecutionContext
    from gnnserve.features.base import FeatureStore
    from gnnserve.graph.base import GraphStore
    from gnnserve.models.runner import ModelRunner
    from gnnserve.models.zoo import GNN

DEVICE_PATH = "cuda"  # the sampling path name of a device batch (metrics, Batch.path)
GPU_SHARE = 0.5  # of the GPU memory free at start-up, what feature rows may take
WARM_UP_SEEDS = 4


def device_available() -> bool:
    """Whether ``compute.device: cuda`` can run here: torch sees a GPU, or numba's CUDA
    simulator stands in for one (tests)."""
    return SIMULATED or torch.cuda.is_available()


def check_device(config: ServeConfig) -> None:
    """Refuse ``compute.device: cuda`` where it cannot serve (InvalidInputError naming
    ``compute.device`` and why), before anything is loaded."""
    if config.compute.device != DEVICE_PATH:
        return
    why = None
    if config.deploy.mode != "local":
        why = (
            f"deploy mode {config.deploy.mode!r} samples outside this process; the device path "
            "runs in the local executor (--deploy local)"
        )
    elif config.store.update_log:
        why = (
            "the GPU holds a copy of the adjacency that graph updates (--update-log) do not "
            "reach; serve a changing graph on the CPU"
        )
    elif config.sampler.presample:
        why = "--presample answers every default-fanout batch on the CPU: no batch would reach it"
    elif not device_available():
        why = (
            f"it needs a CUDA GPU and torch {torch.__version__} sees none "
            f"(CUDA build: {torch.version.cuda or 'none'}); serve on the CPU (--device cpu)"
        )
    if why is not None:
        raise InvalidInputError(f"--device cuda: {why}", "compute.device")


@dataclass
class DeviceBatch:
    """What the device steps of one batch produce, all in device memory."""

    sample: DeviceSample
    x: torch.Tensor | None = None  # feature rows of the input nodes (fetch stage)
    degree: torch.Tensor | None = None  # their full-graph in-degrees (fetch stage)


class DevicePath:
    """Routes a served engine's throughput batches through a :class:`DevicePipeline`."""

    def __init__(self, context: ExecutionContext) -> None:
        self.context = context
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        graph, features = context.graph, context.features
        rows = DeviceFeatures(features, rows_on_device(graph, features, device), device)
        fanouts = list(context.planner.default)
        self.pipeline = DevicePipeline(
            context.runner.model, graph, rows, fanouts, context.config.sampler.seed
        )
        self._placed: tuple[ModelRunner, GNN] = (context.runner, self.pipeline.model)
        self._lock = threading.Lock()

    def takes(self, batch: Batch) -> bool:
        """Whether ``batch`` runs here: default fanouts and routed past the inline path."""
        planner = self.context.planner
        if (batch.fanouts or planner.default) != planner.default:
            return False
        path = planner.path_of(batch.fanouts, batch.seeds, batch.rng_seed is not None)
        return path not in ("inline", "presample")

    def sample(self, batch: Batch) -> DeviceBatch:
        """Sample stage: the batch's draws in device memory (its own key when it has one)."""
        return DeviceBatch(self.pipeline.sample(batch.seeds, batch.rng_seed))

    def gather(self, work: DeviceBatch) -> None:
        """Fetch stage: feature rows and degrees of the sample's input nodes, on the device."""
        work.x, work.degree = self.pipeline.gather(work.sample)

    def forward(self, work: DeviceBatch, runner: ModelRunner) -> tuple[torch.Tensor, torch.Tensor]:
        """Compute stage: (logits, embedding) on the host, one row per requested seed in
        request order, from ``runner``'s model (copied to the device when it changed)."""
        assert work.x is not None and work.degree is not None
        return self.pipeline.forward(self._model_of(runner), work.sample, work.x, work.degree)

    def _model_of(self, runner: ModelRunner) -> GNN:
        with self._lock:
            if self._placed[0] is not runner:  # a new model version is served
                self._placed = (runner, self.pipeline.place(runner.model))
            return self._placed[1]

    def warm_up(self) -> None:
        """One small batch through every step: numba-cuda compiles its kernels, torch and
        cuBLAS initialise, before the first request pays for it."""
        seeds = np.arange(min(WARM_UP_SEEDS, self.context.graph.num_nodes), dtype=np.int64)
        self.pipeline.predict(seeds)

    def describe(self) -> dict[str, object]:
        """Where the rows live, for health answers and ``/metrics``."""
        rows = self.pipeline.features
        return {"device": str(rows.device), "device_feature_rows": rows.hot_count}


def rows_on_device(graph: GraphStore, features: FeatureStore, device: torch.device) -> np.ndarray:
    """Node ids whose feature rows go to device memory: every row when they fit in
    :data:`GPU_SHARE` of the free memory, else the highest in-degree rows that do."""
    n = graph.num_nodes
    if device.type != "cuda":
        return np.arange(n, dtype=np.int64)
    free, _total = torch.cuda.mem_get_info(device)
    fit = int(free * GPU_SHARE) // max(features.dim * 4, 1)
    if fit >= n:
        return np.arange(n, dtype=np.int64)
    degree = graph.gcn_degree(np.arange(n))
    return np.argsort(-degree, kind="stable")[:fit].astype(np.int64)
