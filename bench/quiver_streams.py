"""Request streams and feature-access counting for the Quiver placement benchmark.

A stream is a sequence of one-seed requests: ``zipf`` draws seeds by a power law of popularity
(exponent ``ZIPF_A`` over a random permutation of the nodes), ``uniform`` uniformly. Accesses
are counted by running gnnserve's own sampler on every request: a node's feature is read once
per request whose sampled input nodes include it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numba
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
    sequence: np.ndarray  # int64 [rows_read]: every read in stream order (an LRU replays it)


def count_accesses(
    graph: GraphStore, fanouts: list[int], seeds: np.ndarray, servers: tuple[int, ...]
) -> Accesses:
    """Run the sampler on each seed; count reads in total and, for each P in ``servers``, per
    server when requests go to server ``seed mod P`` (DGL-style hash routing)."""
    n = graph.num_nodes
    sampler = NeighborSampler(graph, fanouts, seed=11)
    total = np.zeros(n, dtype=np.int64)
    per = {p: np.zeros((p, n), dtype=np.int64) for p in servers}
    reads = []
    for i, s in enumerate(seeds):
        read = sampler.sample(np.array([s]), rng_seed=i).input_nodes
        reads.append(read)
        total[read] += 1
        for p, counts in per.items():
            counts[int(s) % p, read] += 1
    sequence = np.concatenate(reads) if reads else np.zeros(0, np.int64)
    return Accesses(total, per, int(total.sum()), sequence.astype(np.int64))


def hit_rate(accesses: np.ndarray, held: np.ndarray) -> float:
    """Share of reads (``accesses`` per node) that find their row in ``held`` (bool [N])."""
    return float(accesses[held].sum() / max(accesses.sum(), 1))


@numba.njit(cache=True)
def _lru_hits(warm: np.ndarray, reads: np.ndarray, capacity: int, n: int) -> int:
    """Hits of an LRU cache of ``capacity`` rows replaying ``reads`` after ``warm``: a doubly
    linked list over node ids (head = most recent), O(1) per read."""
    prev = np.full(n + 1, -1, np.int64)  # index n is the list's sentinel
    nxt = np.full(n + 1, -1, np.int64)
    held = np.zeros(n, np.bool_)
    prev[n] = nxt[n] = n
    size, hits = 0, 0
    for phase in range(2):
        seq = warm if phase == 0 else reads
        for i in range(seq.shape[0]):
            v = seq[i]
            if held[v]:
                hits += phase
                nxt[prev[v]], prev[nxt[v]] = nxt[v], prev[v]  # unlink
            elif size == capacity:  # evict the least recent (the sentinel's prev)
                old = prev[n]
                nxt[prev[old]], prev[n] = n, prev[old]
                held[old] = False
            else:
                size += 1
            held[v] = True
            prev[v], nxt[v] = n, nxt[n]  # link at the head
            prev[nxt[n]] = v
            nxt[n] = v
    return hits


def lru_hit_rate(warm: Accesses, scored: Accesses, capacity: int, n: int) -> float:
    """Share of ``scored``'s reads an LRU cache of ``capacity`` rows (warmed on ``warm``'s
    reads) serves: the dynamic cache a placement must beat at equal memory."""
    if capacity <= 0:
        return 0.0
    hits = _lru_hits(warm.sequence, scored.sequence, capacity, n)
    return float(hits / max(scored.sequence.size, 1))
