"""G+ (stored graph plus a request's new nodes and edges) for the sampler kernels, per request.

:class:`AdjacencyOverlay` keeps one private copy of the in-neighbour adjacency
(row_start, degree, indices) with room for ``max_new_nodes`` extra rows and a spare region at the
end of ``indices``. A request writes the rows of the nodes it touches (its queries and their
existing neighbours: stored in-edges, then request in-edges) into the spare region, points those
rows there, and puts the original row pointers back when it is done. Per request this costs
O(m + request edges + sum of the stored in-degrees of the touched nodes), not O(N + E).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import numba
import numpy as np

from gnnserve.graph.base import GraphStore
from gnnserve.types import NewNodes


def request_in_edges(new: NewNodes, num_nodes: int) -> tuple[np.ndarray, np.ndarray]:
    """(src, dst) int64 global ids of every directed request edge: both directions of each."""
    n = num_nodes
    qi, ex = new.edges[:, 0] + n, new.edges[:, 1]
    a, b = new.new_edges[:, 0] + n, new.new_edges[:, 1] + n
    return np.concatenate([qi, ex, a, b]), np.concatenate([ex, qi, b, a])


@dataclass(frozen=True)
class OverlayView:
    """G+ of one request as (row_start, degree, indices), valid inside ``patched`` only.

    Node v's in-neighbours in G+ are ``indices[row_start[v] : row_start[v] + degree[v]]`` for
    existing nodes and for the request's new nodes ``num_nodes .. num_nodes + m - 1``.
    """

    row_start: np.ndarray  # int64 [N + capacity]
    degree: np.ndarray  # int64 [N + capacity]
    indices: np.ndarray  # [E + spare]
    local_id: np.ndarray  # scratch map (all -1) of size >= N + m, for the sampler kernels
    num_nodes: int  # N
    num_new: int  # m
    touched: np.ndarray  # int64 sorted ids whose rows the request changed
    extra: np.ndarray  # int64 [len(touched)] request in-edges of each touched node

    def extra_in(self, ids: np.ndarray) -> np.ndarray:
        """int64 number of request in-edges into each of ``ids`` (0 for untouched nodes)."""
        ids = np.asarray(ids, dtype=np.int64)
        if self.touched.size == 0:
            return np.zeros(ids.size, np.int64)
        pos = np.minimum(np.searchsorted(self.touched, ids), self.touched.size - 1)
        return np.where(self.touched[pos] == ids, self.extra[pos], 0)


class AdjacencyOverlay:
    """A reusable copy of a GraphStore's adjacency onto which requests patch their new edges.

    Built once (O(N + E)); each request then costs O(m + sum of the in-degrees of the nodes it
    touches). One request at a time holds the overlay (a lock); the spare region and the room
    for new nodes grow when a request needs more. A mutable store is re-copied when its version
    changes.
    """

    def __init__(self, graph: GraphStore, max_new_nodes: int = 1024, spare: int = 1 << 16):
        self.graph = graph
        self._lock = threading.Lock()
        self._capacity = max(int(max_new_nodes), 1)
        self._spare = max(int(spare), 1)
        self._build()

    def _build(self) -> None:
        self.version = self.graph.version
        n = self.graph.num_nodes
        row_start, degree, indices = self.graph.adjacency()
        self._base_row_start = np.array(row_start[:n], dtype=np.int64)
        self._base_degree = np.array(degree[:n], dtype=np.int64)
        dtype = indices.dtype if n + self._capacity < np.iinfo(np.int32).max else np.int64
        self._base_len = int(np.asarray(indices).shape[0])
        self.indices = np.empty(self._base_len + self._spare, dtype=dtype)
        self.indices[: self._base_len] = indices
        self.num_nodes = n
        self._alloc_rows()

    def _alloc_rows(self) -> None:
        n, cap = self.num_nodes, self._capacity
        self.row_start = np.zeros(n + cap, dtype=np.int64)
        self.row_start[:n] = self._base_row_start
        self.degree = np.zeros(n + cap, dtype=np.int64)
        self.degree[:n] = self._base_degree
        self.local_id = np.full(n + cap, -1, dtype=np.int32 if n + cap < 2**31 else np.int64)

    @property
    def capacity(self) -> int:
        """New nodes one request may add without growing the row arrays."""
        return self._capacity

    @property
    def spare(self) -> int:
        """Size of the spare region of ``indices`` that patched rows are written to."""
        return self.indices.shape[0] - self._base_len

    def _grow(self, m: int, need: int) -> None:
        if m > self._capacity:
            self._capacity = max(m, 2 * self._capacity)
            self._alloc_rows()
        if need > self.spare:
            self._spare = max(need, 2 * self._spare)
            grown = np.empty(self._base_len + self._spare, dtype=self.indices.dtype)
            grown[: self._base_len] = self.indices[: self._base_len]
            self.indices = grown

    @contextmanager
    def patched(self, new: NewNodes) -> Iterator[OverlayView]:
        """Hold the overlay with G+ of ``new`` patched in; restored on exit (even on error)."""
        with self._lock:
            if self.graph.mutable and self.graph.version != self.version:
                self._build()
            touched = self._patch(new)
            try:
                yield self._view
            finally:
                self._restore(touched)

    def _patch(self, new: NewNodes) -> np.ndarray:
        n, m = self.num_nodes, new.count
        src, dst = request_in_edges(new, n)
        src, touched, extra, need = _group_by_dst(src, dst, n, self._base_degree)
        self._grow(m, int(need))
        _write_rows(
            src,
            touched,
            extra,
            n,
            self._base_row_start,
            self._base_degree,
            self._base_len,
            self.row_start,
            self.degree,
            self.indices,
        )
        self._view = OverlayView(
            self.row_start, self.degree, self.indices, self.local_id, n, m, touched, extra
        )
        return touched

    def _restore(self, touched: np.ndarray) -> None:
        _restore_rows(
            touched,
            self.num_nodes,
            self._base_row_start,
            self._base_degree,
            self.row_start,
            self.degree,
        )


@numba.njit(nogil=True, cache=True)
def _group_by_dst(src, dst, n, base_degree):  # type: ignore[no-untyped-def]
    """Request edges grouped by destination: (src sorted by dst, touched ids ascending, request
    in-edges per touched id, spare slots the patched rows need)."""
    order = np.argsort(dst, kind="mergesort")
    sorted_src = src[order]
    touched = np.empty(dst.shape[0], np.int64)
    extra = np.zeros(dst.shape[0], np.int64)
    count = 0
    need = 0
    for i in range(order.shape[0]):
        v = dst[order[i]]
        if count == 0 or touched[count - 1] != v:
            touched[count] = v
            count += 1
            if v < n:
                need += base_degree[v]
        extra[count - 1] += 1
        need += 1
    return sorted_src, touched[:count].copy(), extra[:count].copy(), need


@numba.njit(nogil=True, cache=True)
def _write_rows(
    src, touched, extra, n, base_row_start, base_degree, base_len, row_start, degree, indices
):  # type: ignore[no-untyped-def]
    """Write every touched row (stored in-edges, then request in-edges) into the spare region
    and point the row there."""
    cursor = base_len
    taken = 0
    for t in range(touched.shape[0]):
        v = touched[t]
        start = cursor
        if v < n:
            lo = base_row_start[v]
            for j in range(base_degree[v]):
                indices[cursor] = indices[lo + j]
                cursor += 1
        for j in range(extra[t]):
            indices[cursor] = src[taken + j]
            cursor += 1
        taken += extra[t]
        row_start[v] = start
        degree[v] = cursor - start


@numba.njit(nogil=True, cache=True)
def _restore_rows(touched, n, base_row_start, base_degree, row_start, degree):  # type: ignore[no-untyped-def]
    for v in touched:
        if v < n:
            row_start[v] = base_row_start[v]
            degree[v] = base_degree[v]
        else:
            row_start[v] = 0
            degree[v] = 0
