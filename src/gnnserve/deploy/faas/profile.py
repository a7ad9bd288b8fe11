"""``gnnserve faas profile``: train the memory predictor of a model on a published store (§4.3).

Profiling runs requests through the serving code path itself: a :class:`SampleFunction` samples
each one from the remote store with the deployment's fanouts, and an :class:`InferenceFunction`
(its adaptive cache and gather included) reads the features and runs the model, measuring the
peak memory the request adds (less the rows its cache keeps, which the cache budget counts), as
an inference instance measures it. It fits the 2-layer MLP
(:class:`gnnserve.models.memory.MemoryPredictor`) on three quarters of the requests and reports
its relative error on the rest, for all of them and for peaks of at least 1 MB. The predictor is
saved beside the model checkpoint with the fanouts it was profiled for; inference instances
refuse one profiled for other fanouts. Requests are single query vertices drawn from
``queries`` (default: uniform over the graph) plus the highest in-degree vertices, so the
largest requests are in range. A progress bar counts the requests (``progress=False``: none).
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from dataclasses import replace
from typing import Any

import numpy as np
from tqdm import tqdm

from gnnserve.deploy.faas.function import FunctionSpec, InferenceFunction, SampleFunction
from gnnserve.graph.remote import RemoteCSR
from gnnserve.models.checkpoint import load_checkpoint
from gnnserve.models.memory import MemoryPredictor, relative_errors, request_features

log = logging.getLogger(__name__)
_TOP = 8  # highest in-degree vertices always profiled
BIG_PEAK = 1 << 20  # bytes: errors are reported separately above and below
DEGREE_CHUNK = 8192  # query vertices per degree read: each read stays within the store's deadline


def profile_predictor(
    spec: FunctionSpec,
    queries: np.ndarray | None = None,
    requests: int = 200,
    seed: int = 0,
    progress: bool = True,
) -> dict[str, Any]:
    """Profile ``requests`` requests, fit, save beside ``spec.model``; returns the held-out
    errors, sizes and timings."""
    start = time.perf_counter()
    spec = replace(spec, fetch="ondemand", cache=True, memory_mb=0, seed=0)  # the serving path
    sampler = SampleFunction(spec)
    inference = InferenceFunction(spec, predictor=False)
    seeds = _request_seeds(sampler.remote, queries, requests, seed)
    X, y = [], []
    bar = tqdm(seeds.tolist(), desc="profile", unit="request", disable=not progress)
    for i, v in enumerate(bar):
        request = sampler.sample(np.array([v]), rng_seed=i)
        _, measured = inference._measured_run(request)
        X.append(request_features(request.subgraph))
        y.append(float(measured))
    X_arr, y_arr = np.stack(X), np.asarray(y)
    order = np.random.default_rng(seed).permutation(len(y_arr))
    split = max(1, int(0.75 * len(y_arr)))
    train, held = order[:split], order[split:]
    version = load_checkpoint(spec.model).version
    predictor = MemoryPredictor(len(spec.fanouts), version, fanouts=spec.fanouts)
    validation = (X_arr[held], y_arr[held]) if held.size else None
    predictor.fit(X_arr[train], y_arr[train], validation=validation)
    path = predictor.save(spec.model)
    report: dict[str, Any] = {
        **(predictor.evaluate(X_arr[held], y_arr[held]) if held.size else {}),
        **_split_errors(predictor, X_arr[held], y_arr[held]),
        "fanouts": list(spec.fanouts),
        "train": int(train.size),
        "held_out": int(held.size),
        "peak_bytes_min": float(y_arr.min()),
        "peak_bytes_max": float(y_arr.max()),
        "seconds": time.perf_counter() - start,
        "saved": str(path),
    }
    log.info("memory predictor: %s", report)
    return report


def _split_errors(predictor: MemoryPredictor, X: np.ndarray, y: np.ndarray) -> dict[str, Any]:
    """Held-out mean relative error on peaks >= BIG_PEAK and below (None where there are none)."""
    out: dict[str, Any] = {}
    for key, mask in (("big", y >= BIG_PEAK), ("small", y < BIG_PEAK)):
        chosen = mask.nonzero()[0]
        errors = relative_errors(predictor.predict(X[chosen]), y[chosen]) if chosen.size else None
        out[f"mean_rel_error_{key}"] = None if errors is None else errors["mean_rel_error"]
        out[f"n_{key}"] = int(chosen.size)
    return out


def query_degrees(remote: RemoteCSR, nodes: np.ndarray) -> np.ndarray:
    """In-degrees of ``nodes`` (valid int64 ids), read :data:`DEGREE_CHUNK` at a time: on a large
    graph the query vertices span ranges of the index pointers that one read could not fetch
    within the store's per-request deadline (2^20 R-MAT vertices: over 30 s)."""
    chunks = [
        remote.fetch_degrees(nodes[i : i + DEGREE_CHUNK])[1]
        for i in range(0, nodes.size, DEGREE_CHUNK)
    ]
    return np.concatenate(chunks) if chunks else np.empty(0, dtype=np.int64)


def _request_seeds(
    remote: RemoteCSR, queries: np.ndarray | None, requests: int, seed: int
) -> np.ndarray:
    rng = np.random.default_rng(seed)
    n = remote.num_nodes
    pool = np.arange(n) if queries is None else np.asarray(queries, dtype=np.int64)
    picked = rng.choice(pool, size=max(1, requests - _TOP), replace=pool.size < requests)
    distinct = np.unique(pool)  # offline: reading every query vertex's degree is fine
    degree = query_degrees(remote, distinct)
    top = distinct[np.argsort(-degree, kind="stable")[:_TOP]]
    return np.concatenate([picked, top]).astype(np.int64)


def run(args: argparse.Namespace) -> int:
    """``gnnserve faas profile``: print the held-out errors as JSON."""
    from gnnserve.fanouts import parse_fanouts

    fanouts = parse_fanouts(args.fanouts, "--fanouts") or []
    spec = FunctionSpec(args.remote, args.model, tuple(fanouts))
    report = profile_predictor(spec, None, args.requests, args.seed, not args.no_progress)
    print(json.dumps(report, indent=2))
    return 0
