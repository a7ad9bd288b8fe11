"""A DGS sampling worker: one key range of vertices, their reservoirs and subscription tables.

The worker owns the vertices of its key range (``partition.KeyRanges``: a contiguous range of
the first graph's ids, then every ``parts``-th added id) and therefore every edge event u -> v
with v owned (an event changes only v's in-neighbour reservoirs). It keeps
- v's in-neighbour multiset (``LocalAdjacency``), which serves the refills of deletes;
- v's one-hop reservoirs (``presample.ReservoirTable``), maintained by the PreSampler kernels
  with per-vertex randomness, hence bit-identical to a single ``PreSampler`` fed the same events;
- v's subscription counts (``SubscriptionTable``) and what it last pushed to each serving worker;
- its :class:`~gnnserve.deploy.dgs.feed.Position` in the update log, which it consumes itself
  (``consume``): records after its position, its own events from each, exactly once.

Messages go directly between workers (Ray actor calls): reference-count deltas to the owner of
the vertex they are about, reservoir upserts / drops to the serving workers that subscribe. A
method that sends returns the ObjectRefs of its sends without waiting for them (two workers
waiting on each other would deadlock); the coordinator waits for them before the next phase.
Messages carry the recovery epoch they were computed in; a recount (``recount``, after a worker
was rebuilt) starts a new epoch, and older messages still in flight are dropped.
"""

from __future__ import annotations

import os
import pickle
from typing import Any

import numpy as np
import ray

from gnnserve.compiled import compiled_signatures
from gnnserve.deploy.dgs.adjacency import LocalAdjacency
from gnnserve.deploy.dgs.feed import Position, record_events
from gnnserve.deploy.dgs.partition import KeyRanges, Modulo, split
from gnnserve.deploy.dgs.subscriptions import SubscriptionTable, deltas
from gnnserve.graph.events import DELETE, INSERT
from gnnserve.sampling.presample import ReservoirTable
from gnnserve.sampling.warmup import refill_graph

Csr = tuple[np.ndarray, np.ndarray, np.ndarray]  # indptr, indices, is_query of its rows


class SamplingWorker:
    """Sampling worker ``index`` of the key ranges ``ranges`` (run as a Ray actor).

    Built either from ``csr`` (the in-neighbour CSR rows of its vertices, row r = its r-th
    vertex, and which of them requests may ask for) at log position ``start``, or from a
    ``checkpoint`` (``checkpoint()``'s bytes, which carry their own position). ``feed``: the
    :class:`~gnnserve.deploy.dgs.feed.LogFeed` actor; ``dim``: the feature width of the log.
    """

    def __init__(
        self,
        index: int,
        ranges: KeyRanges,
        fanouts: list[int],
        seed: int,
        n_serving: int,
        feed: Any,
        dim: int,
        start: Position,
        csr: Csr | None = None,
        checkpoint: bytes | None = None,
    ) -> None:
        self.index, self.ranges, self.ids = index, ranges, ranges.owned(index)
        queries = list(dict.fromkeys(fanouts))
        hop_query = np.array([queries.index(f) for f in fanouts], dtype=np.int64)
        self.hops, self.fanouts, self.n_serving = len(fanouts), list(fanouts), n_serving
        self.feed, self.dim = feed, dim
        if checkpoint is not None:
            state = pickle.loads(checkpoint)
            self.res, self.adj, self.is_query, self.position, self.num_nodes = state
        else:
            assert csr is not None
            indptr, indices, is_query = csr
            gids = self.ids.vertices(np.arange(indptr.size - 1))
            self.res = ReservoirTable.build(indptr, indices, gids, queries, seed)
            self.adj = LocalAdjacency(indptr, indices)
            self.is_query = np.asarray(is_query, dtype=bool).copy()
            self.position, self.num_nodes = start, ranges.base
        self.subs = SubscriptionTable(self.res.table.shape[0], self.ids, n_serving, hop_query)
        self.inbox: list[list[np.ndarray]] = [[] for _ in range(self.hops)]
        self.epoch = 0
        if checkpoint is None:
            self._seed(np.arange(self.is_query.size))
        self.version = self.position.seq  # last published batch
        self.events = self.records = self.replayed = 0  # events / records applied, replayed
        self.peers: list[Any] = []  # sampling worker actor handles, by index
        self.servers: list[Any] = []  # serving worker actor handles, by index

    def connect(self, peers: list[Any], servers: list[Any]) -> None:
        """Learn the actor handles of every sampling worker (self included) and serving worker."""
        self.peers, self.servers = peers, servers

    def pid(self) -> int:
        """The worker's process id (tests kill it)."""
        return os.getpid()

    def node(self) -> str:
        """The Ray node this worker runs on."""
        return str(ray.get_runtime_context().get_node_id())

    def _seed(self, rows: np.ndarray) -> None:
        """Level-0 subscriptions of the query vertices among ``rows`` (their serving worker)."""
        seeds = self.ids.vertices(rows[self.is_query[rows]])
        owner = Modulo(self.n_serving).owner(seeds)
        self.inbox[0].append(deltas(owner, 0, seeds, np.ones_like(seeds)))

    def check(
        self, kinds: np.ndarray, srcs: np.ndarray, dsts: np.ndarray, num_nodes: int
    ) -> tuple[int, str] | None:
        """(position, message) of the first event this worker rejects, or None, in a graph of
        ``num_nodes`` vertices; no change but empty rows for the batch's new vertices."""
        self.adj.grow(self.ids.count(num_nodes))
        failed = self.adj.check(kinds, srcs, self.ids.rows(dsts))
        if failed < 0:
            return None
        u, v = int(srcs[failed]), int(dsts[failed])
        return failed, f"delete of edge {u} -> {v}, which does not exist at that point"

    # the log --------------------------------------------------------------------------------
    def consume(self, upto: int, replay: bool = False) -> list[Any]:
        """Apply the log's records after this worker's position through seq ``upto`` (its own
        events of each, in order) and send the count deltas. ``replay`` (a rebuild: a
        ``recount`` follows) only counts the records as replayed.

        A rebuild needs no guard against the deltas sent while replaying: they carry the epoch
        their sender was in (0 for a worker built from a checkpoint, the old one for the
        others); the coordinator waits for every send of ``consume`` before ``recount``, which
        starts a new epoch by forgetting every count and inbox, and a message that came later
        would be dropped for its old epoch (``receive``)."""
        msgs = []
        while self.position.seq < upto:
            for seq, end, raw in ray.get(self.feed.read.remote(self.position, upto)):
                added, kinds, srcs, dsts = record_events(raw, self.dim)
                if added:
                    self._grow(added)
                mine = np.flatnonzero(self.ranges.owner(dsts) == self.index)
                if mine.size:
                    changes = self._apply(kinds[mine], srcs[mine], dsts[mine])
                    msgs.append(self.subs.change_deltas(changes))
                self.position = Position(seq, end)
                self.events += int(mine.size)
                self.records += 1
                self.replayed += int(replay)
        return self._send(np.concatenate(msgs)) if msgs else []

    def _apply(self, kinds: np.ndarray, srcs: np.ndarray, dsts: np.ndarray) -> np.ndarray:
        """Apply owned events to the adjacency, then the reservoirs; the reservoir changes."""
        rows = self.ids.rows(dsts)
        self.adj.apply(kinds, srcs, rows)
        return self.res.apply(kinds, srcs, dsts, rows, self.adj.lists())

    def _grow(self, added: int) -> None:
        """The graph gained ``added`` vertices: rows for the owned ones (query vertices)."""
        first = self.ids.count(self.num_nodes)
        self.num_nodes += added
        rows = self.ids.count(self.num_nodes)
        self.res.grow(rows)
        self.adj.grow(rows)
        self.subs.grow(self.res.table.shape[0])
        self.is_query = np.concatenate([self.is_query, np.ones(rows - first, dtype=bool)])
        self._seed(np.arange(first, rows))

    def checkpoint(self) -> bytes:
        """This worker's reservoirs, adjacency and log position (no subscriptions: a rebuilt
        worker recounts them), for a replacement's ``checkpoint`` argument."""
        state = (self.res, self.adj, self.is_query, self.position, self.num_nodes)
        return pickle.dumps(state, protocol=5)

    # subscriptions --------------------------------------------------------------------------
    def receive(self, msgs: np.ndarray, epoch: int) -> None:
        """File count deltas (``DELTA_COLUMNS``) about owned vertices by level; drop those of
        an older epoch."""
        if epoch != self.epoch:
            return
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
        for push in pushes.values():
            push.epoch = self.epoch
        return [(w, self.servers[w].stage.remote(push)) for w, push in pushes.items()]

    def recount(self, epoch: int) -> None:
        """Start epoch ``epoch``: forget every count and message, file the level-0 deltas of all
        owned query vertices (the coordinator then settles every level)."""
        self.epoch = epoch
        self.inbox = [[] for _ in range(self.hops)]
        self.subs.reset()
        self._seed(np.arange(self.is_query.size))

    def republish(self, version: int) -> list[Any]:
        """Send every serving worker all it needs from this worker, replacing its cache."""
        pushes = self.subs.full(self.res, version, self.epoch)
        self.version = version
        return [self.servers[w].stage.remote(push) for w, push in pushes.items()]

    def resync(self, w: int) -> list[Any]:
        """Send serving worker ``w`` (a replacement) what this worker last pushed to it."""
        push = self.subs.snapshot(self.res, w, self.version)
        return [self.servers[w].restore.remote(push)] if push.size else []

    def _send(self, msgs: np.ndarray) -> list[Any]:
        """Route messages to the owners of their vertices (own ones filed locally)."""
        if msgs.shape[0] == 0:
            return []
        refs = []
        for part, pos in enumerate(split(self.ranges.owner(msgs[:, 2]), self.ranges.parts)):
            if pos.size == 0:
                continue
            if part == self.index:
                self.receive(msgs[pos], self.epoch)
            else:
                refs.append(self.peers[part].receive.remote(msgs[pos], self.epoch))
        return refs

    # tools ----------------------------------------------------------------------------------
    def warm_up(self) -> None:
        """Compile the update path (:func:`warm_update_path`) before the first update."""
        warm_update_path(self.fanouts)

    def compiled(self) -> dict[str, list[str]]:
        """The numba signatures this worker's process holds (``gnnserve.compiled``)."""
        return compiled_signatures()

    def subscriptions(self) -> np.ndarray:
        """int64 [m, 3] (query, vertex, serving worker) of every live subscription."""
        return self.subs.table()

    def reservoir(self, v: int, q: int) -> np.ndarray:
        """Owned vertex v's reservoir of one-hop query q (slot order)."""
        return self.res.row(int(self.ids.rows(np.array([v]))[0]), q)

    def stats(self) -> dict[str, int]:
        """Events and log records applied (and replayed from a checkpoint), the last batch
        published, the log position, bytes held by reservoirs + adjacency + counts."""
        held = self.res.nbytes + self.adj.cols.nbytes + self.subs.count.nbytes
        return {
            "events": self.events,
            "records": self.records,
            "replayed": self.replayed,
            "version": self.version,
            "seq": self.position.seq,
            "offset": self.position.offset,
            "bytes": held,
        }


def warm_update_path(fanouts: list[int]) -> None:
    """Compile a sampling worker's update path as ``check`` and ``consume`` run it, on a private
    graph, which a first update would otherwise compile while the writer waits: vertex 0 with
    in-neighbours 1..d loses one its largest reservoir holds (a refill) and gains an edge from
    d. ``check`` gets its events from Ray (read-only when large), ``consume`` decodes its own
    (writable): both kinds are compiled."""
    indptr, indices = refill_graph(fanouts)
    d = indices.size
    queries = list(dict.fromkeys(fanouts))
    for read_only in (True, False):
        res = ReservoirTable.build(indptr, indices, np.arange(d + 1), queries, seed=0)
        adj = LocalAdjacency(indptr, indices)
        held = int(res.row(0, queries.index(d - 1))[0])
        kinds, srcs = np.array([DELETE, INSERT]), np.array([held, d], dtype=np.int64)
        dsts = np.zeros(2, dtype=np.int64)
        for events in (kinds, srcs, dsts):
            events.flags.writeable = not read_only
        rows = dsts.copy()  # the rows of ``check`` and ``_apply`` are new, writable arrays
        adj.check(kinds, srcs, rows)
        adj.apply(kinds, srcs, rows)
        res.apply(kinds, srcs, dsts, rows, adj.lists())
