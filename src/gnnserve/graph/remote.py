"""RemoteCSR: a published store's CSR read by byte ranges from a blob store (FaaS-GNN §4.2).

The row index (``indptr.bin``, int64 [N+1]) and the column index (``indices.bin``) stay remote.
The neighbours of a set of vertices are fetched in two rounds: the row-index pairs
``indptr[v], indptr[v+1]`` (16 bytes at offset 8v), then the column-index segments they point
to. In each round the ranges are merged where adjacent (:func:`gnnserve.data.blobs.coalesce`,
``gap`` bytes apart at most) and issued concurrently, so bytes read grow with the vertices asked
for, never with the graph. ``self_loops.npy`` (written by ``publish``; ids of vertices with a
self loop, with multiplicity) gives the GCN degree of a vertex whose row was not fetched.
"""

from __future__ import annotations

import io
from dataclasses import dataclass

import numpy as np

from gnnserve.data import layout
from gnnserve.data.blobs import BlobStore, coalesce
from gnnserve.data.publish import SELF_LOOPS
from gnnserve.errors import StoreFormatError
from gnnserve.graph.base import GraphStore

_INDPTR_BYTES = 8


@dataclass
class Fetched:
    """Rows fetched for some vertices: vertex i's neighbours are
    ``indices[row_start[i] : row_start[i] + degree[i]]``."""

    degree: np.ndarray  # int64 [n] in-degree of each vertex in the full graph
    row_start: np.ndarray  # int64 [n] offset of its segment in ``indices`` (0 when not fetched)
    indices: np.ndarray  # int64 [sum of fetched degrees] the concatenated neighbour lists
    requests: int  # range requests issued
    bytes_read: int  # payload bytes received


class RemoteCSR:
    """The in-neighbour CSR of a published store, read on demand; ``gap``: merge ranges at most
    this many bytes apart (0: only adjacent or overlapping ranges)."""

    def __init__(self, blobs: BlobStore, gap: int = 0) -> None:
        self.blobs = blobs
        self.gap = int(gap)
        self.meta = layout.read_blob_meta(blobs)
        self._itemsize = np.dtype(self.meta.indices_dtype).itemsize
        self._check_sizes()
        self.self_loops = self._read_self_loops()

    @property
    def num_nodes(self) -> int:
        """Number of vertices N."""
        return self.meta.num_nodes

    @property
    def version(self) -> str:
        """The store checksum (graph identity)."""
        return self.meta.checksum

    def _check_sizes(self) -> None:
        n, e = self.meta.num_nodes, self.meta.num_edges
        for name, expected in (
            (layout.INDPTR, (n + 1) * _INDPTR_BYTES),
            (layout.INDICES, e * self._itemsize),
        ):
            size = self.blobs.size(name)
            if size != expected:
                raise StoreFormatError(
                    f"{self.blobs.url}/{name}: {size} bytes, expected {expected} for the "
                    f"{n} nodes and {e} edges of meta.json",
                    "remote",
                )

    def _read_self_loops(self) -> np.ndarray | None:
        data = self.blobs.get_optional(SELF_LOOPS)
        if data is None:
            return None
        loops = np.load(io.BytesIO(data), allow_pickle=False)
        return np.asarray(loops, dtype=np.int64)

    def fetch_degrees(self, nodes: np.ndarray) -> tuple[np.ndarray, np.ndarray, int, int]:
        """Row-index pairs of ``nodes`` (valid int64 ids): (start, degree, requests, bytes)."""
        if nodes.size == 0:
            empty = np.empty(0, dtype=np.int64)
            return empty, empty, 0, 0
        lo = nodes * _INDPTR_BYTES
        words, requests, nbytes = self._read_ranges(layout.INDPTR, lo, lo + 2 * _INDPTR_BYTES)
        pairs = words.view("<i8").reshape(-1, 2).astype(np.int64)
        return pairs[:, 0], pairs[:, 1] - pairs[:, 0], requests, nbytes

    def fetch_rows(self, nodes: np.ndarray) -> Fetched:
        """Degrees and neighbour lists of ``nodes`` (valid int64 ids): two rounds of requests."""
        start, degree, req1, bytes1 = self.fetch_degrees(nodes)
        has = degree > 0
        lo = start[has] * self._itemsize
        hi = lo + degree[has] * self._itemsize
        raw, req2, bytes2 = self._read_ranges(layout.INDICES, lo, hi)
        dtype = np.dtype(self.meta.indices_dtype).newbyteorder("<")
        indices = raw.view(dtype).astype(np.int64)
        row_start = np.zeros(nodes.size, dtype=np.int64)
        row_start[has] = np.cumsum(degree[has]) - degree[has]
        return Fetched(degree, row_start, indices, req1 + req2, bytes1 + bytes2)

    def _read_ranges(
        self, name: str, lo: np.ndarray, hi: np.ndarray
    ) -> tuple[np.ndarray, int, int]:
        """Bytes ``[lo[i], hi[i])`` of ``name`` concatenated in input order (uint8), fetched as
        merged ranges; also the requests issued and bytes received."""
        if lo.size == 0:
            return np.empty(0, dtype=np.uint8), 0, 0
        m_lo, m_hi, group = coalesce(lo, hi, self.gap)
        parts = self.blobs.get_ranges(name, m_lo, m_hi)
        buf = np.frombuffer(b"".join(parts), dtype=np.uint8)
        part_at = np.zeros(m_lo.size, dtype=np.int64)
        np.cumsum(m_hi[:-1] - m_lo[:-1], out=part_at[1:])
        first = part_at[group] + (lo - m_lo[group])  # where range i starts in buf
        length = hi - lo
        out_at = np.cumsum(length) - length
        take = np.repeat(first - out_at, length) + np.arange(int(length.sum()), dtype=np.int64)
        return buf[take], m_lo.size, int(buf.size)

    def gcn_degree(
        self, nodes: np.ndarray, degree: np.ndarray, loops: np.ndarray | None = None
    ) -> np.ndarray:
        """In-degree without self loops (float32) of ``nodes`` with in-degree ``degree``;
        ``loops`` (their self-loop counts, from their fetched rows) when the store has no loop
        table (published by hand): then it is required."""
        if loops is not None:
            return (degree - loops).astype(np.float32)
        if self.self_loops is None:
            raise StoreFormatError(
                f"{self.blobs.url} has no {SELF_LOOPS}: count loops in fetched rows", "remote"
            )
        if self.self_loops.size == 0:
            return degree.astype(np.float32)
        lo = np.searchsorted(self.self_loops, nodes, side="left")
        hi = np.searchsorted(self.self_loops, nodes, side="right")
        return (degree - (hi - lo)).astype(np.float32)


def count_self_loops(nodes: np.ndarray, rows: Fetched) -> np.ndarray:
    """Self loops (int64) of each of ``nodes`` in its fetched row; ``rows`` holds the rows of
    ``nodes`` packed in their order, as :meth:`RemoteCSR.fetch_rows` returns them."""
    owner = np.repeat(np.arange(nodes.size), rows.degree)
    return np.bincount(owner[rows.indices == nodes[owner]], minlength=nodes.size)


class RemoteGraphStore(GraphStore):
    """A published store as a gateway sees it (``--deploy faas``): node count, version, id
    checks and per-node look-ups by byte ranges. The whole-graph arrays are never read here:
    function instances sample on demand, so ``adjacency`` refuses."""

    local = False

    def __init__(self, remote: RemoteCSR) -> None:
        super().__init__(remote.meta)
        self.remote = remote

    def _adjacency(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        raise StoreFormatError(
            f"{self.remote.blobs.url} is a remote store: its topology is read on demand by the "
            "function instances, not loaded whole",
            "remote",
        )

    def in_degree(self, nodes: np.ndarray | None = None) -> np.ndarray:
        """In-degree (int64) of ``nodes`` (required: the whole graph is not read here)."""
        if nodes is None:
            self._adjacency()
        return self.remote.fetch_degrees(self.check_nodes(nodes))[1]  # type: ignore[arg-type]

    def gcn_degree(self, ids: np.ndarray) -> np.ndarray:
        """In-degree without self loops of valid ``ids``, float32, read by byte ranges."""
        if self.remote.self_loops is not None:
            return self.remote.gcn_degree(ids, self.remote.fetch_degrees(ids)[1])
        rows = self.remote.fetch_rows(ids)  # no loop table: count loops in the rows
        return self.remote.gcn_degree(ids, rows.degree, count_self_loops(ids, rows))

    def neighbors(self, node: int) -> np.ndarray:
        """In-neighbours of one node, read by byte ranges (int64)."""
        v = self.check_nodes(np.array([node]), "node")
        return self.remote.fetch_rows(v).indices.copy()
