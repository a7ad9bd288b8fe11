"""DynamicStore: a graph and its features that change, durably, with one version for both.

``apply(ops)`` validates a batch against the current state, appends it to the update log (the
acknowledgement waits for it), then applies it under the write lock and advances the version.
Readers (inference batches) hold the read lock from sampling until their features are fetched,
so each batch sees exactly one version. A background thread compacts the adjacency when more
than half of it is holes or slack: it copies with writers paused and readers running, then swaps
the arrays in under a brief write lock.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from gnnserve.errors import InvalidInputError, ReadOnlyStoreError, StoreFormatError
from gnnserve.features.base import FeatureStore
from gnnserve.features.dynamic import DynamicFeatures
from gnnserve.graph.base import GraphStore
from gnnserve.graph.dynamic import DynamicGraph
from gnnserve.graph.rwlock import ReadWriteLock
from gnnserve.graph.updates import ParsedBatch, UpdateRejectedError, parse_batch
from gnnserve.graph.wal import FsyncPolicy, UpdateLog, replay
from gnnserve.graph.warmup import warm_up_updates
from gnnserve.sampling.presample import DELETE, INSERT, PreSampler

log = logging.getLogger(__name__)


EdgeArrays = tuple[np.ndarray, np.ndarray, np.ndarray]  # (inserts bool, srcs, dsts)


def _edge_arrays(batch: ParsedBatch) -> EdgeArrays | None:
    """The batch's edge operations, in order, as arrays for the kernels (None when none)."""
    edges = [op for op in batch.ops if op["op"] in ("add_edge", "delete_edge")]
    if not edges:
        return None
    inserts = np.array([op["op"] == "add_edge" for op in edges], dtype=np.bool_)
    srcs = np.array([op["src"] for op in edges], dtype=np.int64)
    dsts = np.array([op["dst"] for op in edges], dtype=np.int64)
    return inserts, srcs, dsts


@dataclass(frozen=True)
class UpdateResult:
    """What an accepted batch produced."""

    graph_version: str  # version after the batch: "<base checksum>.<seq>"
    seq: int  # batches applied since the base store
    new_nodes: list[int]  # ids given to the batch's add_node operations
    applied: int  # operations applied


class DynamicStore:
    """Mutable graph + features + update log; hand ``graph`` and ``features`` to the Engine."""

    def __init__(
        self,
        graph: GraphStore,
        features: FeatureStore,
        log_path: str | Path,
        fsync: FsyncPolicy | str = FsyncPolicy.ALWAYS,
        compact_above: float = 0.5,
        read_only: bool = False,
    ) -> None:
        """``read_only``: replay the log without touching it (no writes, no torn-tail repair);
        ``apply`` then raises ReadOnlyStoreError. For tools beside a live server."""
        self.graph = DynamicGraph(graph)
        self.features = DynamicFeatures(features)
        self._lock = ReadWriteLock()
        self.graph.acquire_read = self._acquire_read  # type: ignore[method-assign]
        self.graph.release_read = self._lock.release_read  # type: ignore[method-assign]
        self._writer = threading.Lock()  # one batch at a time: validate, log, apply
        self.compact_above = compact_above
        self.presampler: PreSampler | None = None  # attached after replay, built from its state
        self.replayed = self._replay(log_path, graph.version, truncate=not read_only)
        self.log = None if read_only else UpdateLog(log_path, fsync)
        if self.log is not None and self.graph.seq == 0 and self.log.path.stat().st_size == 0:
            self.log.append(0, [{"op": "base", "checksum": graph.version}])
        self._stop = threading.Event()
        self._compactor = threading.Thread(target=self._compact_loop, daemon=True)
        self._compactor.start()
        warm_up_updates()  # before serving: the first real update must not wait on numba JIT

    def attach(self, presampler: PreSampler) -> None:
        """Keep ``presampler``'s reservoirs current: every applied batch is reported to it."""
        warm_up_updates(presampler.fanouts)
        self.presampler = presampler

    def _acquire_read(self) -> str:
        self._lock.acquire_read()
        return self.graph.version

    def _replay(self, path: str | Path, base_version: str, truncate: bool) -> int:
        """Apply every logged batch after checking the log belongs to this base store.

        A corrupt log raises StoreFormatError (see graph.wal) once the good records before the
        damage are applied: the half-built store is then discarded with the exception."""
        applied = 0
        for seq, ops in replay(path, truncate):
            if seq == 0:
                header = ops[0] if ops and isinstance(ops[0], dict) else {}
                if header.get("checksum") != base_version:
                    raise StoreFormatError(
                        f"update log {path} was written for store {header.get('checksum')}, "
                        f"not {base_version}",
                        "wal",
                    )
                continue
            self._apply(self._replayed_batch(path, seq, ops), seq)
            applied += 1
        if applied:
            log.info(
                "replayed %d update batches from %s (version %s)", applied, path, self.graph.version
            )
        return applied

    def _replayed_batch(self, path: str | Path, seq: int, ops: Any) -> ParsedBatch:
        """A logged batch, validated as the update API validates it; StoreFormatError (the log
        left as it is) when the API would refuse it: older versions accepted feature values that
        overflow float32."""
        try:
            return self._parse(ops)
        except InvalidInputError as exc:
            errors = exc.errors if isinstance(exc, UpdateRejectedError) else []
            where = f", op {errors[0]['index']}" if errors else ""
            raise StoreFormatError(
                f"update log {path}: the batch with seq {seq}{where} cannot be applied: "
                f"{errors[0]['message'] if errors else exc.message}. The log was left unchanged; "
                "the server does not start from a log holding a batch it would refuse",
                "wal",
            ) from None

    def _parse(self, ops: Any) -> ParsedBatch:
        g = self.graph
        return parse_batch(ops, g.num_nodes, self.features.dim, g.count_edges)

    def apply(self, ops: Any) -> UpdateResult:
        """Validate, log durably, apply; UpdateRejectedError (nothing applied) when invalid."""
        with self._writer:
            batch = self._parse(ops)
            seq = self.graph.seq + 1
            if self.log is None:
                raise ReadOnlyStoreError("this store was opened read-only", "ops")
            self.log.append(seq, batch.ops)
            self._apply(batch, seq)
            return UpdateResult(self.graph.version, seq, batch.new_nodes, len(batch.ops))

    def _apply(self, batch: ParsedBatch, seq: int) -> None:
        g, f = self.graph, self.features
        edges = _edge_arrays(batch)  # built before the lock: readers wait only for the kernels
        self._lock.acquire_write()
        try:
            for op in batch.ops:  # node ops first: edges may use the new ids
                if op["op"] == "add_node":
                    g.add_node()
                    f.append(op["features"])
                elif op["op"] == "upsert_features":
                    f.upsert(op["node"], op["features"])
            if edges is not None:
                g.apply_edge_events(*edges)
            g.seq = seq
            if self.presampler is not None:
                self._report(batch, edges)
        finally:
            self._lock.release_write()

    def _report(self, batch: ParsedBatch, edges: EdgeArrays | None) -> None:
        """Tell the pre-sampler what changed: new nodes first (edgeless), then edge events."""
        assert self.presampler is not None
        for _ in batch.new_nodes:
            self.presampler.on_add_node()
        if edges is not None:
            inserts, srcs, dsts = edges
            kinds = np.where(inserts, INSERT, DELETE)
            self.presampler.apply_events(kinds, srcs, dsts, self.graph.neighbors)

    def compact(self) -> None:
        """Defragment the adjacency: copy with writers paused, swap under a brief write lock."""
        with self._writer:
            parts = self.graph.compacted()  # readers keep running on the current arrays
            self._lock.acquire_write()
            try:
                self.graph.install_compacted(parts)
            finally:
                self._lock.release_write()

    def _compact_loop(self) -> None:
        while not self._stop.wait(1.0):
            if self.graph.fragmentation() > self.compact_above:
                start = time.perf_counter()
                self.compact()
                log.info("compacted adjacency in %.1f ms", (time.perf_counter() - start) * 1e3)

    def close(self) -> None:
        """Stop the compactor and close the log."""
        self._stop.set()
        self._compactor.join(5)
        if self.log is not None:
            self.log.close()
