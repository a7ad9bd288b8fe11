"""A DGS sampling worker: one key range of vertices, their reservoirs and subscription tables.

The worker owns vertices ``lo <= v < hi`` and therefore every edge event u -> v with v in
range (an event changes only v's in-neighbour reservoirs). It keeps
- v's in-neighbour multiset (``LocalAdjacency``), which serves the refills of deletes;
- v's one-hop reservoirs (``presample.ReservoirTable``), maintained by the PreSampler kernels
  with per-vertex randomness, hence bit-identical to a single ``PreSampler`` fed the same events;
- v's subscription counts (``SubscriptionTable``) and what it last pushed to each serving worker.

Messages go directly between workers (Ray actor calls): reference-count deltas to the owner of
the vertex they are about, reservoir upserts / drops to the serving workers that subscribe. A
method that sends returns the ObjectRefs of its sends without waiting for them (two workers
waiting on each other would deadlock); the coordinator waits for them before the next phase.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from gnnserve.compiled import compiled_signatures
from gnnserve.deploy.dgs.adjacency import LocalAdjacency
from gnnserve.deploy.dgs.partition import Modulo, split
from gnnserve.deploy.dgs.subscriptions import SubscriptionTable, deltas
from gnnserve.graph.events import DELETE, INSERT
from gnnserve.sampling.presample import ReservoirTable
from gnnserve.sampling.warmup import refill_graph


class SamplingWorker:
    """Sampling worker ``index`` of the key ranges ``bounds`` (run as a Ray actor).

    ``indptr`` / ``indices`` are the in-neighbour CSR rows of its vertices only (row r is vertex
    lo + r); ``is_query`` [hi - lo] marks its vertices that requests may ask for.
    """

    def __init__(
        self,
        index: int,
        bounds: np.ndarray,
        indptr: np.ndarray,
        indices: np.ndarray,
        fanouts: list[int],
        seed: int,
        n_serving: int,
        is_query: np.ndarray,
    ) -> None:
        self.index = index
        self.bounds = np.asarray(bounds, dtype=np.int64)
        self.lo, self.hi = int(bounds[index]), int(bounds[index + 1])
        queries = list(dict.fromkeys(fanouts))
        hop_query = np.array([queries.index(f) for f in fanouts], dtype=np.int64)
        gids = np.arange(self.lo, self.hi, dtype=np.int64)
        self.res = ReservoirTable.build(indptr, indices, gids, queries, seed)
        self.adj = LocalAdjacency(indptr, indices)
        self.subs = SubscriptionTable(self.res.table.shape[0], self.lo, n_serving, hop_query)
        self.hops, self.fanouts = len(fanouts), list(fanouts)
        self.inbox: list[list[np.ndarray]] = [[] for _ in range(self.hops)]
        seeds = gids[np.asarray(is_query, dtype=bool)]
        self.inbox[0].append(deltas(Modulo(n_serving).owner(seeds), 0, seeds, np.ones_like(seeds)))
        self.version = -1  # last published batch (0 = initial state)
        self.events = 0  # events applied
        self.peers: list[Any] = []  # sampling worker actor handles, by index
        self.servers: list[Any] = []  # serving worker actor handles, by index

    def connect(self, peers: list[Any], servers: list[Any]) -> None:
        """Learn the actor handles of every sampling worker (self included) and serving worker."""
        self.peers, self.servers = peers, servers

    def check(
        self, kinds: np.ndarray, srcs: np.ndarray, dsts: np.ndarray
    ) -> tuple[int, str] | None:
        """(position, message) of the first event this worker rejects, or None; no change."""
        failed = self.adj.check(kinds, srcs, dsts - self.lo)
        if failed < 0:
            return None
        u, v = int(srcs[failed]), int(dsts[failed])
        return failed, f"delete of edge {u} -> {v}, which does not exist at that point"

    def ingest(
        self, version: int, kinds: np.ndarray, srcs: np.ndarray, dsts: np.ndarray
    ) -> list[Any]:
        """Apply a checked batch of this worker's events (in order); send the count deltas."""
        if version != self.version + 1:
            raise RuntimeError(f"batch {version} out of order: last published {self.version}")
        rows = dsts - self.lo
        self.adj.apply(kinds, srcs, rows)
        changes = self.res.apply(kinds, srcs, dsts, rows, self._neighbors)
        self.events += int(kinds.size)
        return self._send(self.subs.change_deltas(changes))

    def _neighbors(self, v: int) -> np.ndarray:
        """Current in-neighbours of owned vertex v (global ids)."""
        return self.adj.neighbors(v - self.lo)

    def receive(self, msgs: np.ndarray) -> None:
        """File count deltas (``DELTA_COLUMNS``) about owned vertices by level."""
        for level in np.unique(msgs[:, 1]).tolist():
            self.inbox[level].append(msgs[msgs[:, 1] == level])

    def settle(self, level: int) -> list[Any]:
        """Apply the net deltas of ``level``; send the next level's deltas of the crossings."""
        box, self.inbox[level] = self.inbox[level], []
        msgs = np.concatenate(box) if box else np.empty((0, 4), dtype=np.int64)
        rows, w, sign = self.subs.settle(level, msgs)
        if level + 1 >= self.hops or rows.size == 0:
            return []
        return self._send(self.subs.level_deltas(self.res, level, rows, w, sign))

    def publish(self, version: int) -> list[tuple[int, Any]]:
        """Push changed / newly needed reservoirs and drops to the subscribed serving workers;
        (serving worker, ObjectRef) of each push."""
        pushes = self.subs.diff(self.res, version)
        self.version = version
        return [(w, self.servers[w].stage.remote(push)) for w, push in pushes.items()]

    def resync(self, w: int) -> list[Any]:
        """Send serving worker ``w`` (a replacement) what this worker last pushed to it."""
        push = self.subs.snapshot(self.res, w, self.version)
        return [self.servers[w].restore.remote(push)] if push.size else []

    def _send(self, msgs: np.ndarray) -> list[Any]:
        """Route messages to the owners of their vertices (own ones filed locally)."""
        if msgs.shape[0] == 0:
            return []
        owner = np.searchsorted(self.bounds, msgs[:, 2], side="right") - 1
        refs = []
        for part, pos in enumerate(split(owner, len(self.bounds) - 1)):
            if pos.size == 0:
                continue
            if part == self.index:
                self.receive(msgs[pos])
            else:
                refs.append(self.peers[part].receive.remote(msgs[pos]))
        return refs

    def warm_up(self) -> None:
        """Compile the update path as ``check`` and ``ingest`` run it, on a private graph (this
        worker's state untouched), which a first update would otherwise compile while the
        writer waits: vertex 0 with in-neighbours 1..d loses one its largest reservoir holds
        (a refill) and gains an edge from d."""
        indptr, indices = refill_graph(self.fanouts)
        d = indices.size
        queries = list(dict.fromkeys(self.fanouts))
        res = ReservoirTable.build(indptr, indices, np.arange(d + 1), queries, seed=0)
        adj = LocalAdjacency(indptr, indices)
        held = int(res.row(0, queries.index(d - 1))[0])
        kinds, srcs = np.array([DELETE, INSERT]), np.array([held, d], dtype=np.int64)
        dsts = np.zeros(2, dtype=np.int64)
        for events in (kinds, srcs, dsts):  # as Ray hands a batch over: read-only
            events.flags.writeable = False
        rows = dsts.copy()  # ingest's rows (dsts - lo) are a new, writable array
        adj.check(kinds, srcs, rows)
        adj.apply(kinds, srcs, rows)
        res.apply(kinds, srcs, dsts, rows, adj.neighbors)

    def compiled(self) -> dict[str, list[str]]:
        """The numba signatures this worker's process holds (``gnnserve.compiled``)."""
        return compiled_signatures()

    def subscriptions(self) -> np.ndarray:
        """int64 [m, 3] (query, vertex, serving worker) of every live subscription."""
        return self.subs.table()

    def reservoir(self, v: int, q: int) -> np.ndarray:
        """Owned vertex v's reservoir of one-hop query q (slot order)."""
        return self.res.row(v - self.lo, q)

    def stats(self) -> dict[str, int]:
        """Events applied, batches published, bytes held by reservoirs + adjacency + counts."""
        held = self.res.nbytes + self.adj.cols.nbytes + self.subs.count.nbytes
        return {"events": self.events, "version": self.version, "bytes": held}
