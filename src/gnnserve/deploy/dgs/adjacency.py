"""In-neighbour multisets of a sampling worker's vertices, updated by batches of edge events.

Row r's neighbours live in ``cols[start[r] : start[r] + degree[r]]`` with room for
``capacity[r]``; an insert into a full row moves it to the end with doubled capacity, a delete
swaps the last neighbour into the hole (order is irrelevant: refills sort the neighbours).
Batches are checked before they are applied: a delete of an edge that does not exist at that
point of the batch rejects the whole batch and leaves the lists as they were.
"""

from __future__ import annotations

import numba
import numpy as np

from gnnserve.dynamic.segments import segment_delete, segment_insert
from gnnserve.graph.events import SegmentLists
from gnnserve.sampling.presample_kernels import INSERT


@numba.njit(nogil=True, cache=True)
def _apply(start, degree, capacity, cols, used, kinds, srcs, rows, dry_run):  # type: ignore[no-untyped-def]
    """Apply events in order; returns (cols, used, first failing event or -1).

    On a failure, or with ``dry_run``, every applied event is undone (in reverse order).
    """
    failed = -1
    done = 0
    for i in range(kinds.shape[0]):
        if kinds[i] == INSERT:
            cols, used = segment_insert(start, degree, capacity, cols, used, rows[i], srcs[i])
        elif not segment_delete(start, degree, cols, rows[i], srcs[i]):
            failed = i
            break
        done = i + 1
    if failed >= 0 or dry_run:
        for i in range(done - 1, -1, -1):
            if kinds[i] == INSERT:
                segment_delete(start, degree, cols, rows[i], srcs[i])
            else:
                cols, used = segment_insert(start, degree, capacity, cols, used, rows[i], srcs[i])
    return cols, used, failed


class LocalAdjacency:
    """Mutable in-neighbour lists of rows 0 .. n-1 (a worker's vertices, row = id - offset).

    Memory: 8 bytes per edge slot plus slack (rows start with capacity degree + 2 + degree/8)
    and 24 bytes per row.
    """

    def __init__(self, indptr: np.ndarray, indices: np.ndarray) -> None:
        degree = np.diff(indptr).astype(np.int64)
        self.degree = degree
        self.capacity = degree + 2 + degree // 8
        self.start = np.concatenate([[0], np.cumsum(self.capacity)[:-1]]).astype(np.int64)
        self.used = int(self.capacity.sum())
        self.cols = np.full(max(self.used, 1), -1, dtype=np.int64)
        dst = np.repeat(np.arange(degree.size), degree)
        slot = np.arange(dst.size) - np.asarray(indptr, dtype=np.int64)[dst]
        self.cols[self.start[dst] + slot] = np.asarray(indices, dtype=np.int64)

    def grow(self, rows: int) -> None:
        """Add empty rows up to ``rows`` rows (new vertices), each with room for two edges."""
        extra = rows - self.degree.size
        if extra <= 0:
            return
        self.start = np.concatenate([self.start, self.used + 2 * np.arange(extra)])
        self.degree = np.concatenate([self.degree, np.zeros(extra, dtype=np.int64)])
        self.capacity = np.concatenate([self.capacity, np.full(extra, 2, dtype=np.int64)])
        self.used += 2 * extra
        if self.used > self.cols.size:
            more = max(self.used - self.cols.size, self.cols.size)
            self.cols = np.concatenate([self.cols, np.full(more, -1, dtype=np.int64)])

    def neighbors(self, r: int) -> np.ndarray:
        """Row r's current in-neighbours (a view; order unspecified)."""
        lo = int(self.start[r])
        return self.cols[lo : lo + int(self.degree[r])]

    def lists(self) -> SegmentLists:
        """Every row's list as arrays (rows as this adjacency's), for the reservoir kernel."""
        return SegmentLists(self.start, self.degree, self.cols)

    def check(self, kinds: np.ndarray, srcs: np.ndarray, rows: np.ndarray) -> int:
        """First event that deletes a missing edge (in batch order), or -1; changes nothing."""
        return self._run(kinds, srcs, rows, dry_run=True)

    def apply(self, kinds: np.ndarray, srcs: np.ndarray, rows: np.ndarray) -> None:
        """Apply a checked batch (a failure here would be a bug: it raises RuntimeError)."""
        failed = self._run(kinds, srcs, rows, dry_run=False)
        if failed >= 0:
            raise RuntimeError(f"event {failed} deletes a missing edge in a checked batch")

    def _run(self, kinds: np.ndarray, srcs: np.ndarray, rows: np.ndarray, dry_run: bool) -> int:
        """Run ``_apply`` and keep its (maybe regrown) column array."""
        self.cols, self.used, failed = _apply(
            self.start, self.degree, self.capacity, self.cols, self.used,
            kinds, srcs, rows, dry_run,
        )  # fmt: skip
        return int(failed)
