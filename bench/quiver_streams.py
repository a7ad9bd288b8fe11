"""Request streams and feature-access counting for the Quiver placement benchmark.

A stream is a sequence of one-seed requests: ``zipf`` draws seeds by a power law of popularity
(exponent ``ZIPF_A`` over a random permutation of the nodes), ``uniform`` uniformly. Accesses
are counted by running gnnserve's own sampler on every request: a node's feature is read once
per request whose sampled input nodes include it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gnnserve.graph.base import GraphStore
from gnnserve.sampling.sampler import NeighborSampler

ZIPF_A = 1.1  # popularity ~ rank^-1.1 (web and social request logs are near 1)
STREAMS = ("zipf", "uniform")


def popularity(kind: str, n: int, seed: int) -> np.ndarray:
    """p0 of a stream kind: float64 [n], sums to 1."""
    if kind == "uniform":
        return np.full(n, 1.0 / n)
    weights = 1.0 / np.arange(1, n + 1) ** ZIPF_A
    p = weights[np.random.default_rng(seed).permutation(n)]
    return p / p.sum()


def draw_seeds(p0: np.ndarray, requests: int, seed: int) -> np.ndarray:
    """``requests`` seeds drawn from ``p0``."""
    return np.random.default_rng(seed).choice(p0.size, size=requests, p=p0).astype(np.int64)


@dataclass
class Accesses:
    """Per-node feature reads of a stream, in total and per server (seed routed by hash)."""

    total: np.ndarray  # int64 [N]: requests that read each node
    per_server: dict[int, np.ndarray]  # P -> int64 [P, N]: reads by server p's requests
    rows_read: int  # sum of total


def count_accesses(
    graph: GraphStore, fanouts: list[int], seeds: np.ndarray, servers: tuple[int, ...]
) -> Accesses:
    """Run the sampler on each seed; count reads in total and, for each P in ``servers``, per
    server when requests go to server ``seed mod P`` (DGL-style hash routing)."""
    n = graph.num_nodes
    sampler = NeighborSampler(graph, fanouts, seed=11)
    total = np.zeros(n, dtype=np.int64)
    per = {p: np.zeros((p, n), dtype=np.int64) for p in servers}
    for i, s in enumerate(seeds):
        read = sampler.sample(np.array([s]), rng_seed=i).input_nodes
        total[read] += 1
        for p, counts in per.items():
            counts[int(s) % p, read] += 1
    return Accesses(total, per, int(total.sum()))


def hit_rate(accesses: np.ndarray, held: np.ndarray) -> float:
    """Share of reads (``accesses`` per node) that find their row in ``held`` (bool [N])."""
    return float(accesses[held].sum() / max(accesses.sum(), 1))
