"""``gnnserve faas profile``: train the memory predictor of a model on a published store (§4.3).

Profiling runs what an inference instance runs for a request (read the input features by byte
ranges, run the model) on sampled requests, measures each one's peak resident-memory increase
(:func:`gnnserve.models.peakmem.peak_memory`), fits the 2-layer MLP
(:class:`gnnserve.models.memory.MemoryPredictor`) on three quarters of them and reports its
relative error on the rest. The predictor is saved beside the model checkpoint, where inference
instances load it. Requests are single query vertices drawn from ``queries`` (default: uniform
over the graph) plus the highest in-degree vertices, so the largest requests are in range.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from typing import Any

import numpy as np

from gnnserve.data.blobs import open_blobs
from gnnserve.deploy.faas.function import FunctionSpec
from gnnserve.features.remote import RemoteFeatures
from gnnserve.graph.remote import RemoteCSR
from gnnserve.models.checkpoint import load_checkpoint
from gnnserve.models.memory import MemoryPredictor, profile
from gnnserve.models.runner import ModelRunner
from gnnserve.sampling.ondemand import OnDemandSampler
from gnnserve.types import MiniBatch

log = logging.getLogger(__name__)
_TOP = 8  # highest in-degree vertices always profiled


def profile_predictor(
    spec: FunctionSpec, queries: np.ndarray | None = None, requests: int = 200, seed: int = 0
) -> dict[str, Any]:
    """Profile ``requests`` requests, fit, save beside ``spec.model``; returns the held-out
    errors, sizes and timings."""
    start = time.perf_counter()
    blobs = open_blobs(spec.remote, spec.options or None)
    remote = RemoteCSR(blobs, spec.gap)
    features = RemoteFeatures(blobs, remote.meta, spec.gap)
    ckpt = load_checkpoint(spec.model)
    runner = ModelRunner(ckpt.model, ckpt.version)
    sampler = OnDemandSampler(remote, list(spec.fanouts), seed=spec.seed)
    seeds = _request_seeds(remote, queries, requests, seed)
    samples = []
    for i, v in enumerate(seeds):
        fetched = sampler.sample(np.array([v]), rng_seed=i)
        sub = fetched.subgraph
        k = sub.input_nodes.size
        loops = None if fetched.loops is None else fetched.loops[:k]
        gcn = remote.gcn_degree(sub.input_nodes, fetched.degree[:k], loops)

        def run(sub: Any = sub, gcn: np.ndarray = gcn) -> object:
            import torch

            x = features.get_valid(sub.input_nodes)
            return runner.forward(MiniBatch(sub, x, torch.from_numpy(gcn)))

        samples.append((sub, run))
    X, y = profile(samples)
    order = np.random.default_rng(seed).permutation(len(y))
    split = max(1, int(0.75 * len(y)))
    train, held = order[:split], order[split:]
    predictor = MemoryPredictor(len(spec.fanouts), ckpt.version)
    predictor.fit(X[train], y[train], validation=(X[held], y[held]) if held.size else None)
    path = predictor.save(spec.model)
    errors = predictor.evaluate(X[held], y[held]) if held.size else {}
    report = {
        **errors,
        "train": int(train.size),
        "held_out": int(held.size),
        "peak_bytes_min": float(y.min()),
        "peak_bytes_max": float(y.max()),
        "seconds": time.perf_counter() - start,
        "saved": str(path),
    }
    log.info("memory predictor: %s", report)
    return report


def _request_seeds(
    remote: RemoteCSR, queries: np.ndarray | None, requests: int, seed: int
) -> np.ndarray:
    rng = np.random.default_rng(seed)
    n = remote.num_nodes
    pool = np.arange(n) if queries is None else np.asarray(queries, dtype=np.int64)
    picked = rng.choice(pool, size=max(1, requests - _TOP), replace=pool.size < requests)
    distinct = np.unique(pool)  # offline: reading every query vertex's degree is fine
    degree = remote.fetch_degrees(distinct)[1]
    top = distinct[np.argsort(-degree, kind="stable")[:_TOP]]
    return np.concatenate([picked, top]).astype(np.int64)


def run(args: argparse.Namespace) -> int:
    """``gnnserve faas profile``: print the held-out errors as JSON."""
    from gnnserve.fanouts import parse_fanouts

    fanouts = parse_fanouts(args.fanouts, "--fanouts") or []
    spec = FunctionSpec(args.remote, args.model, tuple(fanouts))
    report = profile_predictor(spec, None, args.requests, args.seed)
    print(json.dumps(report, indent=2))
    return 0
