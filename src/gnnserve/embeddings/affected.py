"""Which precomputed embeddings a committed graph update can change (issue 29, part 1).

Layer ``l``'s embedding of ``v`` is a function of layer ``l - 1`` at ``v`` and at its
in-neighbours (and, for degree-normalised models such as GCN, of their in-degrees). After a
batch that inserted or deleted edges ``src -> dst``, changed the features of some nodes and added
nodes, the nodes whose layer-``l`` embedding can differ are ``A_l``:

- ``A_1 = X ∪ out(X) ∪ S ∪ [D ∪ out(D)]``, where ``X`` are the nodes whose features changed and
  the added ones, ``S`` the destinations of the edge events (their in-neighbourhood changed) and
  the added nodes, and ``D`` (degree-normalised models only) the nodes whose in-degree changed,
  the destinations again: their out-neighbours' normalisation changed;
- ``A_l = A_{l-1} ∪ out(A_{l-1})`` for ``l >= 2`` (every layer reads its own row's previous
  layer, so the sets grow; ``S`` and ``D`` are already in ``A_1``).

``out(.)`` follows the out-edges of the graph AFTER the batch (an edge the batch deleted has its
destination in ``S`` already). The expansion is a numba kernel over a persistent mark array that
it resets entry by entry, so a batch costs time proportional to its affected sets and their
out-edges, not to the graph.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numba
import numpy as np


@dataclass(frozen=True)
class BatchChanges:
    """What one committed batch changed (int64 node ids, any order, repeats allowed)."""

    edge_dsts: np.ndarray  # destinations of every inserted or deleted edge
    features: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # rows rewritten
    added: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # new node ids


@numba.njit(nogil=True, cache=True)
def _expand(out_start, out_degree, out_indices, seeds, with_out, mark, stamp):  # type: ignore[no-untyped-def]
    """``seeds`` ∪ out(``with_out``) as a sorted unique array; ``mark`` entries equal to
    ``stamp`` flag nodes taken (the caller passes a fresh stamp per call)."""
    total = seeds.shape[0]
    for i in range(with_out.shape[0]):
        total += out_degree[with_out[i]]
    out = np.empty(total, np.int64)
    n = 0
    for i in range(seeds.shape[0]):
        v = seeds[i]
        if mark[v] != stamp:
            mark[v] = stamp
            out[n] = v
            n += 1
    for i in range(with_out.shape[0]):
        u = with_out[i]
        for e in range(out_start[u], out_start[u] + out_degree[u]):
            v = out_indices[e]
            if mark[v] != stamp:
                mark[v] = stamp
                out[n] = v
                n += 1
    result = out[:n].copy()
    result.sort()
    return result


class AffectedSets:
    """Computes ``A_1 .. A_layers`` of each batch on a graph given by its out-adjacency after
    the batch, as (row_start, degree, indices): ``indices[row_start[u] : row_start[u] +
    degree[u]]`` are the ``v`` with ``u -> v`` (a superset of the out-edges gives a superset of
    the sets: still exact, some rows recomputed for nothing). ``degree_normalised``: the model
    reads in-degrees (GCN)."""

    def __init__(self, layers: int, degree_normalised: bool) -> None:
        if layers < 1:
            raise ValueError(f"layers must be >= 1, got {layers}")
        self.layers, self.degree_normalised = int(layers), bool(degree_normalised)
        self._mark = np.zeros(0, np.int64)
        self._stamp = 0

    def _stamp_for(self, num_nodes: int) -> int:
        if self._mark.size < num_nodes:  # grown graph: a larger map (stamps restart)
            self._mark = np.zeros(num_nodes + num_nodes // 4, np.int64)
            self._stamp = 0
        self._stamp += 1
        return self._stamp

    def compute(
        self,
        out_start: np.ndarray,
        out_degree: np.ndarray,
        out_indices: np.ndarray,
        changes: BatchChanges,
        num_nodes: int | None = None,
    ) -> list[np.ndarray]:
        """[A_1, ..., A_layers]: sorted int64 node ids per layer (module doc); ``num_nodes``
        defaults to ``out_start``'s length (adjacency arrays may have spare rows)."""
        n = out_start.size if num_nodes is None else int(num_nodes)
        adjacency = (out_start, out_degree, out_indices)
        ids = lambda a: np.asarray(a, np.int64).reshape(-1)  # noqa: E731
        dsts, feats, added = ids(changes.edge_dsts), ids(changes.features), ids(changes.added)
        for name, a in (("edge_dsts", dsts), ("features", feats), ("added", added)):
            if a.size and (a.min() < 0 or a.max() >= n):
                raise ValueError(f"{name} holds ids outside [0, {n})")
        x = np.concatenate([feats, added])
        seeds = np.concatenate([x, dsts, added])
        with_out = np.concatenate([x, dsts]) if self.degree_normalised else x
        current = self._expand(adjacency, n, seeds, with_out)
        sets = [current]
        for _ in range(1, self.layers):
            current = self._expand(adjacency, n, current, current)
            sets.append(current)
        return sets

    def _expand(
        self,
        adjacency: tuple[np.ndarray, np.ndarray, np.ndarray],
        num_nodes: int,
        seeds: np.ndarray,
        hop: np.ndarray,
    ) -> np.ndarray:
        """``seeds`` ∪ out(``hop``), sorted."""
        stamp = self._stamp_for(num_nodes)  # first: it may grow the mark array
        return _expand(*adjacency, seeds, hop, self._mark, stamp)  # type: ignore[no-any-return]


def out_adjacency(
    indptr: np.ndarray, indices: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The out-neighbour adjacency (row_start, degree, indices) of a graph given by its
    in-neighbour CSR (a full transpose: for tests and for building the index once; a refresher
    keeps it current per batch)."""
    n = indptr.size - 1
    dst = np.repeat(np.arange(n, dtype=np.int64), np.diff(indptr))
    src = np.asarray(indices, np.int64)
    order = np.argsort(src, kind="stable")
    out_indptr = np.zeros(n + 1, np.int64)
    np.cumsum(np.bincount(src, minlength=n), out=out_indptr[1:])
    return out_indptr[:-1], np.diff(out_indptr), dst[order]
