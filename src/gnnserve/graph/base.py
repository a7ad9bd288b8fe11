"""GraphStore ABC: read access to a graph's in-neighbour CSR, validated at the public boundary."""

from __future__ import annotations

import abc
from pathlib import Path

import numpy as np

from gnnserve.data import layout
from gnnserve.data.validate import check_node_ids
from gnnserve.registry import Registry


class GraphStore(abc.ABC):
    """Topology of a graph as CSR over in-neighbours.

    Subclasses implement ``_csr``; the public methods check node ids and never return views
    callers could write through.
    """

    def __init__(self, meta: layout.StoreMeta) -> None:
        self.meta = meta

    @property
    def num_nodes(self) -> int:
        """Number of nodes N."""
        return self.meta.num_nodes

    @property
    def num_edges(self) -> int:
        """Number of directed edges stored."""
        return self.meta.num_edges

    @property
    def version(self) -> str:
        """Identity of the graph content (the store checksum)."""
        return self.meta.checksum

    @abc.abstractmethod
    def _csr(self) -> tuple[np.ndarray, np.ndarray]:
        """(indptr int64 [N+1], indices int32/int64 [E]) arrays, read-only."""

    def csr(self) -> tuple[np.ndarray, np.ndarray]:
        """The raw CSR arrays, for kernels (numba reads memory-mapped arrays directly)."""
        return self._csr()

    def check_nodes(self, nodes: np.ndarray, field: str = "nodes") -> np.ndarray:
        """Return ``nodes`` as int64 after checking they are valid ids of this graph."""
        return check_node_ids(nodes, self.num_nodes, field)

    def in_degree(self, nodes: np.ndarray | None = None) -> np.ndarray:
        """In-degree (int64) of ``nodes``, or of every node when None."""
        indptr, _ = self._csr()
        if nodes is None:
            return np.diff(indptr)
        ids = self.check_nodes(nodes)
        return indptr[ids + 1] - indptr[ids]

    def in_degree_without_self_loops(self) -> np.ndarray:
        """In-degree (int64) of every node, self loops not counted (GCN normalisation uses it)."""
        indptr, indices = self._csr()
        deg = np.diff(indptr)
        dst = np.repeat(np.arange(self.num_nodes, dtype=np.int64), deg)
        loops = np.bincount(dst[np.asarray(indices) == dst], minlength=self.num_nodes)
        return deg - loops

    def neighbors(self, node: int) -> np.ndarray:
        """In-neighbours of one node (a copy, int64)."""
        ids = self.check_nodes(np.array([node]), "node")
        indptr, indices = self._csr()
        v = int(ids[0])
        return np.array(indices[indptr[v] : indptr[v + 1]], dtype=np.int64)


GRAPH_STORES: Registry[GraphStore] = Registry("graph_store")


def open_graph_store(store_dir: str | Path, backend: str = "memory") -> GraphStore:
    """Open the graph of ``store_dir`` with the backend registered as ``backend``."""
    meta = layout.read_meta(store_dir)
    return GRAPH_STORES.create(backend, store_dir, meta)
