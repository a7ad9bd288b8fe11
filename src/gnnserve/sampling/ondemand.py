"""On-demand k-hop sampling from a remote CSR, hop by hop (FaaS-GNN §4.2).

Each hop fetches the rows of the frontier vertices not expanded yet (row-index pairs, then
column-index segments, adjacent ranges merged, one hop's requests issued together), draws the
hop's neighbours and moves the frontier. Vertices already expanded are never fetched again.
After the last hop only the row-index pairs of the newly reached vertices are read (their
degrees, for GCN normalisation and the feature cache). The draws are the same counter-based ones
as :class:`~gnnserve.sampling.sampler.NeighborSampler`: with the same key the sample is
identical to sampling the whole graph locally.
"""

from __future__ import annotations

import queue
from dataclasses import dataclass, field

import numpy as np
import torch

from gnnserve.errors import InvalidInputError
from gnnserve.fanouts import check_fanouts
from gnnserve.graph.remote import Fetched, RemoteCSR, count_self_loops
from gnnserve.sampling import kernels
from gnnserve.sampling.sampler import KeyStream
from gnnserve.types import Block, SampledSubgraph


@dataclass
class HopFetch:
    """What one hop read from the remote store."""

    expanded: int  # vertices whose rows were fetched
    requests: int  # range requests
    bytes_read: int  # payload bytes


@dataclass
class FetchedSample:
    """A sample and what fetching it cost."""

    subgraph: SampledSubgraph  # blocks with local ids, as the local sampler returns them
    degree: np.ndarray  # int64 [len(subgraph.nodes)] full-graph in-degree of every node
    hops: list[HopFetch] = field(default_factory=list)  # one per hop, then the degree round
    loops: np.ndarray | None = None  # int64 self loops per node, when counted from its row

    @property
    def requests(self) -> int:
        """Range requests issued for the whole sample."""
        return sum(h.requests for h in self.hops)

    @property
    def bytes_read(self) -> int:
        """Bytes read for the whole sample."""
        return sum(h.bytes_read for h in self.hops)


class _Rows:
    """The fetched adjacency of the first ``count`` sampled nodes, grown hop by hop."""

    def __init__(self) -> None:
        self.count = 0
        self.degree = np.empty(0, dtype=np.int64)
        self.row_start = np.empty(0, dtype=np.int64)
        self.indices = np.empty(0, dtype=np.int64)

    def add(self, degree: np.ndarray, row_start: np.ndarray, indices: np.ndarray) -> None:
        self.row_start = np.concatenate([self.row_start, row_start + self.indices.size])
        self.degree = np.concatenate([self.degree, degree])
        self.indices = np.concatenate([self.indices, indices])
        self.count += degree.size


class OnDemandSampler:
    """Uniform k-hop sampling without replacement over a :class:`RemoteCSR`.

    ``fanouts[0]`` is the hop nearest the seeds, -1 takes every neighbour; blocks as
    ``NeighborSampler`` builds them. Thread-safe: each call borrows its own scratch map (int32
    per vertex of the graph, reused across calls).
    """

    def __init__(self, remote: RemoteCSR, fanouts: list[int], seed: int = 0) -> None:
        self.remote = remote
        self.fanouts = check_fanouts(fanouts)
        self.seed = int(seed)
        self._scratch: queue.SimpleQueue[np.ndarray] = queue.SimpleQueue()
        self._keys = KeyStream(self.seed)

    def sample(self, seeds: np.ndarray, rng_seed: int | None = None) -> FetchedSample:
        """Sample the computation graph of ``seeds`` (int64 ids, duplicates allowed), fetching
        what it needs; ``rng_seed`` fixes the draws as in ``NeighborSampler.sample``."""
        seeds = np.asarray(seeds, dtype=np.int64).ravel()
        if seeds.size == 0:
            raise InvalidInputError("seeds must not be empty", "seeds")
        n = self.remote.num_nodes
        if int(seeds.min()) < 0 or int(seeds.max()) >= n:
            raise InvalidInputError(f"seeds must be node ids in [0, {n})", "seeds")
        key = self._keys.key(rng_seed)
        local_id = self._borrow_map()
        try:
            return self._sample(seeds, key, local_id)
        finally:
            self._scratch.put(local_id)

    def _borrow_map(self) -> np.ndarray:
        try:
            return self._scratch.get_nowait()
        except queue.Empty:
            return np.full(self.remote.num_nodes, -1, dtype=np.int32)

    def _sample(self, seeds: np.ndarray, key: np.uint64, local_id: np.ndarray) -> FetchedSample:
        nodes = np.empty(seeds.size, dtype=np.int64)
        n_nodes = 0
        rows, hops, blocks = _Rows(), [], []
        try:
            n_nodes, seed_rows = kernels.unique_seeds(seeds, nodes, local_id)
            num_seeds = n_nodes
            for hop, fanout in enumerate(self.fanouts):
                hops.append(self._expand(rows, nodes[rows.count : n_nodes]))
                frontier = nodes[:n_nodes]
                counts = rows.degree if fanout < 0 else np.minimum(rows.degree, fanout)
                offsets = np.zeros(n_nodes + 1, dtype=np.int64)
                np.cumsum(counts, out=offsets[1:])
                edges = np.empty((2, int(offsets[-1])), dtype=np.int64)
                kernels.draw_fetched(
                    rows.row_start, rows.degree, rows.indices, frontier, offsets, key, hop, edges
                )
                if nodes.size < n_nodes + edges.shape[1]:
                    grow = n_nodes + edges.shape[1] - nodes.size
                    nodes = np.concatenate([nodes, np.empty(grow, np.int64)])
                n_dst = n_nodes
                n_nodes = kernels.relabel(edges, nodes, n_nodes, local_id)
                blocks.append(Block(torch.from_numpy(edges), n_src=n_nodes, n_dst=n_dst))
            outer = nodes[rows.count : n_nodes]
            if self.remote.self_loops is None:  # no loop table: whole rows give exact degrees
                hops.append(self._expand(rows, outer))
                degree = rows.degree
            else:
                _, outer_degree, requests, nbytes = self.remote.fetch_degrees(outer)
                hops.append(HopFetch(0, requests, nbytes))
                degree = np.concatenate([rows.degree, outer_degree])
        finally:
            kernels.reset_map(local_id, nodes, n_nodes)
        blocks.reverse()
        subgraph = SampledSubgraph(nodes[:n_nodes].copy(), blocks, num_seeds, seed_rows)
        return FetchedSample(subgraph, degree, hops, self._loops(rows, subgraph.nodes))

    def _loops(self, rows: _Rows, nodes: np.ndarray) -> np.ndarray | None:
        """Self loops per node, counted in the fetched rows (all rows are fetched when the
        store has no loop table); None when the table answers instead."""
        if self.remote.self_loops is not None:
            return None
        return count_self_loops(nodes, Fetched(rows.degree, rows.row_start, rows.indices, 0, 0))

    def _expand(self, rows: _Rows, new: np.ndarray) -> HopFetch:
        """Fetch the rows of ``new`` (the nodes after the first ``rows.count``) into ``rows``."""
        fetched = self.remote.fetch_rows(new)
        rows.add(fetched.degree, fetched.row_start, fetched.indices)
        return HopFetch(int(new.size), fetched.requests, fetched.bytes_read)
