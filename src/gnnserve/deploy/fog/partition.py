"""What each fog node holds for BSP full-graph inference (Fograph §III-E), from a placement.

Fog j owns the vertices placed on it (ascending ids) and keeps a halo: the in-neighbours of its
vertices owned by other fogs, grouped by owner (ascending owner, then id). Its block has the
owned vertices as destinations and ``owned ++ halo`` as sources (destinations first, as every
gnnserve block), with the in-edges of its owned vertices. Per layer, a fog computes its owned
rows, then sends every other fog the rows that fog's halo holds (``send_rows[r]``: local owned
rows in the order of fog r's halo segment from j), and receives its own halo rows by owner.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
import torch

from gnnserve.errors import InvalidInputError
from gnnserve.types import Block


@dataclass(frozen=True)
class FogPartition:
    """One fog node's share of the graph (ids are global unless named local)."""

    rank: int  # this fog's index
    world: int  # number of fogs
    owned: np.ndarray  # int64 [n_own] global ids placed here, ascending
    halo: np.ndarray  # int64 [n_halo] in-neighbours owned elsewhere, by owner then id
    halo_counts: list[int]  # rows of the halo owned by each fog (0 for this one)
    send_rows: list[np.ndarray]  # per fog r: local owned rows r's halo takes from here
    edge_index: torch.Tensor  # int64 [2, E]: local source (owned ++ halo), local destination
    degree: torch.Tensor  # float32 [n_own + n_halo] full-graph in-degree, self loops excluded

    @property
    def block(self) -> Block:
        """The layer block: sources ``owned ++ halo``, destinations ``owned``."""
        return Block(self.edge_index, self.owned.size + self.halo.size, self.owned.size)


def check_membership(membership: np.ndarray, num_nodes: int, world: int) -> np.ndarray:
    """int64 copy of ``membership`` (fog of each vertex), refused unless one entry per vertex
    and every fog in [0, world) owns at least one vertex."""
    member = np.asarray(membership)
    if member.shape != (num_nodes,) or not np.issubdtype(member.dtype, np.integer):
        raise InvalidInputError(f"membership must be {num_nodes} integer fog indices", "membership")
    member = member.astype(np.int64)
    if num_nodes and (member.min() < 0 or member.max() >= world):
        raise InvalidInputError(f"membership entries must lie in [0, {world})", "membership")
    if np.bincount(member, minlength=world).min() == 0:
        raise InvalidInputError("every fog must own at least one vertex", "membership")
    return member


def local_rows(membership: np.ndarray, world: int) -> np.ndarray:
    """int64 [N]: each vertex's row among its fog's owned vertices (ascending ids)."""
    order = np.argsort(membership, kind="stable")
    starts = np.concatenate([[0], np.cumsum(np.bincount(membership, minlength=world))])
    local = np.empty(membership.size, np.int64)
    local[order] = np.arange(membership.size) - starts[membership[order]]
    return local


def symmetric_adjacency(indptr: np.ndarray, indices: np.ndarray) -> sp.csr_matrix:
    """0/1 CSR [N, N] of the undirected graph (u ~ v when either edge exists), no self loops,
    column indices sorted."""
    n = indptr.size - 1
    dst = np.repeat(np.arange(n), np.diff(indptr))
    src = np.asarray(indices, np.int64)
    a = sp.coo_matrix((np.ones(src.size, np.int8), (src, dst)), shape=(n, n)).tocsr()
    a = ((a + a.T) > 0).astype(np.int32).tocsr()
    a.setdiag(0)
    a.eliminate_zeros()
    a.sort_indices()
    return a


def build_fog_partitions(
    indptr: np.ndarray, indices: np.ndarray, membership: np.ndarray, world: int,
    gcn_degree: np.ndarray,
) -> list[FogPartition]:  # fmt: skip
    """Every fog's :class:`FogPartition` for ``membership`` (vertex -> fog) over the CSR of
    in-neighbours ``(indptr, indices)``; ``gcn_degree``: in-degree without self loops per vertex."""
    n = indptr.size - 1
    member = check_membership(membership, n, world)
    dst_all = np.repeat(np.arange(n), np.diff(indptr))
    src_all = np.asarray(indices, np.int64)
    owners, halos, counts, edges = [], [], [], []
    for j in range(world):
        owned = np.flatnonzero(member == j)
        owners.append(owned)
        mine = member[dst_all] == j
        src, dst = src_all[mine], dst_all[mine]
        foreign = np.unique(src[member[src] != j])
        halo = foreign[np.lexsort((foreign, member[foreign]))]
        local = np.full(n, -1, np.int64)
        local[owned] = np.arange(owned.size)
        local[halo] = owned.size + np.arange(halo.size)
        halos.append(halo)
        counts.append(np.bincount(member[halo], minlength=world).tolist())
        edges.append(torch.from_numpy(np.stack([local[src], local[dst]])))
    row_at_owner = local_rows(member, world)
    parts = []
    for j, owned in enumerate(owners):
        sends = [row_at_owner[halos[r][member[halos[r]] == j]] for r in range(world)]
        sends[j] = np.empty(0, np.int64)
        ids = np.concatenate([owned, halos[j]])
        degree = torch.from_numpy(np.asarray(gcn_degree, np.float32)[ids])
        parts.append(FogPartition(j, world, owned, halos[j], counts[j], sends, edges[j], degree))
    return parts
