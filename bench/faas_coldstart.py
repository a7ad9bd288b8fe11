"""Cold starts of the two launch paths on an idle machine (``--launch process`` vs ``fork``).

One FaaSService per launch path on the same published store (SeaweedFS, an R-MAT graph of 2^16
vertices with 300-dim features, GCN-2, fanouts 10,10, capacities 512 MB, CPU quota 2 cores per
instance so the quota does not bind): ``--requests`` times, one request on a deployment scaled to
zero (keep-alive 1 s, waited out), so every request meets no warm instance. Recorded per request:
the cold start of each instance (launch to ready, both functions) and the request's latency (one
cold start plus its work, the two instances starting together). bench/faas.py measures cold
starts under its trace's load; this one measures the launch path alone.
Results: bench/results/faas_coldstart.json. Run: ``.venv/bin/python bench/faas_coldstart.py``.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

import gnnserve  # noqa: F401  (first: sets the OpenMP wait policy)
from common import RESULTS, environment, strict
from gnnserve.data import generators
from gnnserve.data.publish import publish
from gnnserve.data.seaweed import ObjectStoreServer
from gnnserve.data.writer import write_store
from gnnserve.deploy.faas.function import FunctionSpec
from gnnserve.deploy.faas.service import FaaSService
from gnnserve.deploy.ray import start_ray, stop_ray
from gnnserve.models.checkpoint import save_checkpoint
from gnnserve.models.zoo import GNN, ModelConfig


def measure(spec: FunctionSpec, launch: str, requests: int) -> dict[str, Any]:
    """``requests`` requests, each on a deployment scaled to zero; cold starts and latencies."""
    service = FaaSService(spec, keep_alive_s=1.0, launch=launch, mb_per_cpu=256)
    latencies, cold = [], []
    try:
        for i in range(requests):
            start = time.perf_counter()
            service.predict(np.array([i * 97 % 60_000], dtype=np.int64), rng_seed=i)
            latencies.append((time.perf_counter() - start) * 1e3)
            service.wait_scaled_to_zero(timeout_s=60.0)
        cold = service.summary()["cold_start_s"]
    finally:
        service.shutdown()
    return {
        "launch": launch,
        "cold_start_s": cold,
        "cold_start_p50_s": float(np.median(cold)),
        "latency_ms": latencies,
        "latency_p50_ms": float(np.median(latencies)),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--requests", type=int, default=10)
    args = p.parse_args()
    results: dict[str, Any] = {"environment": environment(), "args": vars(args), "runs": []}
    with tempfile.TemporaryDirectory(prefix="gnnserve-coldstart-") as tmp:
        work = Path(tmp)
        data = generators.rmat(2**16, 2**20, feature_dim=300)
        write_store(data, work / "store")
        torch.manual_seed(0)
        config = ModelConfig("gcn", 300, 16, 16, 2, heads=1)
        save_checkpoint(work / "model", GNN(config), config, {})
        with ObjectStoreServer.start(work / "seaweed", bucket="bench") as server:
            url = f"s3://{server.bucket}/rmat16"
            publish(work / "store", url, options=server.options(), progress=False)
            spec = FunctionSpec(
                url, str(work / "model"), (10, 10), memory_mb=512, options=dict(server.options())
            )
            started = start_ray(num_cpus=8)  # once: services then leave it running
            for launch in ("fork", "process"):
                run = measure(spec, launch, args.requests)
                print(
                    f"[coldstart] {launch}: cold start p50 {run['cold_start_p50_s']:.2f} s, "
                    f"first-request latency p50 {run['latency_p50_ms']:.0f} ms",
                    flush=True,
                )
                results["runs"].append(run)
            stop_ray(started)
    text = json.dumps(strict(results), indent=1, allow_nan=False)
    (RESULTS / "faas_coldstart.json").write_text(text)


if __name__ == "__main__":
    main()
