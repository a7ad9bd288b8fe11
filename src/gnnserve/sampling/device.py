"""k-hop sampling in vectorised torch on a torch device: the GPU throughput path (Quiver §4.2).

:class:`DeviceSampler` holds the graph's adjacency on a device (CUDA on a GPU machine; on the
CPU it shares the graph's arrays) and draws each hop with whole-frontier tensor operations, no
per-node Python. Its draws are bit-identical to the numba kernels (:mod:`.kernels`): the same
counter-based splitmix64 keys (emulated in int64 arithmetic, which wraps like uint64) and the
same Floyd selection, so for one draw key it returns exactly the sample ``NeighborSampler``
returns. That equality is what the tests check, on the CPU everywhere and on CUDA where a GPU
is present.

Floyd's algorithm runs column by column over all sampled rows at once: at step ``j`` every row
draws ``t`` in ``[0, deg - k + j]`` and keeps ``deg - k + j`` instead when ``t`` is taken, so a
hop costs O(fanout^2) vector operations over the frontier, whatever its size.
"""

from __future__ import annotations

import queue
import warnings

import numpy as np
import torch

from gnnserve.errors import InvalidInputError
from gnnserve.fanouts import check_fanouts
from gnnserve.graph.base import GraphStore
from gnnserve.sampling.kernels import _GOLDEN, _MIX1, _MIX2
from gnnserve.sampling.sampler import (
    KeyStream,
    check_seeds,
    placed_adjacency,
    size_bound_per_seed,
)
from gnnserve.types import Block, SampledSubgraph


def _signed(value: np.uint64 | int) -> int:
    """The int64 with the bits of the uint64 ``value``."""
    v = int(value) & 0xFFFFFFFFFFFFFFFF
    return v - (1 << 64) if v >= 1 << 63 else v


GOLDEN, MIX1, MIX2 = _signed(_GOLDEN), _signed(_MIX1), _signed(_MIX2)
_LOW32 = 0xFFFFFFFF


def _shift_right(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Logical right shift of int64 bits (torch's ``>>`` is arithmetic)."""
    return (x >> bits) & ((1 << (64 - bits)) - 1)


def mix(z: torch.Tensor) -> torch.Tensor:
    """splitmix64's finaliser on int64 tensors: the bits of ``kernels._mix`` on uint64."""
    z = (z ^ _shift_right(z, 30)) * MIX1
    z = (z ^ _shift_right(z, 27)) * MIX2
    return z ^ _shift_right(z, 31)


def row_keys(seed: int, hop: int, nodes: torch.Tensor) -> torch.Tensor:
    """``kernels.row_key(seed, hop, v)`` for every ``v`` in ``nodes`` (int64 tensor)."""
    return mix(mix(nodes * GOLDEN + (hop + 1)) ^ _signed(seed))


def unsigned_mod(x: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """``uint64(x) % m`` for int64 ``x`` read as unsigned and 0 < m < 2^31 (int64 tensors)."""
    high, low = _shift_right(x, 32), x & _LOW32
    return ((high % m) * (4294967296 % m) + low % m) % m


def floyd_positions(keys: torch.Tensor, degree: torch.Tensor, k: int) -> torch.Tensor:
    """[rows, k] distinct positions in ``[0, degree)`` per row (every degree > k), drawn as
    ``kernels._draw_row`` draws them from each row's ``keys``."""
    chosen = torch.empty((keys.numel(), k), dtype=torch.int64, device=keys.device)
    state = keys
    for filled in range(k):
        state = state + GOLDEN
        j = degree - k + filled
        t = unsigned_mod(mix(state), j + 1)
        taken = (chosen[:, :filled] == t[:, None]).any(dim=1)
        chosen[:, filled] = torch.where(taken, j, t)
    return chosen


def first_seen_unique(ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(distinct ids in order of first occurrence, each entry's index into them)."""
    uniq, inverse = torch.unique(ids, return_inverse=True)
    positions = torch.arange(ids.numel(), device=ids.device)
    first = torch.full((uniq.numel(),), ids.numel(), dtype=torch.int64, device=ids.device)
    first.scatter_reduce_(0, inverse, positions, reduce="amin")
    order = torch.argsort(first)
    rank = torch.empty_like(order)
    rank[order] = torch.arange(order.numel(), device=ids.device)
    return uniq[order], rank[inverse]


def _on_device(array: np.ndarray, device: torch.device) -> torch.Tensor:
    """int64 ``array`` on ``device``; on the CPU it shares the (possibly read-only, memory-mapped)
    array when it is int64 already, which the sampler only reads."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "The given NumPy array is not writable")
        return torch.as_tensor(np.asarray(array, np.int64), device=device)


class DeviceSampler:
    """Uniform k-hop sampling without replacement, in torch on ``device`` (see the module doc).

    Same contract and same samples as ``NeighborSampler``: ``fanouts[0]`` nearest the seeds,
    -1 takes every neighbour, every hop samples the neighbours of all nodes reached so far,
    blocks input layer first. Results come back on the CPU (the carriers are host arrays).
    Thread-safe: each call borrows its own id map. Needs a graph that does not change.
    """

    def __init__(
        self,
        graph: GraphStore,
        fanouts: list[int],
        seed: int = 0,
        cost: np.ndarray | None = None,
        device: str | torch.device = "cpu",
    ) -> None:
        if graph.mutable or not graph.local:
            raise InvalidInputError(
                "device sampling needs a local graph that does not change "
                "(its adjacency is copied to the device once)",
                "graph",
            )
        self.device = torch.device(device)
        self.fanouts = check_fanouts(fanouts)
        self.seed = int(seed)
        self.cost = cost  # PSGS per node, or None: a fanout bound
        self.num_nodes, self._row_start, self._degree, self._indices = placed_adjacency(
            graph, lambda a: _on_device(a, self.device)
        )
        self._size_bound_per_seed = size_bound_per_seed(self.fanouts)
        self._maps: queue.SimpleQueue[torch.Tensor] = queue.SimpleQueue()
        self._graph = graph
        self._keys = KeyStream(self.seed)

    def expected_size(self, seeds: np.ndarray) -> float:
        """Expected sampled nodes for ``seeds``: PSGS sum when known, else a fanout bound."""
        if self.cost is not None:
            return float(self.cost[seeds].sum())
        return seeds.size * self._size_bound_per_seed

    def sample(self, seeds: np.ndarray, rng_seed: int | None = None) -> SampledSubgraph:
        """The computation graph of ``seeds`` (checked: InvalidInputError naming them)."""
        return self.sample_valid(check_seeds(self._graph, seeds), rng_seed)

    def sample_valid(self, seeds: np.ndarray, rng_seed: int | None = None) -> SampledSubgraph:
        """:meth:`sample` for validated seeds. ``rng_seed`` fixes the draws exactly as it does
        for ``NeighborSampler.sample``; by default each call draws from the next key."""
        key = int(self._keys.key(rng_seed))
        local_id = self._borrow_map()
        try:
            return self._sample(torch.as_tensor(seeds, device=self.device), key, local_id)
        except BaseException:
            local_id.fill_(-1)  # a half-built sample may have left ids in the map
            raise
        finally:
            self._maps.put(local_id)

    def _borrow_map(self) -> torch.Tensor:
        try:
            return self._maps.get_nowait()
        except queue.Empty:
            return torch.full((self.num_nodes,), -1, dtype=torch.int64, device=self.device)

    def _sample(self, seeds: torch.Tensor, key: int, local_id: torch.Tensor) -> SampledSubgraph:
        nodes, seed_rows = first_seen_unique(seeds)
        num_seeds = nodes.numel()
        local_id[nodes] = torch.arange(num_seeds, device=self.device)
        blocks: list[Block] = []
        for hop, fanout in enumerate(self.fanouts):
            src, dst = self._draw_hop(nodes, fanout, key, hop)
            n_dst = nodes.numel()
            nodes = self._relabel(src, nodes, local_id)
            edges = torch.stack([local_id[src], dst]).cpu()
            blocks.append(Block(edges, n_src=nodes.numel(), n_dst=n_dst))
        local_id[nodes] = -1
        blocks.reverse()
        return SampledSubgraph(
            nodes=nodes.cpu().numpy(),
            blocks=blocks,
            num_seeds=num_seeds,
            seed_rows=seed_rows.cpu().numpy(),
        )

    def _draw_hop(
        self, frontier: torch.Tensor, fanout: int, key: int, hop: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(global source, local destination) of every edge drawn for ``frontier`` at ``hop``,
        laid out as ``kernels.draw_serial`` lays them out."""
        degree = self._degree[frontier]
        counts = degree if fanout < 0 else torch.clamp(degree, max=fanout)
        offsets = torch.cumsum(counts, 0) - counts
        total = int(counts.sum())
        position = torch.empty(total, dtype=torch.int64, device=self.device)
        whole = counts == degree  # rows that take every neighbour, in order
        rows = torch.nonzero(whole).flatten()
        if rows.numel():
            n = counts[rows]
            row_of = torch.repeat_interleave(torch.arange(rows.numel(), device=self.device), n)
            within = (
                torch.arange(row_of.numel(), device=self.device) - (torch.cumsum(n, 0) - n)[row_of]
            )
            position[offsets[rows][row_of] + within] = within
        rows = torch.nonzero(~whole).flatten()
        if rows.numel():
            keys = row_keys(key, hop, frontier[rows])
            chosen = floyd_positions(keys, degree[rows], fanout)
            slots = offsets[rows][:, None] + torch.arange(fanout, device=self.device)
            position[slots.flatten()] = chosen.flatten()
        dst = torch.repeat_interleave(torch.arange(frontier.numel(), device=self.device), counts)
        src = self._indices[self._row_start[frontier][dst] + position]
        return src, dst

    def _relabel(
        self, src: torch.Tensor, nodes: torch.Tensor, local_id: torch.Tensor
    ) -> torch.Tensor:
        """``nodes`` with ``src``'s unseen ids appended in order of first occurrence (the order
        ``kernels.relabel`` gives them), ``local_id`` updated for them."""
        unseen = src[local_id[src] < 0]
        if unseen.numel() == 0:
            return nodes
        fresh, _ = first_seen_unique(unseen)
        local_id[fresh] = torch.arange(
            nodes.numel(), nodes.numel() + fresh.numel(), device=self.device
        )
        return torch.cat([nodes, fresh])
