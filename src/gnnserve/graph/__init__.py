"""Graph storage: the GraphStore ABC and its backends (see ``graph.base``)."""

from gnnserve.graph import csr as _csr  # noqa: F401  (registers the backends)
from gnnserve.graph.base import GRAPH_STORES, GraphStore, open_graph_store

__all__ = ["GRAPH_STORES", "GraphStore", "open_graph_store"]
