"""Subscription tables: which serving workers need which one-hop samples, by reference count.

Notation: a k-hop query has hops h = 0 .. k-1 and one-hop query ``hop_query[h]`` per hop. For a
serving worker W with query vertices S_W, the nodes whose hop-h reservoirs its requests read are
    L_0 = S_W,   L_{h+1} = L_h + union of R_{q_h}(x) over x in L_h     (h + 1 < k),
exactly what ``PreSampler.sample`` looks up (every hop draws for all nodes reached so far;
L_h of a batch of seeds is the union of its seeds' L_h, so a worker caching L_h(S_W) answers any
batch of its seeds). W subscribes to (q, x) iff x is in L_h for some h with hop_query[h] = q.

Reference counts make L_h maintainable from local messages: ``count[x, W, h]`` = [x in S_W]
for h = 0, and for h > 0 the number of derivations of x at level h,
    [x in L_{h-1}] + sum over y in L_{h-1} of (copies of x in R_{q_{h-1}}(y)),
so x is in L_h iff count > 0. The table of x lives with x's sampling worker (the owner of x's
key range). A count crossing 0 <-> 1 at level h (x enters / leaves L_h) sends +-1 for x itself
and for each member of R_{q_h}(x) to their owners at level h + 1; a change of R_{q_h}(y) while
y is in L_h sends +1 for the added and -1 for the removed neighbour. Levels only feed the next
one, so settling levels 1 .. k-1 in order (each with the NET sum of its messages) reaches the
exact counts in k - 1 rounds, with no count ever going negative.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gnnserve.deploy.dgs.partition import OwnedIds
from gnnserve.sampling.presample import ReservoirTable

DELTA_COLUMNS = ("serving", "level", "vertex", "delta")  # int64 [m, 4] messages between owners


@dataclass
class Push:
    """One sampling worker's changes to one serving worker's cache for one update batch."""

    version: int  # the update batch (0 = initial state)
    query: np.ndarray  # int64 [m] one-hop query of each upserted reservoir
    vertex: np.ndarray  # int64 [m] its vertex
    count: np.ndarray  # int64 [m] its size
    values: np.ndarray  # int64 [m, max fanout] its members in slot order, -1 padded
    drop_query: np.ndarray  # int64 [d] one-hop query of each reservoir no longer needed
    drop_vertex: np.ndarray  # int64 [d] its vertex
    epoch: int = 0  # the sampling workers' recovery epoch it was computed in
    replace: bool = False  # a full copy: the serving worker clears its cache before applying

    @property
    def size(self) -> int:
        """Number of upserts plus drops."""
        return int(self.vertex.size + self.drop_vertex.size)


def deltas(serving: np.ndarray, level: int, vertex: np.ndarray, delta: np.ndarray) -> np.ndarray:
    """Messages (``DELTA_COLUMNS``) from equal-length columns (``level`` broadcast)."""
    out = np.empty((vertex.size, 4), dtype=np.int64)
    out[:, 0], out[:, 1], out[:, 2], out[:, 3] = serving, level, vertex, delta
    return out


class SubscriptionTable:
    """Reference counts of one sampling worker's rows (``ids`` maps rows to vertices).

    Memory: 4 bytes per (row, serving worker, hop) count plus 1 byte per (row, serving worker,
    query) of the last pushed state.
    """

    def __init__(self, rows: int, ids: OwnedIds, n_serving: int, hop_query: np.ndarray) -> None:
        self.ids = ids
        self.hop_query = np.asarray(hop_query, dtype=np.int64)
        self.n_queries = int(self.hop_query.max()) + 1
        self.count = np.zeros((rows, n_serving, self.hop_query.size), dtype=np.int32)
        self.pushed = np.zeros((rows, n_serving, self.n_queries), dtype=bool)
        self._dirty: list[np.ndarray] = []  # rows whose counts changed since the last diff
        self._changed: list[np.ndarray] = []  # (row, query) pairs whose reservoir changed

    def change_deltas(self, changes: np.ndarray) -> np.ndarray:
        """Messages for reservoir changes (``presample.CHANGE_COLUMNS`` rows) of this worker.

        Uses the counts BEFORE this batch's messages are settled; records the changes for
        ``diff``.
        """
        rows = self.ids.rows(changes[:, 1])
        self._changed.append(np.stack([rows, changes[:, 0]], axis=1))
        out = []
        for h in range(self.hop_query.size - 1):
            pick = np.flatnonzero(changes[:, 0] == self.hop_query[h])
            idx, w = np.nonzero(self.count[rows[pick], :, h] > 0)
            for col, sign in ((2, 1), (3, -1)):
                u = changes[pick[idx], col]
                keep = u >= 0
                out.append(deltas(w[keep], h + 1, u[keep], np.full(keep.sum(), sign)))
        return np.concatenate(out) if out else np.empty((0, 4), dtype=np.int64)

    def settle(self, level: int, msgs: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Add the net messages of ``level``; returns the crossings (rows, serving, +1 / -1)."""
        n_serving = self.count.shape[1]
        keys = self.ids.rows(msgs[:, 2]) * n_serving + msgs[:, 0]
        uniq, inv = np.unique(keys, return_inverse=True)
        net = np.zeros(uniq.size, dtype=np.int64)
        np.add.at(net, inv, msgs[:, 3])
        rows, w = uniq // n_serving, uniq % n_serving
        old = self.count[rows, w, level].astype(np.int64)
        new = old + net
        if np.any(new < 0):
            raise RuntimeError(f"subscription count below zero at level {level}")
        self.count[rows, w, level] = new
        self._dirty.append(rows)
        cross = (old > 0) != (new > 0)
        return rows[cross], w[cross], np.where(new[cross] > 0, 1, -1)

    def level_deltas(
        self, res: ReservoirTable, level: int, rows: np.ndarray, w: np.ndarray, sign: np.ndarray
    ) -> np.ndarray:
        """Messages for level + 1 from crossings at ``level``: the row itself and its sample."""
        q = int(self.hop_query[level])
        c, f = int(res.cols[q]), int(res.fans[q])
        block = res.table[rows, c : c + f]
        held = np.arange(f)[None, :] < res.counts[rows, q][:, None]
        per_row = held.sum(axis=1)
        own = deltas(w, level + 1, self.ids.vertices(rows), sign)
        sample = deltas(np.repeat(w, per_row), level + 1, block[held], np.repeat(sign, per_row))
        return np.concatenate([own, sample])

    def subscribed(self, rows: np.ndarray) -> np.ndarray:
        """bool [rows, serving, queries]: which serving workers need each row's reservoirs."""
        out = np.zeros((rows.size, self.count.shape[1], self.n_queries), dtype=bool)
        for h, q in enumerate(self.hop_query.tolist()):
            out[:, :, q] |= self.count[rows, :, h] > 0
        return out

    def diff(self, res: ReservoirTable, version: int) -> dict[int, Push]:
        """What each serving worker must upsert / drop since the last diff (non-empty only)."""
        parts = self._dirty + [pairs[:, 0] for pairs in self._changed]
        rows = np.unique(np.concatenate(parts)) if parts else np.empty(0, dtype=np.int64)
        changed = np.zeros((rows.size, self.n_queries), dtype=bool)
        for pairs in self._changed:
            changed[np.searchsorted(rows, pairs[:, 0]), pairs[:, 1]] = True
        self._dirty, self._changed = [], []
        new, old = self.subscribed(rows), self.pushed[rows]
        self.pushed[rows] = new
        upsert = new & (~old | changed[:, None, :])
        drop = old & ~new
        return {
            int(w): self._push(res, rows, upsert[:, w], drop[:, w], version)
            for w in range(new.shape[1])
            if upsert[:, w].any() or drop[:, w].any()
        }

    def snapshot(self, res: ReservoirTable, w: int, version: int) -> Push:
        """Every reservoir serving worker ``w`` holds now (what was pushed to it), as one Push:
        rebuilds the cache of a replacement for a worker that died."""
        rows = np.flatnonzero(self.pushed[:, w, :].any(axis=1))
        up = self.pushed[rows, w, :]
        return self._push(res, rows, up, np.zeros_like(up), version)

    def _push(
        self, res: ReservoirTable, rows: np.ndarray, up: np.ndarray, drop: np.ndarray, version: int
    ) -> Push:
        """The Push of masks ``up`` / ``drop`` [rows, queries] for one serving worker."""
        r, q = np.nonzero(up)
        width = int(res.fans.max())
        values = np.full((r.size, width), -1, dtype=np.int64)
        for qq in np.unique(q).tolist():
            sel = q == qq
            c, f = int(res.cols[qq]), int(res.fans[qq])
            block = res.table[rows[r[sel]], c : c + f]
            block[np.arange(f)[None, :] >= res.counts[rows[r[sel]], qq][:, None]] = -1
            values[sel, :f] = block
        dr, dq = np.nonzero(drop)
        return Push(
            version, q.astype(np.int64), self.ids.vertices(rows[r]), res.counts[rows[r], q],
            values, dq.astype(np.int64), self.ids.vertices(rows[dr]),
        )  # fmt: skip

    def table(self) -> np.ndarray:
        """int64 [m, 3] (query, vertex, serving worker) of every live subscription."""
        r, w, q = np.nonzero(self.subscribed(np.arange(self.count.shape[0])))
        return np.stack([q, self.ids.vertices(r), w], axis=1).astype(np.int64)

    def grow(self, rows: int) -> None:
        """Make room for ``rows`` rows (new rows: no subscriber, nothing pushed)."""
        extra = rows - self.count.shape[0]
        if extra > 0:
            self.count = np.concatenate([self.count, np.zeros_like(self.count[:extra])])
            self.pushed = np.concatenate([self.pushed, np.zeros_like(self.pushed[:extra])])

    def reset(self) -> None:
        """Forget every count and pending change (a recount follows: ``SamplingWorker.recount``)."""
        self.count[:] = 0
        self._dirty, self._changed = [], []

    def full(self, res: ReservoirTable, version: int, epoch: int) -> dict[int, Push]:
        """Per serving worker, every reservoir it needs now, as a replacing Push (also when
        empty); the pushed state becomes the subscribed one."""
        rows = np.arange(self.count.shape[0])
        self.pushed[:] = self.subscribed(rows)
        self._dirty, self._changed = [], []
        out = {}
        for w in range(self.count.shape[1]):
            up = self.pushed[:, w, :]
            push = self._push(res, rows, up, np.zeros_like(up), version)
            push.epoch, push.replace = epoch, True
            out[w] = push
        return out
