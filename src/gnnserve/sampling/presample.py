"""DGS event-driven pre-sampling: per-vertex reservoirs kept current by graph updates.

A k-hop query (fanouts per hop, nearest hop first) decomposes into one-hop queries, one per
DISTINCT fanout value: hops with equal fanout share one reservoir per vertex (``hop_query`` maps
hop -> query). Each hop's draw is still uniform; a node reached at two such hops shows the same
neighbours in both blocks, as in DGS where one cached one-hop result serves every hop using it.
For every vertex v and query of fanout f, the reservoir holds min(f, deg(v)) of v's current
in-neighbour edge slots. Parallel edges are a multiset: each u -> v copy is its own slot, so u
may appear once per sampled copy (as ``NeighborSampler`` draws CSR positions).

Why the reservoir stays uniform. Claim: after any sequence of updates, R is a uniform random
min(f, d)-subset of the current slot set S (|S| = d), given that the update sequence does not
depend on R (the updates come from the outside world). By induction, assume it for S.
- Insert of slot s (d' = d + 1): if |R| < f, R = S and R + s = S + s. Otherwise Algorithm R: s
  enters with probability f/d' (the probability any one slot of a uniform f-subset of d' slots
  is in it) replacing a uniformly chosen member, which leaves a uniform (f-1)-subset of S; with
  probability 1 - f/d' R is unchanged, a uniform f-subset of S. Both mix to uniform over S + s.
- Delete of slot s: uniform subsets are exchangeable, so conditioned on s not in R, R is a
  uniform f-subset of S - s; conditioned on s in R, R - s is a uniform (k-1)-subset of S - s
  and adding a uniform slot of (S - s) - (R - s) makes it a uniform k-subset (or all of S - s
  when none is left, i.e. d - 1 < f). Either branch is uniform, so their mixture is. With
  parallel edges the store removes one of u's m + 1 copies; by exchangeability among those
  copies it is in R with probability copies_in_R / (m + 1), the coin ``resolve_delete`` tosses.
Sampling from reservoirs is deterministic between updates: two requests with no update in
between get the same sample (DGS semantics); fresh draws come only from updates.

Threading: concurrent ``sample`` calls are safe (read-only, own scratch map each); callers
serialise updates (``on_*``, ``apply_events``) against each other and against ``sample`` (the
dynamic store holds a readers-writer lock). ``neighbors_of`` must not raise: a failed batch is
left half applied.
"""

from __future__ import annotations

import queue
from collections.abc import Callable

import numpy as np
import torch

from gnnserve.data.validate import check_node_ids
from gnnserve.errors import InvalidInputError
from gnnserve.sampling import presample_kernels as pk
from gnnserve.types import Block, SampledSubgraph

NeighborsOf = Callable[[int], np.ndarray]  # v -> v's current in-neighbour ids (after the update)
INSERT, DELETE = pk.INSERT, pk.DELETE
CHANGE_COLUMNS = ("query", "vertex", "added", "removed")  # rows returned by the updates; -1 = none


def _check_fanouts(fanouts: list[int]) -> list[int]:
    """A non-empty list of positive ints (pre-sampling has no "all neighbours" -1)."""
    if not fanouts:
        raise InvalidInputError("fanouts must list at least one hop", "fanouts")
    for f in fanouts:
        if isinstance(f, bool) or int(f) != f or f <= 0:
            raise InvalidInputError(f"pre-sampling fanout {f!r} invalid: use ints > 0", "fanouts")
    return [int(f) for f in fanouts]


def _check_csr(indptr: np.ndarray, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Return (indptr int64, indices) after checking they form an N-node CSR."""
    indptr = np.asarray(indptr, dtype=np.int64)
    indices = np.asarray(indices)
    if indptr.ndim != 1 or indptr.size < 1 or indptr[0] != 0 or indptr[-1] != indices.size:
        raise InvalidInputError("indptr must be 1-D, start at 0 and end at len(indices)", "indptr")
    if np.any(np.diff(indptr) < 0):
        raise InvalidInputError("indptr must be non-decreasing", "indptr")
    check_node_ids(indices, indptr.size - 1, "indices")
    return indptr, indices


class PreSampler:
    """Reservoirs of the installed query ``fanouts`` over an in-neighbour CSR, kept current.

    Memory: one int64 table [N_cap, sum of distinct fanouts] (8 bytes per slot) plus int64
    counts [N_cap, queries] and degrees [N_cap]; capacity doubles when nodes are added. The
    degrees are tracked here from the events, so the store must report every change it applies.
    """

    def __init__(
        self, indptr: np.ndarray, indices: np.ndarray, fanouts: list[int], seed: int = 0
    ) -> None:
        self.fanouts = _check_fanouts(fanouts)
        self.queries = list(dict.fromkeys(self.fanouts))  # distinct fanouts, first-seen order
        self.hop_query = np.array([self.queries.index(f) for f in self.fanouts], dtype=np.int64)
        self._fans = np.array(self.queries, dtype=np.int64)
        self._cols = np.concatenate([[0], np.cumsum(self._fans)[:-1]]).astype(np.int64)
        indptr, indices = _check_csr(indptr, indices)
        self._n = indptr.size - 1
        cap = max(self._n, 1)
        self._table = np.full((cap, int(self._fans.sum())), -1, dtype=np.int64)
        self._counts = np.zeros((cap, len(self.queries)), dtype=np.int64)
        self._deg = np.zeros(cap, dtype=np.int64)
        mask = 2**64 - 1
        self._state = np.array([(seed * 0x9E3779B97F4A7C15 + 1) & mask, 0], dtype=np.uint64)
        self._scratch: queue.SimpleQueue[np.ndarray] = queue.SimpleQueue()
        pk.build(
            indptr, indices, self._cols, self._fans, np.uint64(seed & mask),
            self._table, self._counts, self._deg,
        )  # fmt: skip

    @property
    def num_nodes(self) -> int:
        """Number of vertices N (ids 0 .. N-1)."""
        return self._n

    @property
    def memory_bytes(self) -> int:
        """Bytes held by the reservoir table, counts and degrees (at current capacity)."""
        return self._table.nbytes + self._counts.nbytes + self._deg.nbytes

    def reservoir(self, v: int, hop: int) -> np.ndarray:
        """Copy of v's current reservoir for hop ``hop`` (int64, min(fanout, degree) entries)."""
        v = int(check_node_ids(np.array([v]), self._n, "v")[0])
        if not 0 <= hop < len(self.fanouts):
            raise InvalidInputError(f"hop {hop} outside [0, {len(self.fanouts)})", "hop")
        q = int(self.hop_query[hop])
        c = int(self._cols[q])
        return self._table[v, c : c + int(self._counts[v, q])].copy()

    def on_add_node(self) -> int:
        """Register a new vertex (id = old num_nodes) with empty reservoirs; returns its id."""
        if self._n == self._table.shape[0]:
            self._table = np.concatenate([self._table, np.full_like(self._table, -1)])
            self._counts = np.concatenate([self._counts, np.zeros_like(self._counts)])
            self._deg = np.concatenate([self._deg, np.zeros_like(self._deg)])
        self._n += 1
        return self._n - 1

    def on_insert(self, src: int, dst: int, neighbors_of: NeighborsOf | None = None) -> np.ndarray:
        """Edge src -> dst was added (no neighbour list needed); changes as ``apply_events``."""
        return self.apply_events(np.array([INSERT]), np.array([src]), np.array([dst]), neighbors_of)

    def on_delete(self, src: int, dst: int, neighbors_of: NeighborsOf) -> np.ndarray:
        """One src -> dst edge was removed; ``neighbors_of`` serves refills. As ``apply_events``."""
        return self.apply_events(np.array([DELETE]), np.array([src]), np.array([dst]), neighbors_of)

    def apply_events(
        self,
        kinds: np.ndarray,
        srcs: np.ndarray,
        dsts: np.ndarray,
        neighbors_of: NeighborsOf | None,
    ) -> np.ndarray:
        """Apply a batch of edge events (INSERT / DELETE) in order, already applied to the store.

        ``neighbors_of`` gives the neighbours after the WHOLE batch; the state at a given event
        is rebuilt from it by undoing the batch's later events on that vertex. Returns the
        reservoir changes int64 [k, 4] with columns ``CHANGE_COLUMNS`` (query index into
        ``queries``, vertex, added neighbour or -1, removed neighbour or -1), in event order.
        """
        kinds, srcs, dsts = self._check_events(kinds, srcs, dsts)
        if neighbors_of is None and np.any(kinds == DELETE):
            raise InvalidInputError("deletes need neighbors_of", "neighbors_of")
        n = kinds.size
        log = np.empty((n * len(self.queries), 4), dtype=np.int64)
        n_log = np.zeros(1, dtype=np.int64)
        tables = (self._table, self._counts, self._deg, self._cols, self._fans)
        i, q = 0, 0
        cached: tuple[int, np.ndarray] | None = None
        by_dst: np.ndarray | None = None
        while True:
            i, q = pk.step_events(*tables, kinds, srcs, dsts, i, q, self._state, log, n_log)
            if i >= n:
                return log[: n_log[0]].copy()
            assert neighbors_of is not None  # checked: deletes are present
            if by_dst is None:
                by_dst = np.argsort(dsts, kind="stable")
            if cached is None or cached[0] != i:
                nbrs = _neighbours_at(i, kinds, srcs, dsts, by_dst, neighbors_of)
                cached = (i, nbrs)
            v, u = int(dsts[i]), int(srcs[i])
            pk.resolve_delete(
                self._table, self._counts, self._cols, q, v, u, cached[1], self._state, log, n_log
            )
            q += 1

    def _check_events(
        self, kinds: np.ndarray, srcs: np.ndarray, dsts: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Events as int64 arrays of equal length, kinds in {INSERT, DELETE}, ids < N."""
        kinds = np.asarray(kinds, dtype=np.int64)
        srcs = check_node_ids(srcs, self._n, "src")
        dsts = check_node_ids(dsts, self._n, "dst")
        if not kinds.ndim == 1 or not kinds.size == srcs.size == dsts.size:
            raise InvalidInputError("kinds, srcs and dsts must be 1-D of equal length", "kinds")
        if kinds.size and (kinds.min() < INSERT or kinds.max() > DELETE):
            raise InvalidInputError("event kinds must be INSERT (0) or DELETE (1)", "kinds")
        return kinds, srcs, dsts

    def _borrow_map(self) -> np.ndarray:
        """A global -> local id scratch map (all -1) covering every current vertex."""
        try:
            local_id = self._scratch.get_nowait()
            if local_id.size >= self._n:
                return local_id
        except queue.Empty:
            pass
        return np.full(self._table.shape[0], -1, dtype=np.int64)

    def sample(self, seeds: np.ndarray) -> SampledSubgraph:
        """The k-hop sample of ``seeds`` (int64 ids, duplicates allowed) by reservoir look-ups.

        Same blocks as ``NeighborSampler.sample``: every hop draws for all nodes reached so far,
        local ids shared across blocks, blocks input layer first.
        """
        seeds = check_node_ids(seeds, self._n, "seeds")
        if seeds.size == 0:
            raise InvalidInputError("seeds must not be empty", "seeds")
        local_id = self._borrow_map()
        try:
            nodes, seed_rows, num_seeds, edges, hop_off, sizes = pk.assemble(
                self._table, self._counts, self._cols, self.hop_query, seeds, local_id
            )
        finally:
            self._scratch.put(local_id)
        layer = sizes.tolist()
        blocks = [
            Block(torch.from_numpy(edges[:, hop_off[h] : hop_off[h + 1]]), layer[h + 1], layer[h])
            for h in range(len(self.fanouts) - 1, -1, -1)
        ]
        return SampledSubgraph(nodes, blocks, int(num_seeds), seed_rows)


def _neighbours_at(
    i: int,
    kinds: np.ndarray,
    srcs: np.ndarray,
    dsts: np.ndarray,
    by_dst: np.ndarray,
    neighbors_of: NeighborsOf,
) -> np.ndarray:
    """dsts[i]'s neighbour multiset right after event i: the final one minus later events.

    ``by_dst`` is the stable argsort of ``dsts``: v's events, in order, are one run of it.
    """
    v = int(dsts[i])
    now = np.asarray(neighbors_of(v), dtype=np.int64)
    run = by_dst[
        np.searchsorted(dsts, v, sorter=by_dst) : np.searchsorted(dsts, v, "right", by_dst)
    ]
    later = run[run > i]
    if later.size == 0:
        return now
    out = np.concatenate([now, srcs[later[kinds[later] == DELETE]]])
    for u in srcs[later[kinds[later] == INSERT]].tolist():
        hit = np.flatnonzero(out == u)
        if hit.size:
            out = np.delete(out, hit[0])
    return out
