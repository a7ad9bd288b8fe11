"""Quiver §4.3 on this machine: shared-queue multiplexed pipelines vs one pipeline.

A closed loop of client threads sends a mixed workload to an in-process engine (fb100_cornell5,
GraphSAGE 2x256, fanouts 10,10): most requests ask for 1 node, one in ten for 256 nodes (the
stragglers). Throughput is answered requests per second over a fixed window; the arms differ
only in ``batcher.pipelines``. Rounds interleave the arms (A B B A).
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from common import fmt_range, interleaved_rounds, median_range, ratios
from gnnserve.config import ServeConfig
from gnnserve.engine.loader import build_engine

LARGE_SHARE = 0.1  # share of requests asking for LARGE nodes
LARGE = 256
CLIENTS = 16


def _client(engine: Any, n: int, seed: int, stop: threading.Event, out: list[float]) -> None:
    """Send requests until ``stop``; append each one's latency (ms) to ``out``."""
    rng = np.random.default_rng(seed)
    while not stop.is_set():
        size = LARGE if rng.random() < LARGE_SHARE else 1
        start = time.perf_counter()
        engine.predict(rng.integers(0, n, size), timeout_s=60)
        out.append((time.perf_counter() - start) * 1e3)


def closed_loop(store: Path, ckpt: Path, n: int, pipelines: int, window_s: float) -> dict:
    """Throughput (req/s) and p99 (ms) of ``CLIENTS`` closed-loop clients for ``window_s``."""
    config = ServeConfig.load(
        None,
        **{
            "store.path": str(store),
            "model_path": str(ckpt),
            "sampler.fanouts": [10, 10],
            "batcher.pipelines": pipelines,
            "admission.max_queue_requests": 10_000,
        },
    )
    with build_engine(config) as engine:
        engine.warm_up()
        stop = threading.Event()
        latencies: list[list[float]] = [[] for _ in range(CLIENTS)]
        threads = [
            threading.Thread(target=_client, args=(engine, n, i, stop, latencies[i]))
            for i in range(CLIENTS)
        ]
        for t in threads:
            t.start()
        time.sleep(1.0)  # ramp up, not counted
        before = sum(len(x) for x in latencies)
        time.sleep(window_s)
        done = sum(len(x) for x in latencies) - before
        stop.set()
        for t in threads:
            t.join(60)
    lat = np.concatenate([np.asarray(x[-200:]) for x in latencies if x])
    return {"rps": done / window_s, "p99_ms": float(np.percentile(lat, 99))}


def run_pipelines(
    store: Path, ckpt: Path, n: int, counts: list[int], rounds: int, window_s: float
) -> dict[str, Any]:
    """Throughput per pipeline count over interleaved rounds; ratios against one pipeline."""
    p99: dict[str, list[float]] = {str(c): [] for c in counts}

    def arm(count: int) -> Any:
        def run() -> float:
            row = closed_loop(store, ckpt, n, count, window_s)
            p99[str(count)].append(row["p99_ms"])
            return float(row["rps"])

        return run

    rps = interleaved_rounds(
        {str(c): arm(c) for c in counts},
        rounds,
        on_round=lambda r, v: print(f"[quiver] pipelines round {r}: req/s {v}", flush=True),
    )
    out: dict[str, Any] = {
        "workload": f"{CLIENTS} closed-loop clients, {LARGE_SHARE:.0%} of requests {LARGE} nodes",
        "window_s": window_s,
        "rps": {c: median_range(v) for c, v in rps.items()},
        "p99_ms": {c: median_range(v) for c, v in p99.items()},
        "ratio_over_one": {c: median_range(ratios(v, rps[str(counts[0])])) for c, v in rps.items()},
    }
    for c in rps:
        print(f"[quiver] {c} pipeline(s): {fmt_range(out['rps'][c], '.0f', ' req/s')}")
    return out
