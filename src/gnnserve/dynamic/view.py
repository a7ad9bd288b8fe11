"""VersionedGraph: the read side of a changing graph, one version per read.

Readers of any GraphStore bracket what must see one graph version with ``acquire_read`` (which
returns that version) and ``release_read``; on a static store both are no-ops. A changing graph
is served through this wrapper: ``acquire_read`` takes the store's read lock, so no batch is
applied until ``release_read``, which may come from another thread (the engine samples in one
stage and reads features in the next). Every other read is the wrapped graph's: the kernels get
its arrays from ``adjacency()`` exactly as from a static store, one call per batch.
"""

from __future__ import annotations

import numpy as np

from gnnserve.dynamic.graph import DynamicGraph
from gnnserve.dynamic.rwlock import ReadWriteLock
from gnnserve.graph.base import GraphStore


class VersionedGraph(GraphStore):
    """A DynamicGraph as readers see it: reads delegate to it; a read pins one version."""

    mutable = True

    def __init__(self, graph: DynamicGraph, lock: ReadWriteLock) -> None:
        super().__init__(graph.meta)
        self._graph = graph
        self._lock = lock

    @property
    def num_nodes(self) -> int:
        return self._graph.num_nodes

    @property
    def num_edges(self) -> int:
        return self._graph.num_edges

    @property
    def version(self) -> str:
        """``<base checksum>.<batches applied>``."""
        return self._graph.version

    def _adjacency(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return self._graph._adjacency()

    def adjacency(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return self._graph._adjacency()

    def gcn_degree(self, ids: np.ndarray) -> np.ndarray:
        return self._graph.gcn_degree(ids)

    def acquire_read(self) -> str:
        """Wait while a batch is being applied, then pin the current version; returns it."""
        self._lock.acquire_read()
        return self._graph.version

    def release_read(self) -> None:
        """End a read started with ``acquire_read`` (any thread may end it)."""
        self._lock.release_read()
