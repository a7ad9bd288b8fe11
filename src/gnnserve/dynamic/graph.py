"""DynamicGraph: a mutable adjacency in segments with slack, readable by the sampling kernels.

Node v's in-neighbours live in ``cols[start[v] : start[v] + degree[v]]`` with room for
``capacity[v]``. An insert into a full segment moves it to the end of ``cols`` with doubled
capacity (amortised O(1)); a delete swaps the last neighbour into the hole. Moves leave holes;
``compacted`` builds a fresh copy with modest slack, which the store swaps in while readers keep
using the old arrays. Mutation is not thread-safe on its own: ``DynamicStore`` serialises writers
and mutates only a copy no reader holds (``dynamic.leftright``).
"""

from __future__ import annotations

import copy

import numba
import numpy as np

from gnnserve.dynamic.segments import segment_delete, segment_insert
from gnnserve.errors import InvalidInputError, echo
from gnnserve.graph.base import GraphStore
from gnnserve.graph.events import SegmentLists


class MissingEdgeError(KeyError):
    """A delete found no such edge; the copy it was applied to is left half changed."""


@numba.njit(nogil=True, cache=True)
def _apply_events(start, degree, capacity, cols, used, loops, inserts, srcs, dsts):  # type: ignore[no-untyped-def]
    """Apply edge events in order (inserts[i] True = add, False = delete one copy).

    Returns (cols, used, index of the first delete that found no edge or -1).
    """
    for i in range(srcs.shape[0]):
        u, v = srcs[i], dsts[i]
        if inserts[i]:
            cols, used = segment_insert(start, degree, capacity, cols, used, v, u)
            if u == v:
                loops[v] += 1
        else:
            if not segment_delete(start, degree, cols, v, u):
                return cols, used, i
            if u == v:
                loops[v] -= 1
    return cols, used, -1


@numba.njit(nogil=True, cache=True)
def _count(start, degree, cols, u, v):  # type: ignore[no-untyped-def]
    lo = start[v]
    total = 0
    for p in range(lo, lo + degree[v]):
        if cols[p] == u:
            total += 1
    return total


@numba.njit(nogil=True, cache=True)
def _count_many(start, degree, cols, us, vs):  # type: ignore[no-untyped-def]
    out = np.empty(us.shape[0], dtype=np.int64)
    for i in range(us.shape[0]):
        out[i] = _count(start, degree, cols, us[i], vs[i])
    return out


@numba.njit(nogil=True, cache=True)
def _compact(start, degree, cols, n, slack_div):  # type: ignore[no-untyped-def]
    """Copy the first n segments to fresh arrays, capacity degree + 2 + degree // slack_div."""
    new_start = np.empty(start.shape[0], dtype=np.int64)
    new_cap = np.zeros(start.shape[0], dtype=np.int64)
    used = 0
    for v in range(n):
        new_start[v] = used
        new_cap[v] = degree[v] + 2 + degree[v] // slack_div
        used += new_cap[v]
    new_cols = np.empty(max(used, 1), dtype=cols.dtype)
    for v in range(n):
        lo, to = start[v], new_start[v]
        for j in range(degree[v]):
            new_cols[to + j] = cols[lo + j]
    return new_start, new_cap, new_cols, used


def version_seq(version: str) -> int:
    """The batches applied at a store version: ``<base checksum>.<seq>`` (a changing store's,
    :attr:`DynamicGraph.version`) gives ``seq``; a fixed store's checksum gives 0."""
    head, _, tail = version.rpartition(".")
    return int(tail) if head and tail.isdigit() else 0


def requested_seq(min_version: int | str, checksum: str) -> int:
    """The batch count a request's ``min_version`` names: a seq (an int, or its decimal
    string) or a ``graph_version`` of the store whose base checksum is ``checksum``;
    InvalidInputError (``min_version``) otherwise."""
    if isinstance(min_version, int):
        seq = min_version
    else:
        head, _, tail = min_version.rpartition(".")
        if not (min_version.isdigit() or (head == checksum and tail.isdigit())):
            raise InvalidInputError(
                f"min_version {echo(min_version)} is not a version of this store (its base is "
                f"{checksum}; give a graph_version or seq a write returned)",
                "min_version",
            )
        seq = int(tail)  # the whole string when it is a bare seq
    if seq < 0:
        raise InvalidInputError(f"min_version must be >= 0, got {seq}", "min_version")
    return seq


class DynamicGraph(GraphStore):
    """A GraphStore whose edges and nodes change; starts as a copy of a static store."""

    mutable = True

    def __init__(self, base: GraphStore) -> None:
        super().__init__(base.meta)
        indptr, indices = base.csr()
        n = base.num_nodes
        self._n = n
        self._m = int(indptr[-1])
        node_cap = n + n // 4 + 16
        degree = np.zeros(node_cap, dtype=np.int64)
        degree[:n] = np.diff(indptr)
        start = np.zeros(node_cap, dtype=np.int64)
        start[:n] = indptr[:-1]
        cols = np.asarray(indices, dtype=np.int64)
        new_start, capacity, new_cols, used = _compact(start, degree, cols, n, 8)
        self._install(new_start, capacity, new_cols, used, degree)
        self.loops = np.zeros(node_cap, dtype=np.int64)
        dst = np.repeat(np.arange(n), degree[:n])
        np.add.at(self.loops, dst[cols[: self._m] == dst], 1)
        self.seq = 0  # bumped by the store per applied batch

    def _install(self, start, capacity, cols, used, degree) -> None:  # type: ignore[no-untyped-def]
        # one tuple: readers pick up a consistent set of arrays with a single attribute read
        self._arrays = (start, degree, cols)
        self.start, self.degree, self.capacity, self.cols, self.used = (
            start,
            degree,
            capacity,
            cols,
            used,
        )

    def clone(self) -> DynamicGraph:
        """An independent copy: same version, same rows in the same order (so fixed-seed
        sampling draws the same neighbours from either copy)."""
        twin = copy.copy(self)
        twin._install(
            self.start.copy(), self.capacity.copy(), self.cols.copy(), self.used, self.degree.copy()
        )
        twin.loops = self.loops.copy()
        return twin

    @property
    def num_nodes(self) -> int:
        return self._n

    @property
    def num_edges(self) -> int:
        return self._m

    @property
    def version(self) -> str:
        """``<base checksum>.<batches applied>``."""
        return f"{self.meta.checksum}.{self.seq}"

    def _adjacency(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return self._arrays

    def gcn_degree(self, ids: np.ndarray) -> np.ndarray:
        return (self.degree[ids] - self.loops[ids]).astype(np.float32)

    def segment_lists(self) -> SegmentLists:
        """The in-neighbour lists of this copy as arrays (row = node id), for kernels."""
        return SegmentLists(self.start, self.degree, self.cols)

    def count_edges(self, u: int, v: int) -> int:
        """Number of u -> v edges now."""
        return int(_count(self.start, self.degree, self.cols, u, v))

    def count_edges_many(self, us: np.ndarray, vs: np.ndarray) -> np.ndarray:
        """Number of us[i] -> vs[i] edges now (int64 arrays of existing node ids)."""
        return _count_many(self.start, self.degree, self.cols, us, vs)  # type: ignore[no-any-return]

    def fragmentation(self) -> float:
        """Share of ``cols`` not holding a live edge (holes and slack)."""
        return 1.0 - self._m / max(self.used, 1)

    # mutation: callers own this copy (no reader holds it) ------------------------------------
    def apply_edge_events(self, inserts: np.ndarray, srcs: np.ndarray, dsts: np.ndarray) -> None:
        """Apply validated edge events in one kernel call (inserts: bool, True = add)."""
        cols, self.used, bad = _apply_events(
            self.start, self.degree, self.capacity, self.cols, self.used, self.loops,
            inserts, srcs, dsts,
        )  # fmt: skip
        if cols is not self.cols:
            self.cols = cols
            self._arrays = (self.start, self.degree, cols)
        if bad >= 0:
            raise MissingEdgeError(f"edge {srcs[bad]} -> {dsts[bad]} does not exist")
        self._m += int(2 * np.count_nonzero(inserts) - inserts.size)

    def add_nodes(self, count: int) -> range:
        """``count`` new nodes without edges; returns their ids."""
        if self._n + count > self.start.shape[0]:
            grow = max(self.start.shape[0], self._n + count - self.start.shape[0])
            self.start = np.concatenate([self.start, np.zeros(grow, np.int64)])
            self.degree = np.concatenate([self.degree, np.zeros(grow, np.int64)])
            self.capacity = np.concatenate([self.capacity, np.zeros(grow, np.int64)])
            self.loops = np.concatenate([self.loops, np.zeros(grow, np.int64)])
            self._arrays = (self.start, self.degree, self.cols)
        self.start[self._n : self._n + count] = self.used  # empty: the first insert moves it
        self._n += count
        return range(self._n - count, self._n)

    def compacted(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
        """A defragmented copy (start, capacity, cols, used); run with writers excluded."""
        return _compact(self.start, self.degree, self.cols, self._n, 8)  # type: ignore[no-any-return]

    def install_compacted(self, parts: tuple[np.ndarray, np.ndarray, np.ndarray, int]) -> None:
        """Swap in the arrays of ``compacted`` (under the write lock)."""
        start, capacity, cols, used = parts
        self._install(start, capacity, cols, used, self.degree)
