"""Quiver's workload metrics (Quiver §4.1, §5.1): PSGS per seed and FAP per node.

PSGS is the expected sampled-subgraph size per seed under the served sampler: 1 (the seed) plus
the edges it draws (the nodes before dedupe; the sampler's work).

Computed with one sparse matrix-vector product per hop, O(k|E|), never by materialising A^k.
The served sampler (``NeighborSampler``, DGL-style blocks) draws at hop h for every node reached
so far: a node v reached by hop h draws c_h(v) = min(deg v, f_h) neighbours at hop h and again
at every later hop, each neighbour u with probability c_h(v)/deg v. So the expected edges drawn
because v is present from hop h on are
    E_h(v) = c_h(v) + E_{h+1}(v) + sum_{u in N(v)} c_h(v)/deg(v) * E_{h+1}(u),   E_K = 0,
and PSGS(v) = 1 + E_0(v). Exact for one and two hops (a node's draws are distinct and the last
hop's do not expand); from three hops on, a node reached twice in one sample is expanded once,
so PSGS is an upper bound (within 5% on the graphs tested).

FAP is the probability that a request reads a node's feature (Quiver §5.1), propagated from the
seed distribution p0 through the same transition probabilities a_h(v, u) = min(deg v, f_h)/deg v,
one sparse product per hop. gnnserve's sampler draws at hop h from every node reached so far
(DGL-style blocks), so the walk sum reads m_0 = p0, m_h = m_{h-1} + A_h^T m_{h-1}, FAP = m_K:
the expected number of (seed or draw) events that reach a node. It is exact for one hop and, by
the union bound, an upper bound on the inclusion probability for more (two paths to one node are
one read); nodes rank the same way, which is what placement needs.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from gnnserve.errors import InvalidInputError
from gnnserve.fanouts import check_fanouts
from gnnserve.graph.base import GraphStore


def _adjacency(graph: GraphStore) -> tuple[sp.csr_matrix, np.ndarray]:
    """The 0/1 sampling adjacency (row v: the neighbours v draws from) and the degrees."""
    indptr, indices = graph.csr()
    n = graph.num_nodes
    adjacency = sp.csr_matrix(
        (np.ones(len(indices), dtype=np.float64), np.asarray(indices), np.asarray(indptr)),
        shape=(n, n),
    )
    return adjacency, np.diff(indptr).astype(np.float64)


def _drawn(deg: np.ndarray, fanout: int) -> tuple[np.ndarray, np.ndarray]:
    """Neighbours drawn per node at one hop, and the chance each neighbour is among them."""
    drawn = deg if fanout < 0 else np.minimum(deg, fanout)
    return drawn, np.divide(drawn, deg, out=np.zeros(deg.size), where=deg > 0)


def psgs(graph: GraphStore, fanouts: list[int]) -> np.ndarray:
    """float64 [N]: expected sampled nodes before dedupe (1 + edges drawn) per seed under
    ``fanouts``, as the served sampler draws them (module docstring)."""
    fanouts = check_fanouts(fanouts)
    adjacency, deg = _adjacency(graph)
    expected = np.zeros(graph.num_nodes)
    for fanout in reversed(fanouts):
        drawn, keep = _drawn(deg, fanout)
        expected = drawn + expected + keep * (adjacency @ expected)
    return 1.0 + expected


def fap(graph: GraphStore, fanouts: list[int], p0: np.ndarray | None = None) -> np.ndarray:
    """float64 [N]: feature access probability per node for one-seed requests whose seed is
    drawn from ``p0`` (float [N], non-negative, normalised here; None: uniform). Multiply by the
    seeds per request for a batch. O(K |E|): K sparse matrix-vector products."""
    fanouts = check_fanouts(fanouts)
    n = graph.num_nodes
    presence = seed_distribution(p0, n)
    if n == 0:
        return presence
    adjacency, deg = _adjacency(graph)
    adjacency_t = adjacency.T.tocsr()
    for fanout in fanouts:
        presence = presence + adjacency_t @ (_drawn(deg, fanout)[1] * presence)
    return presence


def seed_distribution(p0: np.ndarray | None, n: int) -> np.ndarray:
    """``p0`` checked and normalised to sum 1 (float64 [n]); uniform when None."""
    if p0 is None:
        return np.full(n, 1.0 / n) if n else np.zeros(0)
    p = np.asarray(p0, dtype=np.float64)
    if p.shape != (n,):
        raise InvalidInputError(f"p0 must have shape ({n},), got {p.shape}", "p0")
    if not np.all(np.isfinite(p)) or (p < 0).any():
        raise InvalidInputError("p0 must be finite and non-negative", "p0")
    total = p.sum()
    if total <= 0:
        raise InvalidInputError("p0 must have a positive sum", "p0")
    return p / total
