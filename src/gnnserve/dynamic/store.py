"""DynamicStore: a graph and its features that change, durably, with one version for both.

``apply(ops)`` validates a batch against the current state, appends it to the update log (the
acknowledgement waits for it), then applies it and reports it to the subscribed listeners
(``subscribe``; see ``gnnserve.graph.events``). The store is kept in two copies
(``dynamic.leftright``): a batch is applied to the copy no reader holds, reported, published
all at once by a flip, then applied to the other copy once the readers that pinned it leave.
Readers (inference batches) read through ``view`` and ``features`` (``dynamic.view``): they pin a
version from sampling until their features are fetched, without ever waiting for a batch, and
each batch sees exactly one version. A background thread compacts the adjacency when more than
half of it is holes or slack, copy by copy in the same way.

Opening a store compiles nothing: the update path's kernels compile on first use, or before
serving by the explicit start-up step ``dynamic.warmup.warm_up_updates`` (the engine's warm-up).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from gnnserve.dynamic import columns
from gnnserve.dynamic.columns import ColumnBatch
from gnnserve.dynamic.features import DynamicFeatures
from gnnserve.dynamic.graph import DynamicGraph, MissingEdgeError
from gnnserve.dynamic.leftright import LeftRight
from gnnserve.dynamic.records import Ops, Record
from gnnserve.dynamic.replayed import ReplayedChanges
from gnnserve.dynamic.shared_log import appending, read_tail
from gnnserve.dynamic.updates import UpdateRejectedError, parse_batch
from gnnserve.dynamic.view import GraphReplica, VersionedFeatures, VersionedGraph
from gnnserve.dynamic.wal import FsyncPolicy, UpdateLog, replay
from gnnserve.errors import InvalidInputError, ReadOnlyStoreError, StoreFormatError
from gnnserve.features.base import FeatureStore
from gnnserve.graph.base import GraphStore
from gnnserve.graph.events import (
    DELETE,
    INSERT,
    PublishListener,
    ReplicatedListener,
    UpdateListener,
)
from gnnserve.urls import local_path

log = logging.getLogger(__name__)


FOLLOW_INTERVAL_S = 0.01  # shared logs: how often the log's size is checked for new batches
BACKGROUND_ROWS = 4096  # batches this long catch the second copy up in the background
EdgeArrays = tuple[np.ndarray, np.ndarray, np.ndarray]  # (inserts bool, srcs, dsts)


class InvalidLoggedBatchError(StoreFormatError):
    """An intact log record (checksum and seq right) whose batch the update API would refuse:
    ``seq`` names it. ``gnnserve log verify --store`` finds it, ``log repair --store`` can keep
    the batches before it."""

    def __init__(self, message: str, seq: int) -> None:
        super().__init__(message, "wal")
        self.seq = seq


def _report(
    listener: UpdateListener,
    graph: DynamicGraph,
    added: int,
    edges: EdgeArrays | None,
    upserts: np.ndarray,
) -> None:
    """Tell ``listener`` what a batch changed: new nodes first, then the edge events in order,
    then (listeners that take them) the existing nodes whose features were rewritten
    (``graph``: the copy that applied it)."""
    if added:
        listener.on_add_nodes(added)
    if edges is not None:
        inserts, srcs, dsts = edges
        lists = graph.segment_lists()
        listener.on_edge_events(np.where(inserts, INSERT, DELETE), srcs, dsts, lists)
    on_feature_rows = getattr(listener, "on_feature_rows", None)
    if upserts.size and on_feature_rows is not None:
        on_feature_rows(upserts)


def _batches(n: int) -> str:
    return f"{n} batch" if n == 1 else f"{n} batches"


@dataclass(frozen=True)
class UpdateResult:
    """What an accepted batch produced."""

    graph_version: str  # version after the batch: "<base checksum>.<seq>"
    seq: int  # batches applied since the base store
    new_nodes: list[int]  # ids given to the batch's add_node operations
    applied: int  # operations applied


class DynamicStore:
    """Mutable graph + features + update log; hand ``view`` and ``features`` to the Engine.

    ``graph`` is the copy holding the newest version, for the writer's side and for tools;
    readers that run beside writers read through ``view`` (whose ``acquire_read`` pins a
    version) and ``features``.
    """

    def __init__(
        self,
        graph: GraphStore,
        features: FeatureStore,
        log_path: str | Path,
        fsync: FsyncPolicy | str = FsyncPolicy.ALWAYS,
        compact_above: float = 0.5,
        read_only: bool = False,
        store_path: str | Path | None = None,
        shared: bool = False,
    ) -> None:
        """``log_path``: a path or file URL. ``read_only``: replay the log without touching it
        (no writes, no torn-tail repair, no lock); ``apply`` then raises ReadOnlyStoreError. For
        tools beside a live server. ``store_path``: where ``graph`` was read from (named in the
        commands a refusal suggests). ``shared``: other processes append to the log too
        (``dynamic.shared_log``): their batches are read from it and applied here, in the
        background and before each batch of this process."""
        log_path = local_path(log_path, "store.update_log")
        self._store_path = str(store_path) if store_path is not None else "STORE"
        self._latest = GraphReplica(DynamicGraph(graph), DynamicFeatures(features))
        self._writer = threading.Lock()  # one batch at a time: validate, log, apply
        self.compact_above = compact_above
        self._listeners: list[
            UpdateListener | PublishListener
        ] = []  # subscribed after replay, from its state
        # the writer lock before the replay: a second server must not cut a live writer's tail
        self.log = None if read_only else UpdateLog(log_path, fsync, shared=shared)
        self._log_end = 0  # shared: where the records applied here end
        try:
            self.replayed = self._start(log_path, graph.version, read_only)
        except BaseException:
            if self.log is not None:
                self.log.close()
            raise
        self._replicas = LeftRight(self._latest)  # after the replay: one copy replayed, cloned
        self.view = VersionedGraph(self._replicas)
        self.features = VersionedFeatures(self._replicas)
        self._stop = threading.Event()
        self._compactor = threading.Thread(target=self._compact_loop, daemon=True)
        self._compactor.start()
        self._follower = threading.Thread(target=self._follow_loop, daemon=True)
        if self.shared:
            self._follower.start()

    @property
    def shared(self) -> bool:
        """Other processes append to this store's log too."""
        return self.log is not None and self.log.shared

    def _start(self, path: str | Path, base_version: str, read_only: bool) -> int:
        """Replay the log (a shared one under the append lock) and give a new log its header;
        the batches replayed."""
        log = self.log
        if log is None or not log.shared:
            replayed = self._replay(replay(path, not read_only), path, base_version)
            if log is not None and self.graph.seq == 0 and log.path.stat().st_size == 0:
                log.append(0, [{"op": "base", "checksum": base_version}])
            return replayed
        with appending(log):
            records = read_tail(log, 0, 0, locked=True)
            self._log_end = records[-1][2] if records else 0
            replayed = self._replay(((s, o) for s, o, _ in records), path, base_version)
            if not records:
                self._log_end = log.append(0, [{"op": "base", "checksum": base_version}])
        return replayed

    @property
    def graph(self) -> DynamicGraph:
        """The copy of the graph at the newest version (readers beside writers use ``view``)."""
        return self._latest.graph

    def subscribe(self, listener: UpdateListener | PublishListener) -> None:
        """Report every batch applied from now on to ``listener`` (see ``graph.events``).

        Build the listener from the current state (e.g. ``PreSampler(*store.graph.csr(), ...)``)
        with no batch applied in between. A ``ReplicatedListener`` gets a twin beside the other
        copy of the graph and reads the copy of the caller's pinned version; plain listeners
        are called once per batch, after the replicated ones, in subscription order.
        """
        with self._writer:  # not while a batch is being applied
            if not isinstance(listener, ReplicatedListener):
                self._listeners.append(listener)
                return
            k = len(self._latest.listeners)
            active, spare = self._replicas.both()
            active.listeners.append(listener)
            spare.listeners.append(listener.clone())
            listener.follow(lambda: self._replicas.reading().listeners[k])

    def unsubscribe(self, listener: UpdateListener | PublishListener) -> None:
        """Stop reporting batches to a plain ``listener`` (a model's cache, when it unloads)."""
        if isinstance(listener, ReplicatedListener):
            raise TypeError("a replicated listener stays subscribed for the store's life")
        with self._writer:
            if listener in self._listeners:
                self._listeners.remove(listener)

    def _replay(self, records: Iterable[Record], path: str | Path, base_version: str) -> int:
        """Apply every logged batch (``records``, of the log at ``path``) after checking the log
        belongs to this base store; ``replay_changes`` sums up what they changed.

        A corrupt log raises StoreFormatError (see dynamic.wal) once the good records before the
        damage are applied: the half-built store is then discarded with the exception."""
        applied = 0
        self.replay_changes = ReplayedChanges(self.graph.num_nodes)
        for seq, ops in records:
            if seq == 0:
                header = ops[0] if ops and isinstance(ops[0], dict) else {}
                if header.get("checksum") != base_version:
                    raise StoreFormatError(
                        f"update log {path} was written for store {header.get('checksum')}, "
                        f"not {base_version}",
                        "wal",
                    )
                continue
            batch = self._replayed_batch(path, seq, ops)
            edges = batch.edge_events()
            self._change(self._latest, batch, seq, edges)  # one copy yet
            self.replay_changes.add(None if edges is None else edges[2], batch.upserted_nodes)
            applied += 1
        if applied:
            log.info(
                "replayed %d update batches from %s (version %s)", applied, path, self.graph.version
            )
        return applied

    def _replayed_batch(self, path: str | Path, seq: int, ops: Ops) -> ColumnBatch:
        """A logged batch, validated as the update API validates it; StoreFormatError (the log
        left as it is) when the API would refuse it: older versions accepted feature values that
        overflow float32."""
        try:
            if isinstance(ops, bytes):
                return self._check(columns.decode(ops))
            return self._columns(self._parse(ops))
        except (InvalidInputError, ValueError) as exc:
            errors = exc.errors if isinstance(exc, UpdateRejectedError) else []
            reason = exc.message if isinstance(exc, InvalidInputError) else str(exc)
            where = f", op {errors[0]['index']}" if errors else ""
            store = self._store_path
            raise InvalidLoggedBatchError(
                f"update log {path}: the batch with seq {seq}{where} cannot be applied: "
                f"{errors[0]['message'] if errors else reason}. The log was left unchanged; "
                "the server does not start from a log holding a batch it would refuse. "
                f"`gnnserve log verify {path} --store {store}` checks every batch; "
                f"`gnnserve log repair {path} --store {store} --keep-good-prefix` keeps the "
                f"{_batches(seq - 1)} before it",
                seq,
            ) from None

    def _parse(self, ops: Any) -> list[dict[str, Any]]:
        """Validate JSON operations (``parse_batch``); the normalised operations."""
        g = self.graph
        return parse_batch(ops, g.num_nodes, self._latest.features.dim, g.count_edges).ops

    def _columns(self, ops: list[dict[str, Any]]) -> ColumnBatch:
        return columns.from_ops(ops, self._latest.features.dim)

    def _check(self, batch: ColumnBatch, deletes: bool = True) -> ColumnBatch:
        """Validate a columnar batch (``columns.check_columns``; ``deletes``: also that each
        delete finds an edge); the batch."""
        g = self.graph
        counts = g.count_edges_many if deletes else None
        columns.check_columns(batch, g.num_nodes, self._latest.features.dim, counts)
        return batch

    def apply(self, ops: Any) -> UpdateResult:
        """Validate JSON operations, log them durably, apply them; UpdateRejectedError (nothing
        applied) when invalid. A batch of plain operations goes to columns at once
        (``columns.from_json``) and on as ``apply_columns``: validated, logged (one binary
        record) and applied by array code, the GIL held only to read the operations. Any other
        batch, and any the columns refuse, is checked op by op (``parse_batch``), which names
        every problem."""
        with self._writing():
            batch = columns.from_json(ops, self._latest.features.dim)
            if batch is None:
                batch = self._columns(self._parse(ops))
            try:
                return self._apply_columns(batch)
            except UpdateRejectedError:
                self._parse(ops)  # raises with the op-by-op messages
                raise

    def apply_columns(self, batch: ColumnBatch) -> UpdateResult:
        """Validate a columnar batch (bulk ingestion), apply it to the copy no one reads, log
        it as one binary record, publish it; UpdateRejectedError (nothing applied) when invalid.

        Whether each delete finds its edge is checked by applying the batch to that copy (one
        scan of the edge's row instead of two); when one does not, the copy is rebuilt and the
        batch checked in full, which names every refused row."""
        with self._writing():
            return self._apply_columns(batch)

    def _apply_columns(self, batch: ColumnBatch) -> UpdateResult:
        self._check(batch, deletes=False)
        seq = self._next_seq()
        log = self.log
        assert log is not None

        def log_it() -> None:
            self._log_end += log.append_frame(seq, columns.encode(batch))

        try:
            return self._apply(batch, seq, log_it)
        except MissingEdgeError:
            self._check(batch)  # raises UpdateRejectedError naming every row
            raise

    @contextmanager
    def _writing(self) -> Iterator[None]:
        """One batch of this process at a time; with a shared log, also of every process, and
        after the batches the others appended are applied here."""
        with self._writer:
            if not self.shared:
                yield
                return
            assert self.log is not None
            with appending(self.log):
                self._follow(locked=True)
                yield

    def follow(self) -> int:
        """Apply the batches other processes appended to a shared log; how many."""
        with self._writer:
            return self._follow(locked=False) if self.shared else 0

    def _follow(self, locked: bool) -> int:
        log = self.log
        assert log is not None
        records = read_tail(log, self._log_end, self.graph.seq + 1, locked)
        for seq, ops, end in records:
            self._apply(self._replayed_batch(log.path, seq, ops), seq)
            self._log_end = end
        return len(records)

    def _follow_loop(self) -> None:
        """Apply the other processes' batches as they reach the log (a stat per interval)."""
        assert self.log is not None
        seen = -1
        while not self._stop.wait(FOLLOW_INTERVAL_S):
            try:
                size = os.stat(self.log.path).st_size
                if size != seen:
                    self.follow()
                    seen = size
            except Exception:  # noqa: BLE001 - logged; a write or the next poll reads again
                log.exception("reading the batches of the other workers from %s", self.log.path)

    def ensure_version(self, seq: int) -> None:
        """Return once the batch ``seq`` is applied here (read-your-writes across processes);
        InvalidInputError when the log holds no such batch: no write returned that version."""
        if self.graph.seq >= seq:
            return
        self.follow()  # an acknowledged batch is in the log: reading it is enough
        if self.graph.seq < seq:
            raise InvalidInputError(
                f"min_version {seq} is ahead of the update log (its last batch is seq "
                f"{self.graph.seq}): no write returned that version",
                "min_version",
            )

    def _next_seq(self) -> int:
        if self.log is None:
            raise ReadOnlyStoreError("this store was opened read-only", "ops")
        return self.graph.seq + 1

    def _apply(
        self, batch: ColumnBatch, seq: int, log_it: Callable[[], None] | None = None
    ) -> UpdateResult:
        """Apply to the spare copy (then ``log_it``), report to the listeners, publish, apply
        to the other copy."""
        edges = batch.edge_events()  # once, for both copies
        added, first = batch.added, self.graph.num_nodes
        upserts = batch.upserted_nodes

        def published(replica: GraphReplica) -> None:
            if log_it is not None:
                log_it()  # durable before anyone sees or is told of the batch
            self._latest = replica
            for listener in self._listeners:  # before readers can pin the batch's version
                if isinstance(listener, PublishListener):
                    listener.on_published(seq, replica.graph.num_nodes)
                else:
                    _report(listener, replica.graph, added, edges, upserts)

        def catch_up(behind: GraphReplica, ahead: GraphReplica) -> None:
            self._change(behind, batch, seq, edges, listeners=False)
            touched = edges[2] if edges is not None else np.empty(0, np.int64)
            for twin, source in zip(behind.listeners, ahead.listeners, strict=True):
                twin.copy_changes(source, touched)

        self._replicas.write(
            lambda r: self._change(r, batch, seq, edges),
            published,
            catch_up,
            background=len(batch) >= BACKGROUND_ROWS,
        )
        return UpdateResult(self.graph.version, seq, list(range(first, first + added)), len(batch))

    @staticmethod
    def _change(
        replica: GraphReplica,
        batch: ColumnBatch,
        seq: int,
        edges: EdgeArrays | None,
        listeners: bool = True,
    ) -> None:
        """Apply ``batch`` (``edges``: its ``edge_events()``) to one copy that no reader holds
        (and to its listeners' copies)."""
        g, f = replica.graph, replica.features
        # node ops first: edges may use the new ids; upserts after the adds they may name
        kinds = batch.op[batch.feature_rows]
        adds = kinds == columns.ADD_NODE
        if adds.any():
            g.add_nodes(int(np.count_nonzero(adds)))
            f.append_rows(batch.features[adds])
        if not adds.all():
            f.upsert_rows(batch.node[batch.feature_rows[~adds]], batch.features[~adds])
        if edges is not None:
            g.apply_edge_events(*edges)
        g.seq = seq
        for listener in replica.listeners if listeners else ():
            _report(listener, g, batch.added, edges, batch.upserted_nodes)

    def compact(self) -> None:
        """Defragment the adjacency, one copy at a time; readers keep running."""

        def compact(replica: GraphReplica) -> None:
            replica.graph.install_compacted(replica.graph.compacted())

        with self._writer:
            self._replicas.write(compact, lambda replica: None)

    def _compact_loop(self) -> None:
        while not self._stop.wait(1.0):
            if self.graph.fragmentation() > self.compact_above:
                start = time.perf_counter()
                self.compact()
                log.info("compacted adjacency in %.1f ms", (time.perf_counter() - start) * 1e3)

    def close(self) -> None:
        """Stop the compactor, finish the copy catching up, close the log."""
        self._stop.set()
        self._compactor.join(5)
        if self._follower.is_alive():
            self._follower.join(5)
        self._replicas.close()
        if self.log is not None:
            self.log.close()
