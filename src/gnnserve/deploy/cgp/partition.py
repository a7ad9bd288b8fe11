"""Hash partitioning of a graph, its features and PEs, and of new-node requests, for CGP.

Partition p of P owns the existing nodes ``v % P == p`` (local row ``v // P``) and the new
(query) nodes ``i % P == p`` of every request (local row ``i // P``). It keeps:

- the in-edges of *every* node restricted to the edges whose **source** it owns (a CSR over all
  N destinations), so it can aggregate the messages of its own sources into any destination;
- the feature rows and the precomputed-embedding (PE) rows of layers 1..k-1 of its nodes;
- per owned node: the stored in-degree (the ``query_edges_ratio`` policy), the in-degree without
  self loops (GCN normalisation; a global quantity, computed before partitioning) and the
  importance score (``importance`` policy).

A request is split the same way (OMEGA §6.1): each query's features go to the query's owner and
every directed request edge (both directions of each undirected one) to its source's owner. The
query features travel dense or sparse, whichever is smaller (:mod:`~.rows`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from gnnserve.deploy.cgp.rows import EncodedRows, encode_rows, nonzeros
from gnnserve.embeddings.base import EmbeddingStore
from gnnserve.features.base import FeatureStore
from gnnserve.graph.base import GraphStore
from gnnserve.newnodes.overlay import request_in_edges
from gnnserve.types import NewNodes

__all__ = ["Partition", "RequestPart", "build_partitions", "owner", "owned_ids", "split_request"]


def owner(ids: np.ndarray, num_parts: int, num_nodes: int) -> np.ndarray:
    """int64 owning partition of each global id: ``v % P`` for existing nodes, ``(v - N) % P``
    for query nodes (global ids ``N + i``)."""
    ids = np.asarray(ids, dtype=np.int64)
    return np.where(ids >= num_nodes, ids - num_nodes, ids) % num_parts


def owned_ids(rank: int, num_parts: int, count: int) -> np.ndarray:
    """int64 ids in [0, count) owned by ``rank``, ascending (local row i holds id rank + i*P)."""
    return np.arange(rank, count, num_parts, dtype=np.int64)


@dataclass(frozen=True)
class Partition:
    """Everything one CGP worker holds of the stored graph (rows indexed by ``v // P``)."""

    rank: int  # p
    num_parts: int  # P
    num_nodes: int  # N (all partitions)
    indptr: np.ndarray  # int64 [N + 1]: in-edges of every node whose source is owned here
    indices: np.ndarray  # int64 [E_p] their source ids (all owned here), grouped by destination
    features: np.ndarray  # float32 [n_p, F] feature rows of the owned nodes
    feature_nnz: np.ndarray  # int64 [n_p] non-zeros per feature row (sparse transfer sizes)
    pes: list[np.ndarray]  # float32 [n_p, H_l] PE rows of layer l = 1..k-1 (index l - 1)
    in_degree: np.ndarray  # int64 [n_p] stored in-degree of the owned nodes (self loops counted)
    gcn_degree: np.ndarray  # float32 [n_p] stored in-degree without self loops (GCN norm)
    importance: np.ndarray  # float64 [n_p] importance score of the owned nodes

    def in_edges(self, dst: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(source ids, position in ``dst``) of every local-source in-edge of ``dst``, int64."""
        dst = np.asarray(dst, dtype=np.int64)
        lo, hi = self.indptr[dst], self.indptr[dst + 1]
        count = hi - lo
        pos = np.repeat(np.arange(dst.size, dtype=np.int64), count)
        offset = np.arange(int(count.sum()), dtype=np.int64) - np.repeat(
            np.cumsum(count) - count, count
        )
        return self.indices[np.repeat(lo, count) + offset], pos

    def nbytes(self) -> int:
        """Bytes held by this partition's arrays."""
        arrays = [self.indptr, self.indices, self.features, self.feature_nnz, self.in_degree]
        arrays.append(self.gcn_degree)
        return sum(a.nbytes for a in arrays + [self.importance, *self.pes])


def _local_csr(
    indptr: np.ndarray, indices: np.ndarray, rank: int, num_parts: int
) -> tuple[np.ndarray, np.ndarray]:
    """The CSR restricted to edges whose source is owned by ``rank`` (order kept)."""
    n = indptr.size - 1
    keep = indices % num_parts == rank
    dst = np.repeat(np.arange(n, dtype=np.int64), np.diff(indptr))
    out = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(dst[keep], minlength=n), out=out[1:])
    return out, indices[keep]


def build_partitions(
    graph: GraphStore,
    features: FeatureStore,
    embeddings: EmbeddingStore,
    num_parts: int,
    num_layers: int,
    importance: np.ndarray,
) -> list[Partition]:
    """The ``num_parts`` hash partitions of a stored graph with its features and PEs."""
    indptr, raw = graph.csr()
    indices = np.asarray(raw, dtype=np.int64)
    n = graph.num_nodes
    in_degree = graph.in_degree()
    gcn_degree = graph.gcn_degree(np.arange(n, dtype=np.int64)).astype(np.float32)
    parts = []
    for rank in range(num_parts):
        ids = owned_ids(rank, num_parts, n)
        local_indptr, local_indices = _local_csr(indptr, indices, rank, num_parts)
        pes = [embeddings.get(layer, ids).numpy() for layer in range(1, num_layers)]
        rows = features.get(ids).numpy()
        parts.append(
            Partition(
                rank=rank,
                num_parts=num_parts,
                num_nodes=n,
                indptr=local_indptr,
                indices=local_indices,
                features=rows,
                feature_nnz=nonzeros(rows),
                pes=pes,
                in_degree=np.asarray(in_degree[ids], dtype=np.int64),
                gcn_degree=gcn_degree[ids],
                importance=np.asarray(importance[ids], dtype=np.float64),
            )
        )
    return parts


@dataclass(frozen=True)
class RequestPart:
    """The share of one new-node request sent to one worker."""

    num_queries: int  # m: queries of the whole request
    queries: np.ndarray  # int64 [m_p] indices i (i % P == rank) of the queries owned here
    features: EncodedRows  # their float32 [m_p, F] features, in ``queries`` order
    src: np.ndarray  # int64 [E_p] global source ids of the directed request edges owned here
    dst: np.ndarray  # int64 [E_p] their global destination ids

    def nbytes(self) -> int:
        """Payload bytes of this part (features and edge ids)."""
        arrays = (self.queries, self.src, self.dst)
        return int(self.features.nbytes + sum(a.nbytes for a in arrays))


def split_request(new: NewNodes, num_nodes: int, num_parts: int) -> list[RequestPart]:
    """Split ``new``: query features to the query's owner, each directed edge to its source's."""
    src, dst = request_in_edges(new, num_nodes)
    src_owner = owner(src, num_parts, num_nodes)
    out = []
    for rank in range(num_parts):
        queries = owned_ids(rank, num_parts, new.count)
        mine = src_owner == rank
        rows = encode_rows(new.features.index_select(0, torch.from_numpy(queries)))
        out.append(RequestPart(new.count, queries, rows, src[mine], dst[mine]))
    return out
