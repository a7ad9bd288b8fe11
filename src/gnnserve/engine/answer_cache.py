"""The answer cache for existing nodes (issue 29, part 4; ``--result-cache MB``).

Only full-neighbourhood answers are cached (every fanout -1: a node's answer is then a function
of the graph version alone). Fixed-seed sampled answers are not: a node's draws are keyed by
(seed, hop, node), but a node met at an earlier hop of another seed in the same batch has its
neighbourhood sampled there, so the answer depends on the batch it ran in.

An entry is one node's answer row for one output kind, with the batch count ``seq`` of the graph
version it was computed at. Each committed batch (the cache listens to the store) marks the
nodes whose answer can change, its last-layer affected set (:mod:`gnnserve.embeddings.affected`,
over :class:`~gnnserve.embeddings.tracking.OutEdges`), as invalidated at that batch's ``seq``.
A request pinned at version ``v`` is answered from the cache when every node has an entry
computed at ``seq <= seq(v)`` and not invalidated since: then nothing its answer depends on
changed between the entry's version and ``v``, and the answer reports ``v``. Entries are
evicted least recently used beyond the byte budget; invalidated ones are dropped when next met.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from gnnserve.dynamic.graph import version_seq
from gnnserve.embeddings.affected import BatchChanges
from gnnserve.embeddings.tracking import OutEdges
from gnnserve.graph.base import GraphStore
from gnnserve.graph.events import INSERT, NeighborsOf
from gnnserve.types import Request, Result, StageTimings

ENTRY_OVERHEAD = 120  # bytes per entry beyond its row (key, tuple, dict slot): an estimate


class RequestIds(Protocol):
    """Where answers get their request ids (the engine's admission)."""

    def next_id(self) -> int:
        """A fresh request id."""


@dataclass
class CacheStats:
    """Counters for /metrics."""

    hits: int = 0  # requests answered from the cache
    misses: int = 0  # cacheable requests computed
    invalidated_nodes: int = 0  # nodes marked by committed batches (with repeats)
    dropped: int = 0  # entries found invalidated and removed
    evicted: int = 0  # entries removed for the byte budget


class AnswerCache:
    """Per-node answers of full-neighbourhood requests (module doc); ``max_bytes`` bounds it.
    ``graph``: the graph at start (its out-edges are copied); ``layers`` and
    ``degree_normalised``: the model's (GCN reads in-degrees); ``batch_seq()``: the batch count
    of the newest version (the batch a listener call reports; a fixed graph: always 0)."""

    def __init__(
        self,
        graph: GraphStore,
        max_bytes: int,
        layers: int,
        degree_normalised: bool,
        batch_seq: Callable[[], int] = lambda: 0,
    ) -> None:
        self.max_bytes, self.bytes = int(max_bytes), 0
        self.stats = CacheStats()
        self._out = OutEdges(graph, layers, degree_normalised)
        self._invalid_at = np.zeros(graph.num_nodes + 1024, np.int64)  # seq of last change
        self._entries: OrderedDict[tuple[int, str], tuple[int, np.ndarray]] = OrderedDict()
        self._lock = threading.Lock()
        self._batch_seq = batch_seq

    # ------------------------------------------------------------------ lookups and stores

    def lookup(self, nodes: np.ndarray, output: str, version: str) -> np.ndarray | None:
        """The answer rows of ``nodes`` for ``output`` valid at ``version`` (stacked), or None
        when any is missing or invalidated (a miss)."""
        seq = version_seq(version)
        rows = []
        with self._lock:
            for node in nodes.tolist():
                key = (node, output)
                entry = self._entries.get(key)
                if entry is not None and entry[0] < self._invalid_at[node]:
                    self._drop(key)
                    self.stats.dropped += 1
                    entry = None
                if entry is None or entry[0] > seq:
                    self.stats.misses += 1
                    return None
                self._entries.move_to_end(key)
                rows.append(entry[1])
            self.stats.hits += 1
        return np.stack(rows)

    def store(self, nodes: np.ndarray, output: str, version: str, values: np.ndarray) -> None:
        """Keep the rows ``values`` of ``nodes`` computed at ``version`` (an entry that a later
        batch already invalidated is refused by :meth:`lookup`)."""
        seq = version_seq(version)
        with self._lock:
            for node, row in zip(nodes.tolist(), values, strict=True):
                key = (node, output)
                if key in self._entries:
                    self._drop(key)
                row = np.array(row, copy=True)
                self._entries[key] = (seq, row)
                self.bytes += row.nbytes + ENTRY_OVERHEAD
            while self.bytes > self.max_bytes and self._entries:
                self._drop(next(iter(self._entries)))
                self.stats.evicted += 1

    def _drop(self, key: tuple[int, str]) -> None:
        _, row = self._entries.pop(key)
        self.bytes -= row.nbytes + ENTRY_OVERHEAD

    def answer(
        self, graph: GraphStore, request: Request, model_version: str, ids: RequestIds
    ) -> Result | None:
        """``request``'s answer from the cache at ``graph``'s current version (pinned while
        read), or None (a miss)."""
        assert request.nodes is not None
        output = request.options.output
        version = graph.acquire_read()
        try:
            rows = self.lookup(request.nodes, output.value, version)
        finally:
            graph.release_read()
        if rows is None:
            return None
        values = torch.from_numpy(rows)
        timings = StageTimings(batch_size=0)  # no batch: nothing sampled or computed
        return Result(ids.next_id(), request.nodes, output, values, model_version, version, timings)

    def keep(self, result: Result) -> None:
        """Keep the rows of a computed full-neighbourhood ``result``."""
        values = result.values.numpy()
        self.store(result.nodes, result.output.value, result.graph_version, values)

    def __len__(self) -> int:
        return len(self._entries)

    # ------------------------------------------------------------------ the store's listener

    def _invalidate(self, changes: BatchChanges) -> None:
        seq = self._batch_seq()  # the batch being reported is the newest
        with self._lock:
            n = self._out.num_nodes
            affected = self._out.sets(changes, n)[-1]
            self._grow(n)
            self._invalid_at[affected] = seq
            self.stats.invalidated_nodes += int(affected.size)

    def _grow(self, num_nodes: int) -> None:
        """Room in ``_invalid_at`` for ``num_nodes`` nodes (under the lock)."""
        if self._invalid_at.size < num_nodes:
            grown = np.zeros(num_nodes + num_nodes // 4 + 1024, np.int64)
            grown[: self._invalid_at.size] = self._invalid_at
            self._invalid_at = grown

    def on_add_nodes(self, count: int) -> None:
        """Added nodes: their own answers are new (nobody cached them); their edges follow."""
        with self._lock:
            self._out.add_nodes(count)
            self._grow(self._out.num_nodes)

    def on_edge_events(
        self, kinds: np.ndarray, srcs: np.ndarray, dsts: np.ndarray, neighbors_of: NeighborsOf
    ) -> None:
        """Edge events: the answers their destinations reach may change."""
        with self._lock:
            self._out.edge_events(kinds == INSERT, srcs, dsts)
        self._invalidate(BatchChanges(np.asarray(dsts, np.int64)))

    def on_feature_rows(self, ids: np.ndarray) -> None:
        """Rewritten features: the answers those nodes reach may change."""
        self._invalidate(BatchChanges(np.zeros(0, np.int64), features=np.asarray(ids)))
