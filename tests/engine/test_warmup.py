"""Start-up warm-up: ready means the request path is compiled and has run once."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
import uvicorn

from gnnserve.config import ServeConfig
from gnnserve.engine.loader import build_engine
from gnnserve.graph import open_graph_store
from gnnserve.ports import free_port
from gnnserve.server.app import create_app
from tests.engine.test_engine import _Gate

# Serves each configuration in turn with a real uvicorn server; once /v2/health/ready answers
# 200 it records the signatures every numba dispatcher of gnnserve holds, sends the requests,
# and records them again. Run in a fresh interpreter: nothing is compiled or loaded from numba's
# on-disk cache before start-up, and a kernel loaded from that cache after ready shows as a new
# signature just as one compiled after ready does (so the shared cache serves: an empty one cost
# ~20 s of compiling and proved nothing more).
_SERVE_AND_RECORD = r"""
import json, sys, threading, time
import httpx, uvicorn
from gnnserve.compiled import compiled_signatures as signatures
from gnnserve.config import ServeConfig
from gnnserve.ports import free_port
from gnnserve.engine.loader import build_engine
from gnnserve.server.app import create_app

results = []
for settings, requests in json.loads(sys.argv[1]):
    app = create_app(build_engine(ServeConfig.load(None, **settings)), "m")
    port = free_port()
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{port}"
    while True:
        try:
            if httpx.get(f"{base}/v2/health/ready").status_code == 200:
                break
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    ready = signatures()
    answers = [httpx.post(f"{base}/v1/predict", json=b, timeout=120) for b in requests]
    statuses = [r.status_code for r in answers]
    results.append({"ready": ready, "served": signatures(), "statuses": statuses})
    server.should_exit = True
    thread.join(60)
print(json.dumps(results))
"""

_K = "gnnserve.sampling.kernels."


def _serve_fresh(runs: list) -> list[dict]:
    proc = subprocess.run(
        [sys.executable, "-c", _SERVE_AND_RECORD, json.dumps(runs)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.splitlines()[-1])


@pytest.mark.slow
def test_ready_server_compiles_nothing_for_its_requests(pe_store: Path, small_ckpt: Path) -> None:
    base = {"store.path": str(pe_store), "model_path": str(small_ckpt), "sampler.fanouts": [10, 5]}
    # threshold 5000: 1 seed (~60 expected nodes) samples inline; 200 seeds go hop by hop, hop 1
    # (2,000 edges) with serial draws, hop 2 (> 5,000) parallel; 2,000 seeds parallel throughout
    static = {**base, "sampler.parallel_threshold": 5000}
    plain = [{"nodes": [5]}, {"nodes": list(range(200))}, {"nodes": list(range(2000))}]
    kinds = [{"nodes": [7, 9], "output": o} for o in ("probs", "embedding")]
    new_node = {"new_nodes": {"features": [[0.5] * 16], "edges": [[0, 3], [0, 11]]}}
    modes = [{**new_node, "mode": m} for m in ("full", "ns", "pe")]  # beside the default srpe
    policies = [{**new_node, "policy": p} for p in ("importance", "random")]
    seeded = [{"nodes": [5], "seed": 3}, {"nodes": list(range(200)), "seed": 4}]
    presampled = {**base, "sampler.presample": True}  # a seed bypasses its reservoirs
    runs = [[static, [*plain, *kinds, new_node, *modes, *policies]], [presampled, plain + seeded]]

    first, second = _serve_fresh(runs)

    for run in (first, second):
        assert set(run["statuses"]) == {200}, run["statuses"]
        changed = {k: v for k, v in run["served"].items() if run["ready"].get(k) != v}
        assert not changed, f"compiled after ready: {changed}"
    indices = open_graph_store(pe_store).adjacency()[2].dtype
    assert any(f"Array({indices}, 1, 'C'" in s for s in first["ready"][_K + "sample_inline"])
    for kernel in ("draw_serial", "draw_parallel", "relabel", "unique_seeds"):
        assert first["ready"][_K + kernel], kernel
    assert first["ready"]["gnnserve.features.stores._gather_serial"]
    assert first["ready"]["gnnserve.newnodes.plan._gather"]  # the new-node (SRPE) plan
    assert second["ready"]["gnnserve.sampling.presample_kernels.assemble"]


def test_ready_is_503_until_the_warm_up_has_run(small_store: Path, small_ckpt: Path) -> None:
    config = ServeConfig.load(
        None, **{"store.path": str(small_store), "model_path": str(small_ckpt)}
    )
    engine = build_engine(config)
    gate = _Gate(engine.runner)  # the warm-up's forward waits for it
    engine.runner = gate  # type: ignore[assignment]
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(create_app(engine, "m"), host="127.0.0.1", port=port, log_level="warning")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{port}"
    try:
        while not server.started:
            time.sleep(0.05)
        assert httpx.get(f"{base}/v2/health/live").status_code == 200
        for path in ("/v2/health/ready", "/v2/models/m/ready"):
            r = httpx.get(f"{base}{path}")
            assert (r.status_code, r.json()["ready"]) == (503, False), path
        assert not engine.warm
        gate.event.set()
        deadline = time.monotonic() + 30
        while httpx.get(f"{base}/v2/health/ready").status_code != 200:
            assert time.monotonic() < deadline, "not ready after the warm-up was released"
            time.sleep(0.05)
        assert engine.warm
        r = httpx.get(f"{base}/v2/models/m/ready")
        assert (r.status_code, r.json()) == (200, {"name": "m", "ready": True})
    finally:
        gate.event.set()
        server.should_exit = True
        thread.join(30)


def test_warm_up_off_is_ready_at_once_without_running_the_model(
    small_store: Path, small_ckpt: Path
) -> None:
    """compute.warm_up = False (``--no-warm-up``): warm at once, no forward before a request."""
    config = ServeConfig.load(
        None,
        **{"store.path": str(small_store), "model_path": str(small_ckpt), "compute.warm_up": False},
    )
    engine = build_engine(config)
    forwards = []
    runner = engine.runner

    class Counting(_Gate):
        def forward(self, batch):
            forwards.append(batch)
            return runner.forward(batch)

    engine.runner = Counting(runner)  # type: ignore[assignment]
    try:
        assert not engine.warm
        assert engine.warm_up() == {}
        assert engine.warm and forwards == []
        assert engine.predict([1, 2], timeout_s=30).values.shape == (2,)
        assert len(forwards) == 1  # the counter sees real forwards
    finally:
        engine.stop()
