"""GraphStore ABC: read access to a graph's in-neighbour lists, validated at the public boundary."""

from __future__ import annotations

import abc
from pathlib import Path

import numpy as np

from gnnserve.data import layout
from gnnserve.data.validate import check_node_ids
from gnnserve.registry import Registry
from gnnserve.urls import local_path


class GraphStore(abc.ABC):
    """Topology of a graph as in-neighbour lists.

    Node v's in-neighbours are ``indices[row_start[v] : row_start[v] + degree[v]]`` of
    ``adjacency()``: a static CSR and a dynamic store with slack share that view, so every kernel
    reads both. Subclasses implement ``_adjacency``; public methods check node ids.
    Readers of a mutable store bracket their reads with ``acquire_read``/``release_read`` (in
    one thread, or handed over with ``detach_read``/``attach_read``).
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

    mutable = False  # True for stores whose content changes while served
    local = True  # False for a remote store whose whole-graph arrays are never read here

    @property
    def version(self) -> str:
        """Identity of the graph content (the store checksum)."""
        return self.meta.checksum

    @abc.abstractmethod
    def _adjacency(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(row_start int64 [>=N], degree int64 [>=N], indices [>=E]) arrays, read-only."""

    def adjacency(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The raw (row_start, degree, indices) arrays, for kernels."""
        return self._adjacency()

    def csr(self) -> tuple[np.ndarray, np.ndarray]:
        """A compact CSR (indptr int64 [N+1], indices [E]) of the current graph."""
        row_start, degree, indices = self._adjacency()
        n = self.num_nodes
        indptr = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(degree[:n], out=indptr[1:])
        starts = np.repeat(row_start[:n] - indptr[:-1], degree[:n])
        return indptr, np.asarray(indices)[starts + np.arange(indptr[-1])]

    def acquire_read(self) -> str:
        """Pin the current version for a reader; returns it. A no-op on immutable stores."""
        return self.version

    def release_read(self) -> None:  # noqa: B027 - deliberately a no-op for immutable stores
        """End a read started with ``acquire_read``."""

    def detach_read(self) -> object:
        """Hand this thread's pinned read to another thread (``attach_read`` there); the read
        stays pinned. A no-op on immutable stores."""
        return None

    def attach_read(self, pin: object) -> None:  # noqa: B027 - deliberately a no-op
        """Take over a read ``detach_read`` handed off, in this thread."""

    def check_nodes(self, nodes: np.ndarray, field: str = "nodes") -> np.ndarray:
        """Return ``nodes`` as int64 after checking they are valid ids of this graph."""
        return check_node_ids(nodes, self.num_nodes, field)

    def in_degree(self, nodes: np.ndarray | None = None) -> np.ndarray:
        """In-degree (int64) of ``nodes``, or of every node when None."""
        degree = self._adjacency()[1]
        if nodes is None:
            return np.array(degree[: self.num_nodes], dtype=np.int64)
        return np.asarray(degree[self.check_nodes(nodes)], dtype=np.int64)

    def in_degree_without_self_loops(self) -> np.ndarray:
        """In-degree (int64) of every node, self loops not counted (GCN normalisation uses it)."""
        indptr, indices = self.csr()
        deg = np.diff(indptr)
        dst = np.repeat(np.arange(self.num_nodes, dtype=np.int64), deg)
        loops = np.bincount(dst[np.asarray(indices) == dst], minlength=self.num_nodes)
        return deg - loops

    def gcn_degree(self, ids: np.ndarray) -> np.ndarray:
        """In-degree without self loops of valid ``ids``, float32 (GCN normalisation)."""
        if not hasattr(self, "_gcn_degree"):
            self._gcn_degree = self.in_degree_without_self_loops().astype(np.float32)
        return self._gcn_degree[ids]

    def neighbors(self, node: int) -> np.ndarray:
        """In-neighbours of one node (a copy, int64)."""
        v = int(self.check_nodes(np.array([node]), "node")[0])
        row_start, degree, indices = self._adjacency()
        lo = int(row_start[v])
        return np.array(indices[lo : lo + int(degree[v])], dtype=np.int64)


GRAPH_STORES: Registry[GraphStore] = Registry("graph_store")


def open_graph_store(
    store_dir: str | Path, backend: str = "memory", check_structure: bool = True
) -> GraphStore:
    """Open the graph of ``store_dir`` (a path or file URL) with the backend ``backend``.

    ``check_structure``: scan the CSR for out-of-range entries first (see ``data.integrity``).
    """
    root = local_path(store_dir, "store")
    meta = layout.read_meta(root)
    return GRAPH_STORES.create(backend, root, meta, check_structure=check_structure)
