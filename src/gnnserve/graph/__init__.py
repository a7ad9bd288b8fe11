"""Graph storage: the GraphStore ABC and its CSR backends (see ``graph.base``), and the
UpdateListener protocol subscribers of a changing graph implement (``graph.events``)."""

from gnnserve.graph import csr as _csr  # noqa: F401  (registers the backends)
from gnnserve.graph.base import GRAPH_STORES, GraphStore, open_graph_store

__all__ = ["GRAPH_STORES", "GraphStore", "open_graph_store"]
