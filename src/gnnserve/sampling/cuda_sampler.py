"""k-hop sampling in numba-cuda kernels: the GPU throughput path that stays on the GPU.

:class:`CudaSampler` keeps the adjacency in GPU memory and builds a sample with a few kernel
launches per hop (:mod:`.cuda_kernels`: counts scanned, draw, then a relabel of mark, flags
scanned, assign and to-local), whatever the batch size; the host only reads two scalars per
hop to size the next arrays. Its draws are bit-identical to the numba CPU samplers for the
same draw key.

:meth:`CudaSampler.sample_on_device` returns the sample as torch tensors in GPU memory (zero-copy
through ``__cuda_array_interface__``) for a pipeline that gathers features and runs the model
there; :meth:`CudaSampler.sample_valid` copies it to the host carriers once, at the end.

Without a GPU the same kernels run under numba's CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``,
slow: tests only); there the device tensors are host tensors.
"""

from __future__ import annotations

import queue
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from numba import cuda

from gnnserve.fanouts import check_fanouts
from gnnserve.graph.base import GraphStore
from gnnserve.sampling import cuda_kernels as kern
from gnnserve.sampling.sampler import (
    KeyStream,
    check_seeds,
    placed_adjacency,
    size_bound_per_seed,
)
from gnnserve.types import Block, SampledSubgraph

DeviceArray = Any  # a numba device array (numba.cuda.cudadrv.devicearray.DeviceNDArray)


def as_torch(array: DeviceArray) -> torch.Tensor:
    """``array`` as a torch tensor on the GPU without a copy (a host copy under the simulator)."""
    if kern.SIMULATED:
        return torch.from_numpy(array.copy_to_host())
    return torch.as_tensor(array, device="cuda")


def _last(array: DeviceArray) -> int:
    """The last entry of a non-empty device array, read to the host."""
    return int(array[array.shape[0] - 1 :].copy_to_host()[0])


@dataclass(frozen=True)
class DeviceSample:
    """A sample in GPU memory: what :class:`~gnnserve.types.SampledSubgraph` holds, as tensors
    on the device (blocks input layer first), plus the kernel launches it took."""

    nodes: torch.Tensor  # int64 [n_nodes] global ids, seeds first
    blocks: list[Block]  # edge_index on the device
    num_seeds: int
    seed_rows: torch.Tensor  # int64 [len(requested seeds)]
    launches: int  # kernel launches this sample took

    def to_host(self) -> SampledSubgraph:
        """The host carrier (one copy of each array)."""
        blocks = [Block(b.edge_index.cpu(), b.n_src, b.n_dst) for b in self.blocks]
        return SampledSubgraph(
            self.nodes.cpu().numpy(), blocks, self.num_seeds, self.seed_rows.cpu().numpy()
        )


class _Scratch:
    """Per-call device maps over every node: local id (-1 unseen), first edge, node list."""

    def __init__(self, num_nodes: int) -> None:
        self.local_id = cuda.to_device(np.full(num_nodes, -1, dtype=np.int64))
        self.first = cuda.to_device(np.full(num_nodes, kern.UNSEEN_EDGE, dtype=np.int64))
        self.nodes = cuda.device_array(num_nodes, dtype=np.int64)


class _Launches:
    """Launches the element-wise kernels over ``n`` items and counts every launch."""

    def __init__(self) -> None:
        self.count = 0

    def run(self, kernel, n: int, *args) -> None:  # type: ignore[no-untyped-def]
        if n > 0:
            kernel[(n + kern.THREADS - 1) // kern.THREADS, kern.THREADS](*args)
            self.count += 1

    def inclusive_scan(self, values: DeviceArray):  # type: ignore[no-untyped-def]
        """The inclusive prefix sums of a non-empty int64 device array."""
        return self.scan(kern.scan_blocks, values.shape[0], values)

    def scan(self, kernel, n: int, *inputs):  # type: ignore[no-untyped-def]
        """The inclusive prefix sums of the ``n`` values that ``kernel`` (one of the scan
        kernels: ``inputs`` then ``out, block_sums``) produces, n > 0."""
        blocks = (n + kern.SCAN_BLOCK - 1) // kern.SCAN_BLOCK
        out = cuda.device_array(n, dtype=np.int64)
        sums = cuda.device_array(blocks, dtype=np.int64)
        kernel[blocks, kern.SCAN_BLOCK](*inputs, out, sums)
        self.count += 1
        if blocks > 1:
            self.run(kern.add_block_offsets, n, out, self.inclusive_scan(sums))
        return out


class CudaSampler:
    """Uniform k-hop sampling without replacement in numba-cuda kernels (see the module doc).

    Same contract and same samples as ``NeighborSampler``. Thread-safe: each call borrows its own
    scratch maps (3 x 8 bytes per node of GPU memory each). Needs a graph that does not change.
    """

    def __init__(
        self, graph: GraphStore, fanouts: list[int], seed: int = 0, cost: np.ndarray | None = None
    ) -> None:
        self.fanouts = check_fanouts(fanouts)
        self.seed = int(seed)
        self.cost = cost  # PSGS per node, or None: a fanout bound
        self.num_nodes, self._row_start, self._degree, self._indices = placed_adjacency(
            graph, lambda a: cuda.to_device(np.ascontiguousarray(a, dtype=np.int64))
        )
        self._graph = graph
        self._keys = KeyStream(self.seed)
        self._scratch: queue.SimpleQueue[_Scratch] = queue.SimpleQueue()
        self._size_bound_per_seed = size_bound_per_seed(self.fanouts)

    def expected_size(self, seeds: np.ndarray) -> float:
        """Expected sampled nodes for ``seeds``: PSGS sum when known, else a fanout bound."""
        if self.cost is not None:
            return float(self.cost[seeds].sum())
        return seeds.size * self._size_bound_per_seed

    def sample(self, seeds: np.ndarray) -> SampledSubgraph:
        """The computation graph of ``seeds`` (checked: InvalidInputError naming them)."""
        return self.sample_valid(check_seeds(self._graph, seeds))

    def sample_valid(self, seeds: np.ndarray, rng_seed: int | None = None) -> SampledSubgraph:
        """:meth:`sample_on_device` copied to the host carriers."""
        return self.sample_on_device(seeds, rng_seed).to_host()

    def sample_on_device(self, seeds: np.ndarray, rng_seed: int | None = None) -> DeviceSample:
        """The sample of validated ``seeds`` in GPU memory; ``rng_seed`` fixes the draws as it
        does for ``NeighborSampler.sample`` (by default each call draws from the next key)."""
        key = np.uint64(self._keys.key(rng_seed))
        try:
            scratch = self._scratch.get_nowait()
        except queue.Empty:
            scratch = _Scratch(self.num_nodes)
        try:
            return self._sample(np.ascontiguousarray(seeds, dtype=np.int64), key, scratch)
        except BaseException:
            scratch = _Scratch(self.num_nodes)  # a half-built sample may have left marks
            raise
        finally:
            self._scratch.put(scratch)

    def _sample(self, seeds: np.ndarray, key: np.uint64, scratch: _Scratch) -> DeviceSample:
        launches = _Launches()
        seeds_d = cuda.to_device(seeds)
        n_nodes = self._number_unseen(launches, seeds_d, 0, scratch)
        seed_rows = cuda.device_array(seeds.size, dtype=np.int64)
        launches.run(kern.to_local, seeds.size, seeds_d, scratch.local_id, seed_rows)
        num_seeds = n_nodes
        blocks: list[Block] = []
        for hop, fanout in enumerate(self.fanouts):
            edges = self._draw_hop(launches, scratch.nodes[:n_nodes], fanout, key, hop)
            sources = edges[0]
            added = self._number_unseen(launches, sources, n_nodes, scratch)
            launches.run(kern.to_local, sources.shape[0], sources, scratch.local_id, sources)
            blocks.append(Block(as_torch(edges), n_src=n_nodes + added, n_dst=n_nodes))
            n_nodes += added
        nodes = as_torch(_copy(scratch.nodes[:n_nodes]))
        launches.run(kern.forget, n_nodes, scratch.nodes, n_nodes, scratch.local_id)
        blocks.reverse()
        return DeviceSample(nodes, blocks, num_seeds, as_torch(seed_rows), launches.count)

    def _draw_hop(self, launches: _Launches, frontier, fanout: int, key: np.uint64, hop: int):  # type: ignore[no-untyped-def]
        """[2, E] device array of (global source, local destination) drawn for ``frontier``."""
        n = frontier.shape[0]
        ends = launches.scan(kern.scan_counts, n, self._degree, frontier, fanout)
        edges = cuda.device_array((2, _last(ends)), dtype=np.int64)
        launches.run(
            kern.draw, n, self._row_start, self._degree, self._indices, frontier, ends, key, hop,
            edges,
        )  # fmt: skip
        return edges

    def _number_unseen(self, launches: _Launches, sources, n_nodes: int, scratch: _Scratch) -> int:  # type: ignore[no-untyped-def]
        """Append the unnumbered ids of ``sources`` to ``scratch.nodes`` from ``n_nodes`` on, in
        order of first occurrence, numbering them there; returns how many were added."""
        n = sources.shape[0]
        if n == 0:
            return 0
        launches.run(kern.mark_first, n, sources, scratch.local_id, scratch.first)
        ranks = launches.scan(kern.scan_first_flags, n, sources, scratch.local_id, scratch.first)
        launches.run(
            kern.assign, n, sources, ranks, n_nodes, scratch.local_id, scratch.first, scratch.nodes
        )
        return _last(ranks)


def _copy(array):  # type: ignore[no-untyped-def]
    """A device copy of a device array (the scratch node list is reused by the next call)."""
    out = cuda.device_array(array.shape, dtype=array.dtype)
    out.copy_to_device(array)
    return out
