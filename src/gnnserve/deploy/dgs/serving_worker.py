"""A DGS serving worker: a local cache of every one-hop sample its query vertices need.

The cache holds, per cached vertex, one row of reservoirs (all one-hop queries side by side, as
in ``ReservoirTable``); a reservoir that is not held has count -1. Requests are assembled by the
PreSampler kernel straight from this cache (``row_of`` maps vertex -> row), so a request never
calls a sampling worker, and the result is the PreSampler's whenever the cache holds the same
reservoirs.

Updates arrive as ``Push`` messages tagged with a batch version; they are staged and applied
together by ``commit(version, num_nodes)``. An actor runs one call at a time, so a request sees
the cache either before or after a whole batch, never half of it. After a sampling worker was
rebuilt, ``reset(epoch)`` drops what was staged, pushes of older epochs still in flight are
ignored, and the batch commits full copies (``Push.replace``) that replace the whole cache.
"""

from __future__ import annotations

import os

import numpy as np

from gnnserve.compiled import compiled_signatures
from gnnserve.deploy.dgs.subscriptions import Push
from gnnserve.sampling import presample_kernels as pk

Assembled = tuple  # presample_kernels.assemble's first six outputs: sampler.to_subgraph's input


class ServingCache:
    """Reservoir rows of the vertices a serving worker's requests read.

    Memory: 8 bytes per vertex of the graph (``row_of``) and per vertex for the scratch map,
    plus per cached vertex 8 bytes per reservoir slot and per query count.
    """

    def __init__(self, num_nodes: int, fanouts: list[int]) -> None:
        queries = list(dict.fromkeys(fanouts))
        self.fans = np.array(queries, dtype=np.int64)
        self.cols = np.concatenate([[0], np.cumsum(self.fans)[:-1]]).astype(np.int64)
        self.hop_query = np.array([queries.index(f) for f in fanouts], dtype=np.int64)
        self.row_of = np.full(num_nodes, -1, dtype=np.int64)
        self.vertex_of = np.full(16, -1, dtype=np.int64)  # row -> vertex (-1 = free)
        self.table = np.full((16, int(self.fans.sum())), -1, dtype=np.int64)
        self.counts = np.full((16, self.fans.size), -1, dtype=np.int64)
        self.free: list[int] = list(range(15, -1, -1))  # free rows, popped from the end
        self.local_id = np.full(num_nodes, -1, dtype=np.int64)  # assembly scratch

    def upsert(self, push: Push) -> None:
        """Store the pushed reservoirs (replacing older versions of them)."""
        self._allocate(np.unique(push.vertex))
        rows = self.row_of[push.vertex]
        for q in np.unique(push.query).tolist():
            sel = push.query == q
            c, f = int(self.cols[q]), int(self.fans[q])
            self.table[rows[sel], c : c + f] = push.values[sel, :f]
            self.counts[rows[sel], q] = push.count[sel]

    def drop(self, push: Push) -> None:
        """Forget the reservoirs no longer needed; free rows that hold none."""
        rows = self.row_of[push.drop_vertex]
        self.counts[rows, push.drop_query] = -1
        rows = np.unique(rows)
        empty = rows[(self.counts[rows] < 0).all(axis=1)]
        self.row_of[self.vertex_of[empty]] = -1
        self.vertex_of[empty] = -1
        self.free.extend(empty.tolist())

    def clear(self) -> None:
        """Forget every reservoir."""
        self.row_of[self.vertex_of[self.vertex_of >= 0]] = -1
        self.vertex_of[:] = -1
        self.counts[:] = -1
        self.free = list(range(self.vertex_of.size - 1, -1, -1))

    def resize(self, num_nodes: int) -> None:
        """The graph has ``num_nodes`` vertices now (it only grows)."""
        extra = num_nodes - self.row_of.size
        if extra > 0:
            self.row_of = np.concatenate([self.row_of, np.full(extra, -1, dtype=np.int64)])
            self.local_id = np.concatenate([self.local_id, np.full(extra, -1, dtype=np.int64)])

    def _allocate(self, vertices: np.ndarray) -> None:
        """Give a row to each vertex in ``vertices`` that has none."""
        new = vertices[self.row_of[vertices] < 0]
        while len(self.free) < new.size:
            self._grow()
        rows = np.array([self.free.pop() for _ in range(new.size)], dtype=np.int64)
        self.row_of[new] = rows
        self.vertex_of[rows] = new
        self.table[rows] = -1
        self.counts[rows] = -1

    def _grow(self) -> None:
        """Double the row capacity."""
        cap = self.vertex_of.size
        self.vertex_of = np.concatenate([self.vertex_of, np.full(cap, -1, dtype=np.int64)])
        self.table = np.concatenate([self.table, np.full_like(self.table, -1)])
        self.counts = np.concatenate([self.counts, np.full_like(self.counts, -1)])
        self.free.extend(range(2 * cap - 1, cap - 1, -1))

    def sample(self, seeds: np.ndarray) -> Assembled:
        """The k-hop sample of ``seeds`` from the cache as ``assemble``'s arrays (the driver
        makes the blocks: this process never imports torch); RuntimeError on a missing
        reservoir."""
        out = pk.assemble(
            self.table, self.counts, self.cols, self.hop_query, seeds, self.local_id, self.row_of
        )
        if out[6] >= 0:
            raise RuntimeError(f"serving cache misses a reservoir of vertex {out[6]}")
        return out[:6]  # type: ignore[no-any-return]

    def contents(self) -> np.ndarray:
        """int64 [m, 2 + max fanout]: (query, vertex, members..., -1 padded) of every reservoir."""
        rows, q = np.nonzero(self.counts >= 0)
        out = np.full((rows.size, 2 + int(self.fans.max())), -1, dtype=np.int64)
        out[:, 0], out[:, 1] = q, self.vertex_of[rows]
        for i, (r, qq) in enumerate(zip(rows.tolist(), q.tolist(), strict=True)):
            c, k = int(self.cols[qq]), int(self.counts[r, qq])
            out[i, 2 : 2 + k] = self.table[r, c : c + k]
        return out


class ServingWorker:
    """Serving worker ``index``: its cache plus the batch protocol (run as a Ray actor).

    ``version``: the last committed batch; a replacement for a worker that died starts at the
    service's version with an empty cache, which ``restore`` fills.
    """

    def __init__(self, index: int, num_nodes: int, fanouts: list[int], version: int = -1) -> None:
        self.index = index
        self.cache = ServingCache(num_nodes, fanouts)
        self.version = version
        self.staged: list[Push] = []
        self.epoch = 0  # pushes of an older epoch are dropped (module doc)
        self.requests = 0

    def pid(self) -> int:
        """The worker's process id (tests kill it)."""
        return os.getpid()

    def ping(self) -> int:
        """The last committed batch: answers while the worker is alive."""
        return self.version

    def restore(self, push: Push) -> None:
        """Load a sampling worker's snapshot of what this (replacement) worker caches."""
        if push.version != self.version:
            raise RuntimeError(f"snapshot of batch {push.version} for a worker at {self.version}")
        self.cache.upsert(push)

    def stage(self, push: Push) -> None:
        """Keep a sampling worker's push until its batch commits (one of an older epoch is
        dropped)."""
        if push.epoch < self.epoch:
            return
        if push.version < self.version or (push.version == self.version and not push.replace):
            raise RuntimeError(f"push of batch {push.version} after batch {self.version}")
        self.staged.append(push)

    def reset(self, epoch: int) -> None:
        """Drop what was staged; from now on accept pushes of ``epoch`` only."""
        self.epoch, self.staged = epoch, []

    def commit(self, version: int, num_nodes: int) -> int:
        """Apply every staged push of batch ``version`` (the graph then has ``num_nodes``
        vertices) at once; returns the version. The committed batch again only with full
        copies (a recovery at the last batch)."""
        staged, self.staged = self.staged, []
        again = version == self.version and all(push.replace for push in staged)
        if version < self.version or (version == self.version and not again):
            raise RuntimeError(f"commit of batch {version} after batch {self.version}")
        self.cache.resize(num_nodes)
        if any(push.replace for push in staged):
            self.cache.clear()
        for push in staged:
            self.cache.upsert(push)
        for push in staged:
            self.cache.drop(push)
        self.version = version
        return version

    def sample(self, seeds: np.ndarray) -> tuple[int, Assembled]:
        """(batch version read, k-hop sample of ``seeds``) from the local cache only."""
        self.requests += 1
        return self.version, self.cache.sample(np.asarray(seeds, dtype=np.int64))

    def contents(self) -> np.ndarray:
        """The cached reservoirs (``ServingCache.contents``)."""
        return self.cache.contents()

    def compiled(self) -> dict[str, list[str]]:
        """The numba signatures this worker's process holds (``gnnserve.compiled``)."""
        return compiled_signatures()
