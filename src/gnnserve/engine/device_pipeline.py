"""Sample, gather and model on one device, one copy of the answers to the host (Quiver §4.2).

:class:`DeviceFeatures` keeps the hottest rows (e.g. a placement's ``gpu`` tier) in device
memory and the rest in pinned host memory; a gather takes the device rows in place and copies
only the host rows' share over. :class:`DevicePipeline` chains
:meth:`~gnnserve.sampling.cuda_sampler.CudaSampler.sample_on_device`, that gather and the
model's forward on the device: the sample never visits the host, and the only copy back is the
seeds' logits.

On a machine without a GPU the device is the CPU and the sampler's kernels run under numba's
CUDA simulator: the same code, which the tests compare with the host pipeline.
"""

from __future__ import annotations

from copy import deepcopy

import numpy as np
import torch

from gnnserve.features.base import FeatureStore
from gnnserve.graph.base import GraphStore
from gnnserve.models.zoo import GNN
from gnnserve.sampling.cuda_memory import use_torch_allocator
from gnnserve.sampling.cuda_sampler import CudaSampler, DeviceSample


class DeviceFeatures:
    """Feature rows split between device memory (``hot`` nodes) and pinned host memory."""

    def __init__(self, features: FeatureStore, hot: np.ndarray, device: torch.device) -> None:
        n = features.num_nodes
        self.device = device
        hot = np.unique(np.asarray(hot, dtype=np.int64))
        slot = np.full(n, -1, dtype=np.int64)
        slot[hot] = np.arange(hot.size)
        cold = np.flatnonzero(slot < 0)
        slot[cold] = -1 - np.arange(cold.size)  # host rows as -1 - index
        self._slot = torch.from_numpy(slot).to(device)
        self._hot_rows = features.get_valid(hot).to(device)
        host = features.get_valid(cold)
        self._cold_rows = host.pin_memory() if device.type == "cuda" else host
        self.hot_count, self.dim = int(hot.size), features.dim

    def gather(self, ids: torch.Tensor) -> torch.Tensor:
        """float32 [len(ids), F] rows of ``ids`` (a tensor on the device), on the device."""
        slot = self._slot.index_select(0, ids)
        out = torch.empty((ids.numel(), self.dim), dtype=torch.float32, device=self.device)
        on_device = slot >= 0
        out[on_device] = self._hot_rows.index_select(0, slot[on_device])
        if self.hot_count < self._slot.numel():
            wanted = (-1 - slot[~on_device]).cpu()
            rows = self._cold_rows.index_select(0, wanted)
            out[~on_device] = rows.to(self.device, non_blocking=True)
        return out


class DevicePipeline:
    """One batch of existing nodes through sample, gather and model, all on ``device``; each
    stage is its own method so that a served pipeline runs them in its stage threads."""

    def __init__(
        self,
        model: GNN,
        graph: GraphStore,
        features: DeviceFeatures,
        fanouts: list[int],
        seed: int = 0,
    ) -> None:
        self.device = features.device
        use_torch_allocator()  # before the sampler's arrays create numba's CUDA context
        self.model = self.place(model)
        self.sampler = CudaSampler(graph, fanouts, seed)
        self.features = features
        degree = torch.from_numpy(graph.gcn_degree(np.arange(graph.num_nodes)))
        self._in_degree = degree.to(self.device)

    def place(self, model: GNN) -> GNN:
        """``model`` on this device, for inference (a GPU copy; the model itself on the CPU)."""
        copy = model if self.device.type == "cpu" else deepcopy(model)
        return copy.to(self.device).eval()

    def sample(self, seeds: np.ndarray, rng_seed: int | None = None) -> DeviceSample:
        """The sample of validated ``seeds`` in device memory (draws as the CPU samplers')."""
        return self.sampler.sample_on_device(seeds, rng_seed)

    def gather(self, sample: DeviceSample) -> tuple[torch.Tensor, torch.Tensor]:
        """(features, full-graph in-degrees) of the sample's input nodes, on the device."""
        ids = sample.nodes[: sample.blocks[0].n_src].to(self.device)
        return self.features.gather(ids), self._in_degree.index_select(0, ids)

    @torch.inference_mode()
    def forward(
        self, model: GNN, sample: DeviceSample, x: torch.Tensor, degree: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(logits, embedding) of the requested seeds, rows in request order, on the host:
        the only copy back. ``model`` is on this device (:meth:`place`)."""
        logits, embedding = model.forward_blocks(x, sample.blocks, degree)
        rows = sample.seed_rows.to(self.device)
        return logits.index_select(0, rows).cpu(), embedding.index_select(0, rows).cpu()

    def predict(
        self, seeds: np.ndarray, rng_seed: int | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(logits, embedding) on the host for every requested seed (rows in ``seeds`` order,
        repeats included); ``seeds`` validated node ids."""
        sample = self.sample(seeds, rng_seed)
        x, degree = self.gather(sample)
        return self.forward(self.model, sample, x, degree)
