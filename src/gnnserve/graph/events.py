"""What a subscriber to graph changes implements: the :class:`UpdateListener` protocol.

A changing graph (``gnnserve.dynamic.store.DynamicStore``) reports every batch it applies to the
listeners subscribed to it (the pre-sampler, DGS workers), so they stay current without the
store knowing what they are. For each applied batch the store calls each listener, in
subscription order:

1. ``on_add_nodes(count)`` when the batch added nodes: ids ``N .. N + count - 1`` (N = node
   count before the batch); their edges, if any, follow as edge events;
2. ``on_edge_events(kinds, srcs, dsts, neighbors_of)`` when the batch had edge operations:
   every event in batch order, ``kinds[i]`` :data:`INSERT` (one ``srcs[i] -> dsts[i]`` edge
   added) or :data:`DELETE` (one such edge removed; it existed), int64 arrays of equal length.
   ``neighbors_of(v)`` returns v's in-neighbours (int64, a copy) after the WHOLE batch;
3. ``on_feature_rows(ids)``, only on listeners that define it, when the batch rewrote the
   features of existing nodes: their ids (int64, repeats possible; added nodes not included).

Both calls come after the graph and the features applied the whole batch, before any reader
can pin the batch's version; no other batch starts until every listener returned. Calls for one
batch are never interleaved with another batch's.

A listener whose state readers read while batches arrive (the pre-sampler) is a
:class:`ReplicatedListener`: the store keeps one copy of it beside each copy of the graph
(``dynamic.leftright``): the copy beside the graph copy that applies a batch first is called as
above (before the plain listeners are called once); the other copy then catches up with
``copy_changes`` from it. Through ``follow`` the store tells the subscribed object which copy
the calling thread's pinned version reads.

A listener that reads the batches from the durable update log itself (the DGS workers, which
consume it by offset) is a :class:`PublishListener` instead: it is told only that batch ``seq``
is durable and the graph has ``num_nodes`` nodes, at the same point of the batch.

A listener must not raise: the batch is already durable and applied, so an exception leaves
that listener (and the ones after it) behind the graph; it reaches the writer that sent the
batch. The arrays belong to the store:
read them, do not keep or modify them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

INSERT = 0  # edge event kind: one src -> dst edge added
DELETE = 1  # edge event kind: one src -> dst edge removed

NeighborsOf = Callable[[int], np.ndarray]  # v -> v's current in-neighbour ids (after the batch)


@dataclass(frozen=True)
class SegmentLists:
    """In-neighbour lists as arrays a kernel can read: row r's list is
    ``cols[start[r] : start[r] + degree[r]]`` (int64 arrays). Called with a row, it returns
    that list (a copy), so where rows are node ids it is a :data:`NeighborsOf` too: the form a
    changing graph passes to ``on_edge_events``, which lets the pre-sampler refill inside one
    kernel instead of calling back per refill."""

    start: np.ndarray
    degree: np.ndarray
    cols: np.ndarray

    def __call__(self, row: int) -> np.ndarray:
        lo = int(self.start[row])
        return np.array(self.cols[lo : lo + int(self.degree[row])], dtype=np.int64)


@runtime_checkable
class UpdateListener(Protocol):
    """Receives the changes of a graph, batch by batch, as described in this module."""

    def on_add_nodes(self, count: int) -> None:
        """``count`` nodes were added, with the next free ids."""

    def on_edge_events(
        self, kinds: np.ndarray, srcs: np.ndarray, dsts: np.ndarray, neighbors_of: NeighborsOf
    ) -> None:
        """Edge events of one batch, in order (kinds INSERT / DELETE)."""


@runtime_checkable
class ReplicatedListener(UpdateListener, Protocol):
    """An UpdateListener that readers read: one copy per copy of the graph (module docstring)."""

    def clone(self) -> ReplicatedListener:
        """An independent copy in the same state, which reads only itself."""

    def follow(self, current: Callable[[], ReplicatedListener]) -> None:
        """Serve reads from ``current()``: the copy of the calling thread's pinned version."""

    def copy_changes(self, source: ReplicatedListener, touched: np.ndarray) -> None:
        """Become equal to ``source``, a copy that has applied one more batch, whose edge events
        ended at the vertices ``touched`` (the batch's new nodes are beyond this copy's)."""


@runtime_checkable
class PublishListener(Protocol):
    """Told of each batch once it is in the update log, to read the batch from there."""

    def on_published(self, seq: int, num_nodes: int) -> None:
        """Batch ``seq`` is durable in the log; the graph now has ``num_nodes`` nodes."""
