"""k-hop neighbour sampler producing layered blocks with relabelled local ids."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Protocol, TypeVar

import numpy as np
import torch

from gnnserve.errors import InvalidInputError
from gnnserve.fanouts import check_fanouts
from gnnserve.graph.base import GraphStore
from gnnserve.sampling import kernels
from gnnserve.types import Block, SampledSubgraph

T = TypeVar("T")

# Expected sampled nodes of a batch (summed PSGS, or the fanout bound) from which it goes on the
# throughput path (hop by hop) instead of the one-call inline kernel: the routing unit. 8,192:
# where the two paths cost the same on fb100, R-MAT 2^20 and soc-epinions1 (2 cores, [25, 10],
# PSGS-costed batches of 16 to 256 seeds); 65,536 before left fb100's 64-256 seeds 1.2-1.3x slower.
DEFAULT_PARALLEL_THRESHOLD = 8192
# Edges one hop draws from which the throughput path draws them on every thread. Both points
# count drawn edges (PSGS = 1 + edges a seed draws): the routing one per batch, this one per
# hop of a batch already routed; calibration's ``parallel`` path uses it too (the served path).
# Waking the pool's threads costs ~18 us (OMP_WAIT_POLICY=PASSIVE); a hop of 2,048 edges takes
# ~50 us on one core.
PARALLEL_DRAW_EDGES = 2048


def to_subgraph(assembled: tuple, hops: int) -> SampledSubgraph:  # type: ignore[type-arg]
    """The ``SampledSubgraph`` of a one-call kernel result (``kernels.sample_inline`` or
    ``presample_kernels.assemble``): blocks sliced from its edges, input layer first."""
    nodes, seed_rows, num_seeds, edges, hop_off, sizes = assembled[:6]
    layer = sizes.tolist()
    blocks = [
        Block(torch.from_numpy(edges[:, hop_off[h] : hop_off[h + 1]]), layer[h + 1], layer[h])
        for h in range(hops - 1, -1, -1)
    ]
    return SampledSubgraph(nodes, blocks, int(num_seeds), seed_rows)


def seed_bits(seed: int) -> int:
    """The unsigned 64-bit value of a seed (two's complement for a negative one): the value a
    draw key or a generator is seeded with, so -1 and 2^64 - 1 draw the same."""
    return int(seed) & 0xFFFFFFFFFFFFFFFF


def call_key(seed: int, call: int) -> np.uint64:
    """The draw key of a sampler's ``call``-th sample: a distinct, reproducible stream per call
    (sampler seed x call counter)."""
    return np.uint64(seed_bits(seed * 0x9E3779B1 + call * 0x85EBCA77))


class KeyStream:
    """A sampler's draw keys: a given ``rng_seed`` fixes the key; otherwise each call takes the
    next of ``call_key(seed, 1), call_key(seed, 2), ...`` (thread-safe)."""

    def __init__(self, seed: int) -> None:
        self.seed = int(seed)
        self._calls = 0
        self._lock = threading.Lock()

    def key(self, rng_seed: int | None = None) -> np.uint64:
        """The key of one call."""
        if rng_seed is not None:
            return np.uint64(seed_bits(rng_seed))
        with self._lock:
            self._calls += 1
            call = self._calls
        return call_key(self.seed, call)


def placed_adjacency(graph: GraphStore, place: Callable[[np.ndarray], T]) -> tuple[int, T, T, T]:
    """(node count, row starts, degrees, indices) of ``graph``'s adjacency, each array passed
    through ``place`` (e.g. copied to a device) for a sampler that holds its own copy."""
    row_start, degree, indices = graph.adjacency()
    return int(degree.shape[0]), place(row_start), place(degree), place(indices)


def size_bound_per_seed(fanouts: list[int]) -> float:
    """Sampled nodes one seed can reach at most (a fanout of -1 counted as ~1000)."""
    # float: a product of large fanouts would wrap around in int64
    return float(np.cumprod([float(f) if f > 0 else 1000.0 for f in fanouts]).sum())


def check_seeds(graph: GraphStore, seeds: np.ndarray) -> np.ndarray:
    """``seeds`` as int64 node ids of ``graph``, at least one (InvalidInputError naming them)."""
    seeds = graph.check_nodes(seeds, "seeds")
    if seeds.size == 0:
        raise InvalidInputError("seeds must not be empty", "seeds")
    return seeds


class KeyedSampler(Protocol):
    """A sampler whose draws a key fixes (``sampling.device.DeviceSampler``)."""

    def sample_valid(self, seeds: np.ndarray, rng_seed: int | None = None) -> SampledSubgraph:
        """The computation graph of validated ``seeds`` drawn with key ``rng_seed``."""


class NeighborSampler:
    """Uniform k-hop sampling without replacement over a GraphStore.

    ``fanouts[0]`` is the hop nearest the seeds; -1 takes every neighbour. Every hop samples the
    neighbours of all nodes reached so far (DGL-style blocks), so block ``l``'s destinations are
    exactly block ``l+1``'s sources. Thread-safe: each call borrows its own scratch map.

    A batch whose expected size reaches ``parallel_threshold`` goes on the throughput path: hop by
    hop, each hop of at least ``parallel_draw_edges`` edges drawn by the parallel kernel, or
    ``throughput`` when set (a calibrated device path such as ``cuda``, which draws the same
    sample for the same key).
    """

    def __init__(
        self,
        graph: GraphStore,
        fanouts: list[int],
        seed: int = 0,
        parallel_threshold: int = DEFAULT_PARALLEL_THRESHOLD,
        cost: np.ndarray | None = None,
        throughput: KeyedSampler | None = None,
        parallel_draw_edges: int = PARALLEL_DRAW_EDGES,
    ) -> None:
        self.graph = graph
        self.parallel_draw_edges = int(parallel_draw_edges)
        self.throughput = throughput
        self.throughput_name = "parallel"  # the path ``throughput`` is (set with it)
        self.fanouts = check_fanouts(fanouts)
        self.seed = int(seed)
        self.parallel_threshold = int(parallel_threshold)
        self.cost = cost  # PSGS per node (sampling.metrics.psgs), or None: use a fanout bound
        self._fanout_array = np.asarray(self.fanouts, dtype=np.int64)
        self._size_bound_per_seed = size_bound_per_seed(self.fanouts)
        self._scratch: queue.SimpleQueue[np.ndarray] = queue.SimpleQueue()
        self._keys = KeyStream(self.seed)

    def _borrow_map(self) -> np.ndarray:
        n = self.graph.num_nodes  # grows on a dynamic graph: maps too small are dropped
        while True:
            try:
                local_id = self._scratch.get_nowait()
            except queue.Empty:
                size = n + n // 4  # headroom for node inserts
                return np.full(size, -1, dtype=np.int32 if size < 2**31 else np.int64)
            if local_id.size >= n:
                return local_id

    def sample(self, seeds: np.ndarray, rng_seed: int | None = None) -> SampledSubgraph:
        """Sample the computation graph of ``seeds`` (int64 ids, duplicates allowed).

        ``rng_seed`` fixes the draws (same seed -> same sample); by default each call draws anew
        from a stream determined by the sampler's seed. Checks ``seeds`` (InvalidInputError
        naming them), then :meth:`sample_valid`.
        """
        return self.sample_valid(check_seeds(self.graph, seeds), rng_seed)

    def sample_valid(self, seeds: np.ndarray, rng_seed: int | None = None) -> SampledSubgraph:
        """:meth:`sample` for seeds already validated (int64 ids of this graph, at least one:
        a batch of admitted requests), without checking them again."""
        key = self._keys.key(rng_seed)
        inline = self.expected_size(seeds) < self.parallel_threshold
        if not inline and self.throughput is not None:
            return self.throughput.sample_valid(seeds, int(key))
        local_id = self._borrow_map()
        if inline:
            try:
                return self._sample_inline(seeds, key, local_id)
            finally:
                self._scratch.put(local_id)
        return self._sample_by_hop(seeds, key, local_id)

    def path_of(self, seeds: np.ndarray) -> str:
        """The path :meth:`sample_valid` takes for ``seeds``: ``inline``, or the throughput
        path's name (``parallel``, or the device path set as ``throughput``)."""
        inline = self.expected_size(seeds) < self.parallel_threshold
        return "inline" if inline else self.throughput_name

    def expected_size(self, seeds: np.ndarray) -> float:
        """Expected sampled nodes for ``seeds``: PSGS sum when known, else a fanout bound.

        It picks the path, as in Quiver: small work runs inline (latency path), large work hop
        by hop with the parallel kernel (throughput path).
        """
        if self.cost is not None:
            return float(self.cost[seeds].sum())
        return seeds.size * self._size_bound_per_seed

    def _sample_inline(
        self, seeds: np.ndarray, key: np.uint64, local_id: np.ndarray
    ) -> SampledSubgraph:
        """Latency path: one serial numba call builds every hop."""
        row_start, degree, indices = self.graph.adjacency()
        out = kernels.sample_inline(
            row_start, degree, indices, seeds, self._fanout_array, key, local_id
        )
        return to_subgraph(out, len(self.fanouts))

    def _sample_by_hop(
        self, seeds: np.ndarray, key: np.uint64, local_id: np.ndarray
    ) -> SampledSubgraph:
        """Throughput path: hop by hop, large hops drawn by the parallel kernel."""
        row_start, degree, indices = self.graph.adjacency()
        nodes = np.empty(seeds.size, dtype=np.int64)
        n_nodes = 0
        try:
            n_nodes, seed_rows = kernels.unique_seeds(seeds, nodes, local_id)
            num_seeds = n_nodes
            blocks: list[Block] = []
            for hop, fanout in enumerate(self.fanouts):
                frontier = nodes[:n_nodes]
                offsets = kernels.hop_counts(degree, frontier, fanout)
                total = int(offsets[-1])
                edges = np.empty((2, total), dtype=np.int64)
                draw = (
                    kernels.draw_parallel
                    if total >= self.parallel_draw_edges
                    else kernels.draw_serial
                )
                draw(row_start, degree, indices, frontier, offsets, key, hop, edges)
                if nodes.size < n_nodes + total:
                    nodes = np.concatenate(
                        [nodes, np.empty(n_nodes + total - nodes.size, np.int64)]
                    )
                n_dst = n_nodes
                n_nodes = kernels.relabel(edges, nodes, n_nodes, local_id)
                blocks.append(Block(torch.from_numpy(edges), n_src=n_nodes, n_dst=n_dst))
        finally:
            kernels.reset_map(local_id, nodes, n_nodes)
            self._scratch.put(local_id)
        blocks.reverse()
        return SampledSubgraph(
            nodes=nodes[:n_nodes].copy(), blocks=blocks, num_seeds=num_seeds, seed_rows=seed_rows
        )
