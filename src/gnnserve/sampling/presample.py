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

Randomness is per vertex: every draw of v depends only on (seed, query, v, the number of draws v
made before), see ``presample_kernels``. ``ReservoirTable`` holds the reservoirs of any set of
vertices (rows) and applies their events with the same kernels, so a partitioned service (DGS
sampling workers, ``gnnserve.deploy.dgs``) that applies each vertex's events in order holds
exactly the reservoirs of a single ``PreSampler`` fed the same event sequence.

``PreSampler`` is a :class:`gnnserve.graph.events.UpdateListener`: subscribed to a changing
graph (``DynamicStore.subscribe``, which the engine does), it receives every applied batch.

Threading: concurrent ``sample`` calls are safe (read-only, own scratch map each); callers
serialise updates (``on_*``, ``apply_events``) against each other and against ``sample``. A
dynamic store does so by keeping one copy per copy of its graph (a ``ReplicatedListener``:
``clone``, ``follow``): reads go to the copy of the reader's pinned version, updates to a copy
no reader holds. Per-vertex randomness makes the two copies equal draw for draw.
``neighbors_of`` must not raise: a failed batch is left half applied.
"""

from __future__ import annotations

import copy
import dataclasses
import queue
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from gnnserve.data.validate import check_node_ids
from gnnserve.errors import InvalidInputError
from gnnserve.fanouts import check_fanouts
from gnnserve.graph.events import DELETE, INSERT, NeighborsOf, SegmentLists
from gnnserve.sampling import presample_kernels as pk

if TYPE_CHECKING:  # torch-free at import: DGS workers import this module (torch costs ~2 s)
    from gnnserve.types import SampledSubgraph

CHANGE_COLUMNS = ("query", "vertex", "added", "removed")  # rows returned by the updates; -1 = none
_MASK = 2**64 - 1
_IDENTITY = np.empty(0, dtype=np.int64)  # row_of for tables whose row = vertex id


def check_csr(indptr: np.ndarray, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Return (indptr int64, indices) after checking they form an N-node CSR."""
    indptr = np.asarray(indptr, dtype=np.int64)
    indices = np.asarray(indices)
    if indptr.ndim != 1 or indptr.size < 1 or indptr[0] != 0 or indptr[-1] != indices.size:
        raise InvalidInputError("indptr must be 1-D, start at 0 and end at len(indices)", "indptr")
    if np.any(np.diff(indptr) < 0):
        raise InvalidInputError("indptr must be non-decreasing", "indptr")
    check_node_ids(indices, indptr.size - 1, "indices")
    return indptr, indices


@dataclass
class ReservoirTable:
    """The reservoirs of a set of vertices, one row per vertex, kept current by its events.

    Memory: 8 bytes per reservoir slot (``table``), per (row, query) count, per row degree and
    per row draw counter.
    """

    fans: np.ndarray  # int64 [queries] fanout of each one-hop query
    cols: np.ndarray  # int64 [queries] first column of query q in ``table``
    key: np.uint64  # maintenance key, from the seed
    table: np.ndarray  # int64 [rows_cap, sum(fans)] sampled in-neighbours (global ids), -1 empty
    counts: np.ndarray  # int64 [rows_cap, queries] filled slots per query
    deg: np.ndarray  # int64 [rows_cap] current in-degree (edge slots) of each row's vertex
    draws: np.ndarray  # int64 [rows_cap] maintenance draws each row's vertex has made

    @classmethod
    def build(
        cls,
        indptr: np.ndarray,
        indices: np.ndarray,
        gids: np.ndarray,
        queries: list[int],
        seed: int,
    ) -> ReservoirTable:
        """Reservoirs of CSR rows (row r = vertex ``gids[r]``) for the fanouts ``queries``."""
        fans = np.array(queries, dtype=np.int64)
        rows = max(indptr.size - 1, 1)
        res = cls(
            fans=fans,
            cols=np.concatenate([[0], np.cumsum(fans)[:-1]]).astype(np.int64),
            key=np.uint64((seed * 0x9E3779B97F4A7C15 + 1) & _MASK),
            table=np.full((rows, int(fans.sum())), -1, dtype=np.int64),
            counts=np.zeros((rows, fans.size), dtype=np.int64),
            deg=np.zeros(rows, dtype=np.int64),
            draws=np.zeros(rows, dtype=np.int64),
        )
        gids = np.asarray(gids, dtype=np.int64)
        seed_key = np.uint64(seed & _MASK)
        pk.build(indptr, indices, gids, res.cols, fans, seed_key, res.table, res.counts, res.deg)
        return res

    @property
    def nbytes(self) -> int:
        """Bytes held by the table, counts, degrees and draw counters (at current capacity)."""
        return sum(a.nbytes for a in (self.table, self.counts, self.deg, self.draws))

    def clone(self) -> ReservoirTable:
        """An independent copy of every array."""
        arrays = ("table", "counts", "deg", "draws")
        return dataclasses.replace(self, **{a: getattr(self, a).copy() for a in arrays})

    def grow(self, rows: int) -> None:
        """Make room for at least ``rows`` rows (doubling); new rows are empty."""
        while self.table.shape[0] < rows:
            self.table = np.concatenate([self.table, np.full_like(self.table, -1)])
            self.counts = np.concatenate([self.counts, np.zeros_like(self.counts)])
            self.deg = np.concatenate([self.deg, np.zeros_like(self.deg)])
            self.draws = np.concatenate([self.draws, np.zeros_like(self.draws)])

    def row(self, r: int, q: int) -> np.ndarray:
        """Copy of row r's reservoir for query q (int64, in slot order)."""
        c = int(self.cols[q])
        return self.table[r, c : c + int(self.counts[r, q])].copy()

    def apply(
        self,
        kinds: np.ndarray,
        srcs: np.ndarray,
        dsts: np.ndarray,
        rows: np.ndarray,
        neighbors_of: SegmentLists | NeighborsOf | None,
    ) -> np.ndarray:
        """Apply checked events (int64 arrays; ``rows[i]`` = row of dsts[i]) in order, in one
        kernel call that holds no GIL (refills included).

        ``neighbors_of`` gives the in-neighbours after the WHOLE batch, for delete refills:
        :class:`SegmentLists` whose rows are this table's rows (read by the kernel), or a
        callable from global id (called once per distinct deleted-from vertex). Returns the
        changes int64 [k, 4], columns ``CHANGE_COLUMNS``, in event order.
        """
        n = kinds.size
        log = np.empty((n * self.fans.size, 4), dtype=np.int64)
        n_log = np.zeros(1, dtype=np.int64)
        if isinstance(neighbors_of, SegmentLists):
            lists, adj_rows = neighbors_of, rows
        else:
            lists, adj_rows = _gathered_lists(kinds, dsts, neighbors_of)
        tables = (self.table, self.counts, self.deg, self.draws, self.cols, self.fans, self.key)
        pk.apply_events(
            *tables, kinds, srcs, dsts, rows,
            lists.start, lists.degree, lists.cols, adj_rows, log, n_log,
        )  # fmt: skip
        return log[: n_log[0]].copy()


def _gathered_lists(
    kinds: np.ndarray, dsts: np.ndarray, neighbors_of: NeighborsOf | None
) -> tuple[SegmentLists, np.ndarray]:
    """The lists of the vertices that lose an edge in the batch, from ``neighbors_of``
    (one call each), as SegmentLists; and each event's row in them (-1: no delete on it)."""
    deleted_from = np.unique(dsts[kinds == DELETE])
    if deleted_from.size and neighbors_of is None:
        raise InvalidInputError("deletes need neighbors_of", "neighbors_of")
    if deleted_from.size == 0:
        empty = np.empty(0, np.int64)
        return SegmentLists(empty, empty, empty), np.full(dsts.size, -1, np.int64)
    parts = [np.asarray(neighbors_of(int(v)), np.int64) for v in deleted_from.tolist()]  # type: ignore[misc]
    degree = np.array([p.size for p in parts], dtype=np.int64)
    start = np.concatenate([[0], np.cumsum(degree)[:-1]]).astype(np.int64)
    cols = np.concatenate(parts) if parts else np.empty(0, np.int64)
    at = np.searchsorted(deleted_from, dsts)
    found = deleted_from[np.minimum(at, deleted_from.size - 1)] == dsts
    return SegmentLists(start, degree, cols), np.where(found, at, -1).astype(np.int64)


class PreSampler:
    """Reservoirs of the installed query ``fanouts`` over an in-neighbour CSR, kept current.

    An UpdateListener (``graph.events``): build it from the graph's CSR, then subscribe it to
    the store, at the same graph version (no batch in between).

    Memory: one int64 table [N_cap, sum of distinct fanouts] (8 bytes per slot) plus int64
    counts [N_cap, queries], degrees and draw counters [N_cap]; capacity doubles when nodes are
    added. The degrees are tracked here from the events, so the store must report every change
    it applies.
    """

    def __init__(
        self, indptr: np.ndarray, indices: np.ndarray, fanouts: list[int], seed: int = 0
    ) -> None:
        self.fanouts = check_fanouts(fanouts, allow_all=False)  # a reservoir holds no "all"
        self.queries = list(dict.fromkeys(self.fanouts))  # distinct fanouts, first-seen order
        self.hop_query = np.array([self.queries.index(f) for f in self.fanouts], dtype=np.int64)
        indptr, indices = check_csr(indptr, indices)
        self._n = indptr.size - 1
        gids = np.arange(self._n, dtype=np.int64)
        self._res = ReservoirTable.build(indptr, indices, gids, self.queries, seed)
        self._scratch: queue.SimpleQueue[np.ndarray] = queue.SimpleQueue()
        self._current: Callable[[], PreSampler] | None = None  # set by ``follow``

    def clone(self) -> PreSampler:
        """ReplicatedListener: an independent copy in the same state, reading only itself."""
        twin = copy.copy(self)
        twin._res = self._res.clone()
        twin._scratch = queue.SimpleQueue()
        twin._current = None
        return twin

    def copy_changes(self, source: PreSampler, touched: np.ndarray) -> None:  # type: ignore[override]
        """ReplicatedListener: become equal to ``source`` (one batch ahead, its edge events at
        ``touched``) by copying those vertices' reservoirs, counts, degrees and draw counters."""
        self._res.grow(source._n)
        self._n = source._n
        mine, theirs = self._res, source._res
        rows = np.asarray(touched, dtype=np.int64)
        pk.copy_rows(
            mine.table, mine.counts, mine.deg, mine.draws,
            theirs.table, theirs.counts, theirs.deg, theirs.draws, rows,
        )  # fmt: skip

    def follow(self, current: Callable[[], PreSampler]) -> None:  # type: ignore[override]
        """ReplicatedListener: serve reads from ``current()`` (the reader's pinned copy)."""
        self._current = current

    def _reading(self) -> PreSampler:
        return self if self._current is None else self._current()

    @property
    def num_nodes(self) -> int:
        """Number of vertices N (ids 0 .. N-1) at the version read."""
        return self._reading()._n

    def reservoir(self, v: int, hop: int) -> np.ndarray:
        """Copy of v's current reservoir for hop ``hop`` (int64, min(fanout, degree) entries)."""
        me = self._reading()
        v = int(check_node_ids(np.array([v]), me._n, "v")[0])
        if not 0 <= hop < len(self.fanouts):
            raise InvalidInputError(f"hop {hop} outside [0, {len(self.fanouts)})", "hop")
        return me._res.row(v, int(self.hop_query[hop]))

    def on_add_node(self) -> int:
        """Register a new vertex (id = old num_nodes) with empty reservoirs; returns its id."""
        self.on_add_nodes(1)
        return self._n - 1

    def on_add_nodes(self, count: int) -> None:
        """UpdateListener: ``count`` vertices were added (the next ids), empty reservoirs."""
        self._res.grow(self._n + count)
        self._n += count

    def on_edge_events(
        self, kinds: np.ndarray, srcs: np.ndarray, dsts: np.ndarray, neighbors_of: NeighborsOf
    ) -> None:
        """UpdateListener: the graph applied these edge events; see :meth:`apply_events`
        (without its checks: events a graph applied are valid ids, and the store's lists come
        as SegmentLists)."""
        kinds, srcs, dsts = (np.asarray(a, dtype=np.int64) for a in (kinds, srcs, dsts))
        self._res.apply(kinds, srcs, dsts, dsts, neighbors_of)

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
        return self._res.apply(kinds, srcs, dsts, dsts, neighbors_of)

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
        return np.full(self._res.table.shape[0], -1, dtype=np.int64)

    def sample(self, seeds: np.ndarray) -> SampledSubgraph:
        """The k-hop sample of ``seeds`` (int64 ids, duplicates allowed) by reservoir look-ups.

        Same blocks as ``NeighborSampler.sample``: every hop draws for all nodes reached so far,
        local ids shared across blocks, blocks input layer first. Checks ``seeds``
        (InvalidInputError naming them), then :meth:`sample_valid`.
        """
        me = self._reading()
        seeds = check_node_ids(seeds, me._n, "seeds")
        if seeds.size == 0:
            raise InvalidInputError("seeds must not be empty", "seeds")
        return me.sample_valid(seeds)

    def sample_valid(self, seeds: np.ndarray) -> SampledSubgraph:
        """:meth:`sample` for seeds already validated (int64 ids of this graph, at least one:
        a batch of admitted requests), without checking them again."""
        me = self._reading()
        local_id = me._borrow_map()
        res = me._res
        try:
            out = pk.assemble(
                res.table, res.counts, res.cols, self.hop_query, seeds, local_id, _IDENTITY
            )
        finally:
            me._scratch.put(local_id)
        from gnnserve.sampling.sampler import to_subgraph  # torch: imported on first sample

        return to_subgraph(out, len(self.fanouts))
