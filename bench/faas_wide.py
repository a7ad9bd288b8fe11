"""Serverless on a wide graph: full-neighbourhood requests, block objects vs whole files.

facebook_pagepage (../shared/datasets: 22,470 pages, 4,714 feature columns, a 424 MB feature
table) is published to SeaweedFS twice: as whole files (``--block-kb 0``, how stores were
published before issue 25) and as 1 MiB block objects (the default). One FaaSService per arm
(``--launch fork``, on-demand fetch, no feature cache so every request reads its rows, GCN-2 with
fanouts -1,-1: every neighbour of two hops) answers the same requests: one seed each, at degree
quantiles 5%..100% (deterministic), after one warm-up request. A third arm downloads the store
at start (``--fetch full``, blocks) for the rule of thumb in docs/deploy/faas.md. Recorded per
request: seed, its degree, input rows, latency and feature-read time. After each arm, one call
reads 200 random whole rows of features.bin from its store: the cost of one range GET, whole vs
blocks.
Arms are interleaved over ``--rounds`` (default 3); the summary gives medians and min-max.
A request that fails (the store read's 30 s deadline: HTTP 504) is recorded with its error
kind; p50/max are over the answered ones. Results: bench/results/faas_wide.json.
Run: ``.venv/bin/python bench/faas_wide.py``.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

import gnnserve  # noqa: F401  (first: sets the OpenMP wait policy)
from common import DATASETS, Targets, write_results
from gnnserve.data import layout
from gnnserve.data.blobs import BlobStore, open_blobs
from gnnserve.data.prepare import main as prepare_main
from gnnserve.data.publish import publish
from gnnserve.data.seaweed import ObjectStoreServer
from gnnserve.deploy.faas.function import FunctionSpec
from gnnserve.deploy.faas.service import FaaSService
from gnnserve.errors import GnnServeError
from gnnserve.models.checkpoint import save_checkpoint
from gnnserve.models.zoo import GNN, ModelConfig

QUANTILES = (0.05, 0.25, 0.5, 0.75, 0.9, 0.95, 0.99, 1.0)


def seeds_at_degree_quantiles(store: Path) -> tuple[np.ndarray, np.ndarray]:
    """One vertex per quantile of in-degree, and the degrees."""
    indptr = np.fromfile(store / layout.INDPTR, dtype=np.int64)
    degree = np.diff(indptr)
    order = np.argsort(degree, kind="stable")
    picks = order[[min(int(q * degree.size), degree.size - 1) for q in QUANTILES]]
    return picks.astype(np.int64), degree[picks]


def measure(spec: FunctionSpec, arm: str, seeds: np.ndarray, degrees: np.ndarray) -> dict:
    """Warm-up, then each seed once; per-request records."""
    service = FaaSService(spec, keep_alive_s=600.0, launch="fork", mb_per_cpu=0)
    records = []
    try:
        service.predict(np.array([int(seeds[0])], dtype=np.int64), rng_seed=0, timeout_s=600)
        for seed, degree in zip(seeds.tolist(), degrees.tolist(), strict=True):
            start = time.perf_counter()
            try:
                result = service.predict(np.array([seed]), rng_seed=0, timeout_s=600)
            except GnnServeError as exc:  # e.g. the store read's 30 s deadline: recorded
                failed = {
                    "seed": seed,
                    "degree": degree,
                    "error": exc.kind,
                    "http": exc.http_status,
                }
                failed["latency_ms"] = (time.perf_counter() - start) * 1e3
                records.append(failed)
                print(f"[wide] {arm}: {failed}", flush=True)
                continue
            records.append(
                {
                    "seed": seed,
                    "degree": degree,
                    "input_rows": result.output.misses + result.output.hits,
                    "latency_ms": (time.perf_counter() - start) * 1e3,
                    "fetch_ms": result.output.fetch_ms,
                    "sample_ms": result.sample.sample_ms,
                }
            )
            print(f"[wide] {arm}: {records[-1]}", flush=True)
        cold = service.summary()["cold_start_s"]
    finally:
        service.shutdown()
    latencies = [r["latency_ms"] for r in records if "error" not in r]
    return {
        "arm": arm,
        "cold_start_s": cold,
        "requests": records,
        "errors": sum("error" in r for r in records),
        "latency_p50_ms": float(np.median(latencies)),
        "latency_max_ms": float(np.max(latencies)),
    }


def range_cost(blobs: BlobStore, rows: int, row_bytes: int, rng: np.random.Generator) -> float:
    """Milliseconds per range of one call reading ``rows`` random whole rows of features.bin."""
    ids = np.unique(rng.integers(0, blobs.size(layout.FEATURES) // row_bytes, rows))
    start = time.perf_counter()
    blobs.get_ranges(layout.FEATURES, ids * row_bytes, (ids + 1) * row_bytes)
    return (time.perf_counter() - start) * 1e3 / ids.size


def summarise(runs: list[dict]) -> dict[str, dict]:
    """Per arm: median and min-max over rounds of its p50 and max latency, errors in all."""
    out: dict[str, dict] = {}
    for arm in ARMS:
        mine = [r for r in runs if r["arm"] == arm[0]]
        out[arm[0]] = {"errors": sum(r["errors"] for r in mine)}
        for key in ("latency_p50_ms", "latency_max_ms", "range_ms"):
            values = [r[key] for r in mine]
            out[arm[0]][key] = {
                "median": float(np.median(values)),
                "min": float(min(values)),
                "max": float(max(values)),
            }
    return out


# (name, publish block size in bytes, fetch mode)
ARMS = (("whole", 0, "ondemand"), ("blocks", 1 << 20, "ondemand"), ("full_fetch", 1 << 20, "full"))
SCALE = (
    "a 424 MB feature table (4,714 columns): one object far above SeaweedFS's chunk size, or "
    "407 blocks of 1 MiB; full-neighbourhood requests of 29 to 4,076 input rows (one per degree "
    "quantile)"
)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--dataset", default="facebook_pagepage")
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    runs: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="gnnserve-wide-") as tmp:
        work = Path(tmp)
        npz = DATASETS / f"{args.dataset}.npz"
        assert prepare_main(["npz", "--input", str(npz), "--out", str(work / "store")]) == 0
        meta = layout.read_meta(work / "store")
        torch.manual_seed(0)
        config = ModelConfig("gcn", meta.feature_dim, 64, max(meta.num_classes, 2), 2, heads=1)
        save_checkpoint(work / "model", GNN(config), config, {})
        seeds, degrees = seeds_at_degree_quantiles(work / "store")
        row_bytes = meta.feature_dim * np.dtype(meta.feature_dtype).itemsize
        rng = np.random.default_rng(0)
        with ObjectStoreServer.start(work / "seaweed", bucket="bench") as server:
            published = {}
            for arm, block_bytes, _ in ARMS:
                url = f"s3://{server.bucket}/{arm}"
                published[arm] = publish(
                    work / "store", url, server.options(), block_bytes=block_bytes
                )
            for round_ in range(args.rounds):
                order = ARMS[round_ % len(ARMS) :] + ARMS[: round_ % len(ARMS)]  # interleaved
                for arm, _, fetch in order:
                    url = published[arm].url
                    spec = FunctionSpec(
                        url,
                        str(work / "model"),
                        (-1, -1),
                        fetch=fetch,
                        cache=False,
                        options=dict(server.options()),
                    )
                    run = measure(spec, arm, seeds, degrees)
                    blobs = open_blobs(url, server.options())
                    run["range_ms"] = range_cost(blobs, 200, row_bytes, rng)
                    run.update(round=round_, blocks=published[arm].blocks)
                    print(
                        f"[wide] round {round_} {arm}: p50 {run['latency_p50_ms']:.0f} ms, max "
                        f"{run['latency_max_ms']:.0f} ms, {run['errors']} errors, "
                        f"{run['range_ms']:.2f} ms per range, cold starts {run['cold_start_s']}",
                        flush=True,
                    )
                    runs.append(run)
    summary = summarise(runs)
    targets = Targets()
    targets.check(
        "blocks: full-neighbourhood requests answered with an error",
        summary["blocks"]["errors"],
        0,
        False,
    )
    ratio = (
        summary["whole"]["latency_p50_ms"]["median"] / summary["blocks"]["latency_p50_ms"]["median"]
    )
    targets.check("p50 latency whole files / blocks (no goal in the issue: > 1)", ratio, 1.0)
    payload = {"args": vars(args), "scale": SCALE, "summary": summary, "runs": runs}
    path = write_results("faas_wide", {**payload, "targets": targets.rows})
    print(f"[wide] wrote {path}")
    targets.print()


if __name__ == "__main__":
    main()
