"""The out-edges of a changing graph, for the affected sets of its batches (issue 29): the PE
refresher and the answer cache each keep one.

:class:`OutEdges` is a reversed copy of the graph that every batch's inserted edges reach at once
(in the writer's thread) and its deletions do not: it holds a superset of the out-edges of every
version from its start on, so the affected sets it gives are supersets (still exact, some rows
recomputed or some answers dropped for nothing). :meth:`OutEdges.rebuild` starts it again from a
graph when deletions pile up.
"""

from __future__ import annotations

import numpy as np

from gnnserve.dynamic.graph import DynamicGraph
from gnnserve.embeddings.affected import AffectedSets, BatchChanges, out_adjacency
from gnnserve.graph.base import GraphStore


class _Reversed(GraphStore):
    """A graph given by its in-neighbour CSR, as a GraphStore (the reversed graph's base)."""

    def __init__(self, meta: object, indptr: np.ndarray, indices: np.ndarray) -> None:
        super().__init__(meta)  # type: ignore[arg-type]
        self._csr = (indptr, np.asarray(indices, np.int64))

    @property
    def num_nodes(self) -> int:
        return int(self._csr[0].size - 1)

    @property
    def num_edges(self) -> int:
        return int(self._csr[1].size)

    @property
    def version(self) -> str:
        return "reversed"

    def _adjacency(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        indptr, indices = self._csr
        return indptr[:-1], np.diff(indptr), indices


def reversed_graph(graph: GraphStore) -> DynamicGraph:
    """A DynamicGraph whose in-neighbours are ``graph``'s out-neighbours."""
    _, degree, indices = out_adjacency(*graph.csr())
    indptr = np.zeros(degree.size + 1, np.int64)
    np.cumsum(degree, out=indptr[1:])
    return DynamicGraph(_Reversed(graph.meta, indptr, indices))


class OutEdges:
    """A superset of a changing graph's out-edges and the affected sets over it (module doc).
    Not thread-safe: the owner serialises calls."""

    def __init__(self, graph: GraphStore, layers: int, degree_normalised: bool) -> None:
        self._reverse = reversed_graph(graph)
        self._affected = AffectedSets(layers, degree_normalised)
        self.deleted = 0  # deletions the copy still holds

    @property
    def num_nodes(self) -> int:
        """Nodes of the newest version seen."""
        return self._reverse.num_nodes

    def add_nodes(self, count: int) -> np.ndarray:
        """``count`` nodes added; returns their ids."""
        first = self._reverse.num_nodes
        self._reverse.add_nodes(count)
        return np.arange(first, first + count, dtype=np.int64)

    def edge_events(self, inserts: np.ndarray, srcs: np.ndarray, dsts: np.ndarray) -> None:
        """A batch's edge events (``inserts`` bool): inserted edges are added, deletions
        counted."""
        if inserts.any():
            ones = np.ones(int(inserts.sum()), bool)
            self._reverse.apply_edge_events(ones, dsts[inserts], srcs[inserts])
        self.deleted += int((~inserts).sum())

    def sets(self, changes: BatchChanges, num_nodes: int) -> list[np.ndarray]:
        """[A_1, ..., A_layers] of ``changes`` on a version of ``num_nodes`` nodes (nodes of
        later batches the copy already holds are dropped)."""
        start, degree, indices = self._reverse.adjacency()
        sets = self._affected.compute(start, degree, indices, changes, self._reverse.num_nodes)
        return [s[s < num_nodes] for s in sets]

    def stale(self, num_edges: int, ratio: float) -> bool:
        """Whether deletions exceed ``ratio`` of ``num_edges`` (plus 1,000)."""
        return self.deleted > ratio * max(num_edges, 1) + 1000

    def rebuild(self, graph: GraphStore) -> None:
        """Start again from ``graph`` (a version with no later batch seen)."""
        self._reverse, self.deleted = reversed_graph(graph), 0
