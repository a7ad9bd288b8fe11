"""Quiver's workload metric PSGS: expected sampled-subgraph size per seed (Quiver §4.1).

Computed with one sparse matrix-vector product per hop, O(k|E|), never by materialising A^k.
With fanout f_h at hop h, a node v in the frontier draws c_h(v) = min(deg v, f_h) neighbours,
each neighbour u with probability c_h(v)/deg v; so the expected edges sampled from v over hops
h..K-1 is E_h(v) = c_h(v) + sum_{u in N(v)} c_h(v)/deg(v) * E_{h+1}(u), with E_K = 0, and
PSGS(v) = 1 + E_0(v) (the seed plus what it pulls in).
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from gnnserve.fanouts import check_fanouts
from gnnserve.graph.base import GraphStore


def psgs(graph: GraphStore, fanouts: list[int]) -> np.ndarray:
    """float64 [N]: expected number of sampled nodes (before dedupe) per seed under ``fanouts``."""
    fanouts = check_fanouts(fanouts)
    indptr, indices = graph.csr()
    n = graph.num_nodes
    deg = np.diff(indptr).astype(np.float64)
    adjacency = sp.csr_matrix(
        (np.ones(len(indices), dtype=np.float64), np.asarray(indices), np.asarray(indptr)),
        shape=(n, n),
    )
    expected = np.zeros(n)
    for fanout in reversed(fanouts):
        drawn = deg if fanout < 0 else np.minimum(deg, fanout)
        keep = np.divide(drawn, deg, out=np.zeros(n), where=deg > 0)
        expected = drawn + keep * (adjacency @ expected)
    return 1.0 + expected
