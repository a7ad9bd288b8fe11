"""Quiver §5 on this machine: FAP feature placement against degree-ranked and random placement.

For each graph and request stream (``quiver_streams``), p0 is learned online from the first half
of the stream (``SeedTraffic``, beyond Quiver's fixed p0) and FAP computed from it; placements
are scored on the second half, which they never saw:

- hot-tier hit rate at a RAM budget of 10% and 25% of the feature bytes (equal memory for
  every arm): FAP (learned p0), FAP with Quiver's default uniform p0, degree-ranked
  (AliGraph-style: how many neighbourhoods a node is in, the degree sampling sees), ranked by
  the feature reads of the learned half (``past_reads``, the traffic-aware baseline), random,
  and an LRU cache of as many rows warmed on the learned half's reads (``lru``: the dynamic
  cache a static placement must beat);
- for P servers, requests routed by seed hash: the share of feature reads served remotely when
  each server holds 1.25 N/P rows, for FAP (per-server FAP from each server's own learned
  traffic), degree (hottest by degree replicated, the rest dealt in degree order), and hash
  partitioning (DGL default, N/P rows: it replicates nothing); FAP at N/P rows too (the
  equal-memory comparison with hash). Counted
  from the scored reads for P = 2, 4, 8, and measured through real feature-server Ray actors
  (features.partitioned) on a share of the requests for P = 2, 4;
- mean feature-gather time per request from a tiered store (RAM tier at the budget, the rest
  read by byte ranges from a file:// remote), FAP vs degree vs random placement.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from gnnserve.data import layout
from gnnserve.features.partitioned import FeatureCluster
from gnnserve.features.placement import (
    ServerPlan,
    degree_partition,
    hash_partition,
    remote_share,
    server_plan,
    tier_plan,
)
from gnnserve.features.tiered import TieredFeatures
from gnnserve.graph.base import GraphStore
from gnnserve.sampling.metrics import fap
from gnnserve.sampling.sampler import NeighborSampler
from gnnserve.sampling.traffic import SeedTraffic
from quiver_streams import (
    Accesses,
    count_accesses,
    draw_seeds,
    hit_rate,
    lru_hit_rate,
    popularity,
)

BUDGETS = (0.10, 0.25)  # hot-tier share of the feature bytes
SLACK = 1.25  # per-server capacity, in units of N / P rows
ROW = 4  # bytes per row in plans that only rank (placement depends on the row count alone)


def hot(scores: np.ndarray, share: float) -> np.ndarray:
    """bool [N]: the nodes a RAM tier of ``share`` of the feature bytes holds, placed by
    ``scores`` (features.placement.tier_plan, the plan the tiered store serves)."""
    n = scores.size
    plan = tier_plan(scores, ROW, {"ram": share * n * ROW, "remote": None})
    return plan.tier == plan.index("ram")


def learned_p0(seeds: np.ndarray, n: int) -> np.ndarray:
    """p0 learned from ``seeds`` by the online counter the server would run."""
    traffic = SeedTraffic(n, half_life=float(seeds.size))
    traffic.observe(seeds)
    return traffic.distribution()


def scores(
    graph: GraphStore, fanouts: list[int], history: np.ndarray, past: Accesses, seed: int
) -> dict:
    """Per-node ranking of each placement policy (``past``: the reads of ``history``)."""
    n = graph.num_nodes
    indices = graph.csr()[1]
    return {
        "fap": fap(graph, fanouts, learned_p0(history, n)),
        "fap_uniform_p0": fap(graph, fanouts),
        "degree": np.bincount(np.asarray(indices), minlength=n).astype(np.float64),
        # traffic-aware baseline: rank by the feature reads the learned half made
        "past_reads": past.total.astype(np.float64),
        "random": np.random.default_rng(seed).random(n),
    }


def hit_rates(
    ranking: dict[str, np.ndarray], past: Accesses, accesses: Accesses
) -> dict[str, dict]:
    """Hot-tier hit rate per policy and budget, and of an LRU cache of the same rows warmed
    on the learned half's reads (``lru``)."""
    rates = {
        name: {f"{b:.0%}": hit_rate(accesses.total, hot(s, b)) for b in BUDGETS}
        for name, s in ranking.items()
    }
    n = accesses.total.size
    rates["lru"] = {
        f"{b:.0%}": lru_hit_rate(past, accesses, int(hot(np.zeros(n), b).sum()), n) for b in BUDGETS
    }
    return rates


def run_stream(
    graph: GraphStore, fanouts: list[int], kind: str, requests: int, servers: tuple[int, ...]
) -> dict[str, Any]:
    """Learn on the first half of a ``kind`` stream, score placements on the second."""
    n = graph.num_nodes
    seeds = draw_seeds(popularity(kind, n, seed=1), 2 * requests, seed=2)
    history, future = seeds[:requests], seeds[requests:]
    past = count_accesses(graph, fanouts, history, ())
    ranking = scores(graph, fanouts, history, past, seed=3)
    accesses = count_accesses(graph, fanouts, future, servers)
    ceiling = {"best_static": accesses.total.astype(np.float64)}  # ranked by the answer itself
    return {
        "stream": kind,
        "requests_learned": int(history.size),
        "requests_scored": int(future.size),
        "rows_read": accesses.rows_read,
        "hit_rate": hit_rates(ranking | ceiling, past, accesses),
        "history": history,
        "future": future,
        "accesses": accesses,
        "ranking": ranking,
    }


def per_server_fap(
    graph: GraphStore, fanouts: list[int], p0: np.ndarray, servers: int
) -> np.ndarray:
    """float [P, N]: server p's FAP under its own traffic (seeds routed by ``seed mod P``),
    scaled by its share of the traffic so servers compare."""
    n = graph.num_nodes
    out = np.zeros((servers, n))
    for p in range(servers):
        mine = np.where(np.arange(n) % servers == p, p0, 0.0)
        if mine.sum() > 0:
            out[p] = fap(graph, fanouts, mine) * mine.sum()
    return out


def server_plans(
    graph: GraphStore, fanouts: list[int], history: np.ndarray, servers: int
) -> dict[str, ServerPlan]:
    """FAP, hash and degree placements over ``servers`` servers of SLACK * N / P rows."""
    n = graph.num_nodes
    cap = int(np.ceil(SLACK * n / servers))
    p0 = learned_p0(history, n)
    degree = np.bincount(np.asarray(graph.csr()[1]), minlength=n).astype(np.float64)
    scores = per_server_fap(graph, fanouts, p0, servers)
    return {
        "fap": server_plan(scores, servers, cap),
        "fap_no_slack": server_plan(scores, servers, -(-n // servers)),
        "hash": hash_partition(n, servers),
        "degree": degree_partition(degree, servers, cap),
    }


def remote_shares(
    graph: GraphStore, fanouts: list[int], row: dict[str, Any], servers: tuple[int, ...]
) -> dict[str, dict[str, float]]:
    """Share of feature bytes read remotely per P and policy, by counting the scored reads."""
    out = {}
    for p in servers:
        plans = server_plans(graph, fanouts, row["history"], p)
        counts = row["accesses"].per_server[p]
        out[str(p)] = {name: remote_share(plan, counts, ROW) for name, plan in plans.items()}
    return out


def measured_remote_share(
    store: Path, plan: ServerPlan, graph: GraphStore, fanouts: list[int], seeds: np.ndarray
) -> float:
    """Remote share of the feature bytes read through feature-server actors placed by ``plan``
    (requests routed to server ``seed mod P``, sampled as in the counting)."""
    servers = plan.num_servers
    cluster = FeatureCluster(store, plan.owner, servers)
    try:
        stores = [cluster.store(p) for p in range(servers)]
        sampler = NeighborSampler(graph, fanouts, seed=11)
        for i, s in enumerate(seeds):
            nodes = sampler.sample(np.array([s]), rng_seed=i).input_nodes
            stores[int(s) % servers].get(nodes)
        remote = sum(st.stats.remote_rows for st in stores)
        local = sum(st.stats.local_rows for st in stores)
    finally:
        cluster.shutdown()
    return remote / max(remote + local, 1)


def gather_times(
    store: Path, ranking: dict[str, np.ndarray], graph: GraphStore, fanouts: list[int],
    seeds: np.ndarray, share: float,
) -> dict[str, float]:  # fmt: skip
    """Mean ms to gather one request's input features from a RAM tier of ``share`` of the
    bytes placed by each ranking, the rest read by byte ranges from ``store`` as file://."""
    sampler = NeighborSampler(graph, fanouts, seed=11)
    requests = [sampler.sample(np.array([s]), rng_seed=i).input_nodes for i, s in enumerate(seeds)]
    meta = layout.read_meta(store)
    nbytes = share * graph.num_nodes * meta.feature_dim * np.dtype(meta.feature_dtype).itemsize
    out = {}
    for name in ("fap", "degree", "random"):
        tiered = TieredFeatures.from_scores(
            store.as_uri(), ranking[name], {"ram": nbytes, "remote": None}
        )
        try:
            for ids in requests[:50]:  # warm the file's pages and the code paths
                tiered.get(ids)
            start = time.perf_counter()
            for ids in requests:
                tiered.get(ids)
            out[name] = (time.perf_counter() - start) * 1e3 / len(requests)
        finally:
            tiered.close()
    return out
