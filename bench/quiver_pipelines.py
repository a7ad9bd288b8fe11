"""Quiver §4.3 on this machine: shared-queue multiplexed pipelines vs one pipeline, and vs as
many pipelines each with its own queue.

A closed loop of client threads sends a mixed workload to an in-process engine (fb100_cornell5,
GraphSAGE 2x256, fanouts 10,10): most requests ask for 1 node, one in ten for 256 nodes (the
stragglers). Throughput is answered requests per second over a fixed window. Arm ``N``: one
engine with ``batcher.pipelines = N`` taking batches from one queue; arm ``Nq``: N engines of one
pipeline each, client i sending to engine i mod N (a queue per pipeline: a request queued behind
a straggler waits for it even when another pipeline is idle). Rounds interleave the arms.
"""

from __future__ import annotations

import contextlib
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from common import fmt_range, interleaved_rounds, median_range, ratios
from gnnserve.config import ServeConfig
from gnnserve.engine.loader import build_engine
from gnnserve.errors import OverloadedError

LARGE_SHARE = 0.1  # share of requests asking for LARGE nodes
LARGE = 256
CLIENTS = 16


def _client(engine: Any, n: int, seed: int, stop: threading.Event, out: list[float]) -> None:
    """Send requests until ``stop``; append each answered one's latency (ms) to ``out`` (a
    refused one is retried after its hint, at most 100 ms: only answers count)."""
    rng = np.random.default_rng(seed)
    while not stop.is_set():
        size = LARGE if rng.random() < LARGE_SHARE else 1
        start = time.perf_counter()
        try:
            engine.predict(rng.integers(0, n, size), timeout_s=60)
        except OverloadedError as exc:  # refused (429): back off as a client would, retry
            time.sleep(min(exc.retry_after_s or 0.01, 0.1))
            continue
        out.append((time.perf_counter() - start) * 1e3)


def _config(store: Path, ckpt: Path, pipelines: int) -> ServeConfig:
    return ServeConfig.load(
        None,
        **{
            "store.path": str(store),
            "model_path": str(ckpt),
            "sampler.fanouts": [10, 10],
            "batcher.pipelines": pipelines,
            "admission.max_queue_requests": 10_000,
        },
    )


def closed_loop(
    store: Path, ckpt: Path, n: int, pipelines: int, window_s: float, queues: int = 1
) -> dict:
    """Throughput (req/s) and p99 (ms) of ``CLIENTS`` closed-loop clients for ``window_s``:
    ``queues`` engines of ``pipelines`` pipelines each, client i on engine i mod ``queues``."""
    with contextlib.ExitStack() as stack:
        engines = [
            stack.enter_context(build_engine(_config(store, ckpt, pipelines)))
            for _ in range(queues)
        ]
        for engine in engines:
            engine.warm_up()
        stop = threading.Event()
        latencies: list[list[float]] = [[] for _ in range(CLIENTS)]
        threads = [
            threading.Thread(target=_client, args=(engines[i % queues], n, i, stop, latencies[i]))
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
    """Throughput per pipeline count, shared queue (``N``) and a queue per pipeline (``Nq``),
    over interleaved rounds; ratios against one pipeline and shared over own queues."""
    shapes = {str(c): (c, 1) for c in counts} | {f"{c}q": (1, c) for c in counts if c > 1}
    p99: dict[str, list[float]] = {name: [] for name in shapes}

    def arm(name: str) -> Any:
        def run() -> float:
            pipelines, queues = shapes[name]
            row = closed_loop(store, ckpt, n, pipelines, window_s, queues)
            p99[name].append(row["p99_ms"])
            return float(row["rps"])

        return run

    rps = interleaved_rounds(
        {name: arm(name) for name in shapes},
        rounds,
        on_round=lambda r, v: print(f"[quiver] pipelines round {r}: req/s {v}", flush=True),
    )
    out: dict[str, Any] = {
        "workload": f"{CLIENTS} closed-loop clients, {LARGE_SHARE:.0%} of requests {LARGE} nodes",
        "window_s": window_s,
        "rps": {c: median_range(v) for c, v in rps.items()},
        "p99_ms": {c: median_range(v) for c, v in p99.items()},
        "ratio_over_one": {c: median_range(ratios(v, rps[str(counts[0])])) for c, v in rps.items()},
        "shared_over_own_queues": {
            str(c): median_range(ratios(rps[str(c)], rps[f"{c}q"])) for c in counts if c > 1
        },
    }
    for c in rps:
        print(f"[quiver] {c} pipeline(s): {fmt_range(out['rps'][c], '.0f', ' req/s')}")
    return out
