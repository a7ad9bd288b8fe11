"""The background PE refresher (issue 29, part 2): precomputed embeddings that follow a
changing graph.

:class:`PeRefresher` subscribes to a :class:`~gnnserve.dynamic.store.DynamicStore`. For each
committed batch it records what changed (edge destinations, rewritten features, added nodes) and
the batch's sequence number; that is all the writer waits for. A thread then pins the graph's
newest version ``v``, takes every recorded batch up to ``v`` (batches that arrived while the
previous refresh ran are coalesced into this one), computes their affected sets (:mod:`.affected`)
and reads what recomputing those rows needs (:func:`~.refresh.plan_refresh`; the pin is held
for this part only, since a writer waits for pinned readers), then recomputes them layer by layer
unpinned (:func:`~.refresh.run_refresh`) and publishes the result as a new
:class:`~.chunked.ChunkedEmbeddings` version tagged with ``v``, atomically: one reference swap;
chunks the refresh did not touch are shared, readers of the previous version keep it.

The affected sets need the graph's out-edges: :class:`~.tracking.OutEdges` (a superset of
them, rebuilt from the graph when deleted edges pile up and nothing is pending).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, replace

import numpy as np

from gnnserve.dynamic.graph import version_seq
from gnnserve.dynamic.store import DynamicStore
from gnnserve.embeddings.affected import BatchChanges
from gnnserve.embeddings.chunked import ChunkedEmbeddings
from gnnserve.embeddings.refresh import plan_refresh, run_refresh
from gnnserve.embeddings.tracking import OutEdges
from gnnserve.graph.base import GraphStore
from gnnserve.graph.events import INSERT, NeighborsOf
from gnnserve.models.zoo import GNN

log = logging.getLogger(__name__)
PUBLISH_POLL_S = 0.002  # how often to look again for a batch reported but not yet published


@dataclass(frozen=True)
class Published:
    """One PE version: the embeddings and the graph version (and batch count) they are for."""

    pes: ChunkedEmbeddings
    graph_version: str
    seq: int  # batches of the update log included


@dataclass
class RefreshStats:
    """Counters of the refresher (for /metrics and tests)."""

    refreshes: int = 0  # versions published
    batches: int = 0  # batches folded into them (each batch once)
    rows: int = 0  # rows recomputed, all layers
    last_ms: float = 0.0  # wall time of the last refresh
    rebuilds: int = 0  # reversed-graph rebuilds


class PeRefresher:
    """Keeps ``pes`` (of ``model``, at the store's current version) current with ``store``
    (module doc). Build it while no batch is being applied (at start-up): batches before it
    subscribes are not seen. :meth:`current` is the newest published version; :meth:`wait_for`
    waits for a given batch count. Stop with :meth:`close`."""

    def __init__(
        self,
        model: GNN,
        store: DynamicStore,
        pes: ChunkedEmbeddings,
        *,
        chunk_edges: int = 2_000_000,
        rebuild_ratio: float = 0.2,
        replayed: BatchChanges | None = None,
    ) -> None:
        """``replayed``: ``pes`` hold an earlier version of the store (its base, before the
        update log was replayed) and this is what the replayed batches changed: the PEs are
        brought up to the store's version here, before serving (a restart comes back to the
        state it left)."""
        graph = store.graph
        if replayed is None and pes.meta.num_nodes != graph.num_nodes:
            raise ValueError(f"PEs hold {pes.meta.num_nodes} rows, the graph {graph.num_nodes}")
        self.model, self.store, self.chunk_edges = model.eval(), store, chunk_edges
        self.rebuild_ratio = rebuild_ratio
        self.stats = RefreshStats()
        if replayed is None:
            self._published = Published(pes, graph.version, graph.seq)
            self._pending: list[tuple[int, BatchChanges]] = []
        else:
            self._published = Published(pes, pes.meta.graph_version, 0)
            self._pending = [(graph.seq, replayed)]
        self._lock = threading.Condition()  # pending, out-edges, published
        self._out = OutEdges(graph, len(pes.meta.dims), model.needs_degree)
        self._stop = False
        if replayed is not None:
            self._refresh_once()  # no writer yet: the store is not serving
        self._thread = threading.Thread(target=self._loop, name="pe-refresher", daemon=True)
        self._thread.start()
        store.subscribe(self)

    # --------------------------------------------------------------- the writer's side (listener)

    def _record(self, changes: BatchChanges) -> None:
        seq = self.store.graph.seq  # the batch being reported is the newest
        with self._lock:
            self._pending.append((seq, changes))
            self._lock.notify_all()

    def on_add_nodes(self, count: int) -> None:
        """``count`` nodes were added (their rows are refreshed from their features)."""
        with self._lock:
            added = self._out.add_nodes(count)
        self._record(BatchChanges(np.zeros(0, np.int64), added=added))

    def on_edge_events(
        self, kinds: np.ndarray, srcs: np.ndarray, dsts: np.ndarray, neighbors_of: NeighborsOf
    ) -> None:
        """Edge events: their destinations' in-neighbourhoods changed."""
        with self._lock:
            self._out.edge_events(kinds == INSERT, srcs, dsts)
        self._record(BatchChanges(np.asarray(dsts, np.int64).copy()))

    def on_feature_rows(self, ids: np.ndarray) -> None:
        """Existing nodes' features were rewritten."""
        self._record(BatchChanges(np.zeros(0, np.int64), features=np.asarray(ids).copy()))

    # --------------------------------------------------------------------------- readers

    def current(self) -> Published:
        """The newest published PE version (one reference read: consistent)."""
        return self._published

    def wait_for(self, seq: int, timeout_s: float) -> Published | None:
        """The first published version including batch ``seq``, waiting up to ``timeout_s``;
        None on timeout."""
        with self._lock:
            self._lock.wait_for(lambda: self._published.seq >= seq, timeout_s)
            return self._published if self._published.seq >= seq else None

    def lag(self) -> int:
        """Batches applied to the graph and not yet in the published PEs."""
        return max(0, self.store.graph.seq - self._published.seq)

    def close(self) -> None:
        """Stop the thread (a refresh in progress finishes first)."""
        with self._lock:
            self._stop = True
            self._lock.notify_all()
        self._thread.join(60)

    # --------------------------------------------------------------------------- the thread

    def _loop(self) -> None:
        while True:
            with self._lock:
                self._lock.wait_for(lambda: self._stop or bool(self._pending))
                if self._stop:
                    return
            try:
                if not self._refresh_once():
                    with self._lock:  # told of a batch its readers cannot pin yet: wait for it
                        self._lock.wait(PUBLISH_POLL_S)
            except Exception:  # noqa: BLE001 - keep serving the last good version
                log.exception("PE refresh failed; new-node requests keep the previous PEs")
                with self._lock:
                    self._lock.wait(1.0)

    def _refresh_once(self) -> bool:
        """Refresh the PEs for every recorded batch up to the newest version readers can pin;
        False (nothing done) when none is there yet: listeners are told of a batch before it
        is published, so this thread can wake before it can read the batch's version."""
        view = self.store.view
        version = view.acquire_read()  # every batch up to it has been recorded
        try:  # under the pin: only what the refresh reads of the graph (writers wait for it)
            start = time.perf_counter()
            # the view and the features read the pinned copy in this thread
            graph, seq = view, version_seq(version)
            with self._lock:
                taken = [c for s, c in self._pending if s <= seq]
                if not taken:
                    return False
                batches = len({s for s, _ in self._pending if s <= seq})
                self._pending = [(s, c) for s, c in self._pending if s > seq]
                sets = self._sets(taken, graph.num_nodes)
            plan = plan_refresh(self.model, graph, self.store.features, sets, self.chunk_edges)
            num_nodes = graph.num_nodes
            with self._lock:
                self._maybe_rebuild(graph, seq)
        finally:
            view.release_read()
        old = self._published.pes
        previous = lambda i, ids: old.get(i + 1, ids).numpy()  # noqa: E731
        fresh = run_refresh(self.model, plan, previous)
        meta = replace(old.meta, graph_version=version, num_nodes=num_nodes)
        pes = old.with_rows(fresh, meta)
        with self._lock:
            self._published = Published(pes, version, seq)
            self._lock.notify_all()
        self._count(batches, sum(s.size for s in sets), start)
        return True

    def _sets(self, taken: list[BatchChanges], num_nodes: int) -> list[np.ndarray]:
        merged = BatchChanges(
            np.concatenate([c.edge_dsts for c in taken]),
            np.concatenate([c.features for c in taken]),
            np.concatenate([c.added for c in taken]),
        )
        return self._out.sets(merged, num_nodes)

    def _maybe_rebuild(self, graph: GraphStore, seq: int) -> None:
        """Rebuild the out-edges from ``graph`` when deletions pile up and no later batch is
        recorded (under the lock: the writer's next batch waits for it)."""
        stale = self._out.stale(graph.num_edges, self.rebuild_ratio)
        if stale and not self._pending and self.store.graph.seq == seq:
            self._out.rebuild(graph)
            self.stats.rebuilds += 1

    def _count(self, batches: int, rows: int, start: float) -> None:
        stats = self.stats
        stats.refreshes, stats.batches, stats.rows = (
            stats.refreshes + 1,
            stats.batches + batches,
            stats.rows + rows,
        )
        stats.last_ms = (time.perf_counter() - start) * 1e3
