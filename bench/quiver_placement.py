"""Quiver §5 on this machine: FAP feature placement against degree-ranked and random placement.

For each graph and request stream (``quiver_streams``), p0 is learned online from the first half
of the stream (``SeedTraffic``, beyond Quiver's fixed p0) and FAP computed from it; placements
are scored on the second half, which they never saw:

- hot-tier hit rate at a RAM budget of 10% and 25% of the feature bytes: FAP (learned p0), FAP
  with Quiver's default uniform p0, degree-ranked (AliGraph-style: how many neighbourhoods a node
  is in, the degree sampling sees), and random;
- for P servers, requests routed by seed hash: the share of feature reads served remotely when
  each server holds 1.25/P of the rows, for FAP (per-server FAP from each server's own learned
  traffic), hash partitioning (DGL default) and degree (hottest by degree replicated, rest hash).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from gnnserve.graph.base import GraphStore
from gnnserve.sampling.metrics import fap
from gnnserve.sampling.traffic import SeedTraffic
from quiver_streams import Accesses, count_accesses, draw_seeds, hit_rate, popularity

BUDGETS = (0.10, 0.25)  # hot-tier share of the feature bytes
SLACK = 1.25  # per-server capacity, in units of N / P rows


def hot(scores: np.ndarray, share: float) -> np.ndarray:
    """bool [N]: the ``share`` of nodes with the highest score (ties by id)."""
    k = int(round(share * scores.size))
    held = np.zeros(scores.size, dtype=bool)
    held[np.lexsort((np.arange(scores.size), -scores))[:k]] = True
    return held


def learned_p0(seeds: np.ndarray, n: int) -> np.ndarray:
    """p0 learned from ``seeds`` by the online counter the server would run."""
    traffic = SeedTraffic(n, half_life=float(seeds.size))
    traffic.observe(seeds)
    return traffic.distribution()


def scores(graph: GraphStore, fanouts: list[int], history: np.ndarray, seed: int) -> dict:
    """Per-node ranking of each placement policy."""
    n = graph.num_nodes
    indices = graph.csr()[1]
    return {
        "fap": fap(graph, fanouts, learned_p0(history, n)),
        "fap_uniform_p0": fap(graph, fanouts),
        "degree": np.bincount(np.asarray(indices), minlength=n).astype(np.float64),
        "random": np.random.default_rng(seed).random(n),
    }


def hit_rates(ranking: dict[str, np.ndarray], accesses: Accesses) -> dict[str, dict]:
    """Hot-tier hit rate per policy and budget."""
    return {
        name: {f"{b:.0%}": hit_rate(accesses.total, hot(s, b)) for b in BUDGETS}
        for name, s in ranking.items()
    }


def run_stream(
    graph: GraphStore, fanouts: list[int], kind: str, requests: int, servers: tuple[int, ...]
) -> dict[str, Any]:
    """Learn on the first half of a ``kind`` stream, score placements on the second."""
    n = graph.num_nodes
    seeds = draw_seeds(popularity(kind, n, seed=1), 2 * requests, seed=2)
    history, future = seeds[:requests], seeds[requests:]
    ranking = scores(graph, fanouts, history, seed=3)
    accesses = count_accesses(graph, fanouts, future, servers)
    ceiling = {"best_static": accesses.total.astype(np.float64)}  # ranked by the answer itself
    return {
        "stream": kind,
        "requests_learned": int(history.size),
        "requests_scored": int(future.size),
        "rows_read": accesses.rows_read,
        "hit_rate": hit_rates(ranking | ceiling, accesses),
        "history": history,
        "accesses": accesses,
        "ranking": ranking,
    }
