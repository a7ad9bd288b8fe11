"""The same inference request over each protocol `gnnserve serve` speaks: latency per call.

One server (the serving benchmark's fb100_cornell5 store and GraphSAGE 2x256, fanouts [25, 10],
1 torch thread, ``--grpc-port``), one client in this process calling one request at a time
(closed loop: the protocol's own cost, not queueing). Two requests (``REQUESTS``): ``small``, 8
nodes answered with their labels (64 bytes out: the protocol's fixed cost shows), and
``large``, 256 nodes answered with their embeddings (256 KB out: encoding shows); the nodes
drawn per call from one seeded sequence shared by every arm. Arms:

- ``http_json``: httpx, the OIP JSON body (what curl or requests users send);
- ``http_binary``: tritonclient.http, binary tensors (its default);
- ``grpc``: tritonclient.grpc (raw contents).

The arms run in interleaved blocks (arm order rotated per block) after a warm-up of each;
published per request: p50 and p99 per arm over all blocks, the median of the per-block p50s,
and the raw per-call times. Run through ``python bench/serving.py --protocols``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from common import fb100_sage, result_name, write_results  # type: ignore[import-not-found]
from gnnserve.demo import stop_server, wait_ready
from gnnserve.ports import free_port

ARMS = ("http_json", "http_binary", "grpc")
REQUESTS = {"small": (8, "label", 400), "large": (256, "embedding", 40)}  # nodes, output, calls


def _launch(store: Path, ckpt: Path, port: int, grpc_port: int) -> subprocess.Popen[bytes]:
    cmd = [
        sys.executable, "-m", "gnnserve.cli", "serve", "--store", str(store), "--model",
        str(ckpt), "--port", str(port), "--grpc-port", str(grpc_port), "--fanouts", "25,10",
        "--torch-threads", "1",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "NUMBA_NUM_THREADS": "1"}
    return subprocess.Popen(cmd, env={**env, "OMP_WAIT_POLICY": "PASSIVE"})


Caller = Callable[[np.ndarray, str, "int | None"], np.ndarray]


def _callers(port: int, grpc_port: int) -> dict[str, Caller]:
    """One function per arm: send the request for ``nodes`` and ``output`` (``seed``: fixed
    draws when not None), return the output."""
    import httpx
    import tritonclient.grpc as tgrpc
    import tritonclient.http as thttp

    session = httpx.Client(base_url=f"http://127.0.0.1:{port}")
    h = thttp.InferenceServerClient(url=f"127.0.0.1:{port}")
    g = tgrpc.InferenceServerClient(url=f"127.0.0.1:{grpc_port}")

    def http_json(nodes: np.ndarray, output: str, seed: int | None = None) -> np.ndarray:
        tensor = {"name": "node_ids", "shape": [nodes.size], "datatype": "INT64"}
        body: dict[str, Any] = {
            "inputs": [{**tensor, "data": nodes.tolist()}],
            "outputs": [{"name": output}],
        }
        if seed is not None:
            body["parameters"] = {"seed": seed}
        r = session.post("/v2/models/default/infer", json=body)
        r.raise_for_status()
        out = r.json()["outputs"][0]
        return np.array(out["data"]).reshape(out["shape"])

    def triton_call(module: Any, client: Any) -> Caller:
        def call(nodes: np.ndarray, output: str, seed: int | None = None) -> np.ndarray:
            ids = module.InferInput("node_ids", [nodes.size], "INT64")
            ids.set_data_from_numpy(nodes)
            out = [module.InferRequestedOutput(output)]
            params = None if seed is None else {"seed": seed}
            result = client.infer("default", [ids], outputs=out, parameters=params)
            return np.asarray(result.as_numpy(output))

        return call

    return {
        "http_json": http_json,
        "http_binary": triton_call(thttp, h),
        "grpc": triton_call(tgrpc, g),
    }


def _run_request(
    callers: dict[str, Caller], num_nodes: int, size: int, output: str, blocks: int, calls: int
) -> dict[str, Any]:
    """Interleaved blocks of one request over every arm: summary (ms) and raw times."""
    rng = np.random.default_rng(size)
    warm = 20
    draws = rng.integers(0, num_nodes, (blocks * calls + warm, size))
    answers = {arm: fn(draws[0], output, 7) for arm, fn in callers.items()}
    for arm, got in answers.items():  # the same seeded answer over every protocol
        np.testing.assert_allclose(got, answers["grpc"], rtol=1e-6, err_msg=arm)
    for fn in callers.values():  # warm-up: connections, first-call paths
        for row in draws[1:warm]:
            fn(row, output, None)
    raw: dict[str, list[float]] = {arm: [] for arm in ARMS}
    block_p50: dict[str, list[float]] = {arm: [] for arm in ARMS}
    for b in range(blocks):
        order = ARMS[b % len(ARMS) :] + ARMS[: b % len(ARMS)]
        rows = draws[warm + b * calls : warm + (b + 1) * calls]
        for arm in order:
            times = []
            for row in rows:
                t = time.perf_counter()
                callers[arm](row, output, None)
                times.append((time.perf_counter() - t) * 1e3)
            raw[arm] += times
            block_p50[arm].append(float(np.median(times)))
    summary = {
        arm: {
            "p50_ms": float(np.percentile(raw[arm], 50)),
            "p99_ms": float(np.percentile(raw[arm], 99)),
            "block_p50_ms_median": float(np.median(block_p50[arm])),
            "block_p50_ms": block_p50[arm],
        }
        for arm in ARMS
    }
    return {"nodes": size, "output": output, "calls": blocks * calls, "summary": summary,
            "raw_ms": raw}  # fmt: skip


def measure(blocks: int, scale: float) -> dict[str, Any]:
    """Every request of REQUESTS (calls per block times ``scale``) against one fresh server."""
    with tempfile.TemporaryDirectory() as tmp:
        store, ckpt, num_nodes = fb100_sage(Path(tmp), "random init for the protocol benchmark")
        port, grpc_port = free_port(), free_port()
        proc = _launch(store, ckpt, port, grpc_port)
        try:
            wait_ready(f"http://127.0.0.1:{port}", proc, timeout_s=180)
            callers = _callers(port, grpc_port)
            return {
                name: _run_request(callers, num_nodes, size, output, blocks, int(calls * scale))
                for name, (size, output, calls) in REQUESTS.items()
            }
        finally:
            stop_server(proc)


def main(quick: bool) -> None:
    """Measure, write results/serving_protocols(_quick).json, print the figures."""
    blocks, scale = (3, 0.25) if quick else (6, 1.0)
    t0 = time.perf_counter()
    requests = measure(blocks, scale)
    payload = {
        "blocks": blocks,
        "quick": quick,
        "wall_s": round(time.perf_counter() - t0, 1),
        "requests": requests,
    }
    out = write_results(result_name("serving_protocols", quick), payload)
    for name, request in requests.items():
        s = request["summary"]
        print(f"{name}: {request['nodes']} nodes, output {request['output']}")
        for arm in ARMS:
            print(f"  {arm:12s} p50 {s[arm]['p50_ms']:.3f} ms  p99 {s[arm]['p99_ms']:.3f} ms")
        for http in ("http_binary", "http_json"):
            ratio = s["grpc"]["p50_ms"] / s[http]["p50_ms"]
            print(f"  gRPC p50 / {http} p50 = {ratio:.2f} (target <= 1)")
    print(f"wrote {out}")
