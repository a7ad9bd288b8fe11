"""What a second model costs a server's memory: its parameters, or the graph again?

An R-MAT graph (2^18 nodes, 4M edges, 128-dim features: ~150 MB of graph and features) served
by `gnnserve serve` with one GraphSAGE model, then with that model and a second one of the same
shape (other weights) over the same graph (``--model a=CKPT --model b=CKPT2``). Each server is
warmed up and answers 200 requests per model (fanouts [10, 5], 8 nodes each); its
proportional set size (PSS, /proc/<pid>/smaps_rollup: shared pages counted once across
processes) and RSS are read once ready, right after the requests, and after 2.5 s without any
(the server gives the heap's free pages back after 1 s idle: models/heap.py). Two model sizes:
2x256 (0.3 MB of parameters) and 3x2048 (36 MB),
three rounds of the two servers each, interleaved. Published: the median growth from one model
to two against the second model's parameter bytes (target: <= 1.1x those bytes).

    python bench/models_memory.py            # results/models_memory.json
    python bench/models_memory.py --quick    # 1 round, 2^16 nodes
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import result_name, write_results  # noqa: E402
from gnnserve.data import generators  # noqa: E402
from gnnserve.data.writer import write_store  # noqa: E402
from gnnserve.demo import stop_server, wait_ready  # noqa: E402
from gnnserve.models.checkpoint import save_checkpoint  # noqa: E402
from gnnserve.models.zoo import GNN, ModelConfig  # noqa: E402
from gnnserve.ports import free_port  # noqa: E402

SHAPES = {"2x256": (2, 256), "3x2048": (3, 2048)}  # layers, hidden width
REQUESTS_PER_MODEL = 200
TARGET_RATIO = 1.1
IDLE_S = 2.5  # seconds without requests before the last reading


def _checkpoint(out: Path, layers: int, hidden: int, seed: int) -> tuple[Path, int]:
    """A random-init GraphSAGE checkpoint; (its directory, its parameter bytes)."""
    torch.manual_seed(seed)
    config = ModelConfig(arch="sage", in_dim=128, hidden_dim=hidden, out_dim=8, num_layers=layers)
    model = GNN(config)
    fanouts = [10, 5, 5][:layers]
    save_checkpoint(
        out, model, config, {"note": "random init (memory benchmark)", "fanouts": fanouts}
    )
    return out, sum(p.numel() * p.element_size() for p in model.parameters())


def _memory_kb(pid: int) -> dict[str, int]:
    """PSS and RSS of process ``pid`` (kB, /proc/<pid>/smaps_rollup)."""
    fields = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("Pss", "Rss"):
            fields[key.lower()] = int(rest.split()[0])
    return fields


def _serve(
    store: Path, models: list[tuple[str, Path]], fanouts: str, nodes: int
) -> dict[str, dict[str, int]]:
    """Start a server of ``models``; its memory once ready and after requests to each model."""
    port = free_port()
    cmd = [sys.executable, "-m", "gnnserve.cli", "serve", "--store", str(store), "--port",
           str(port), f"--fanouts={fanouts}", "--name", models[0][0], "--model",
           str(models[0][1]), *[f"--model={name}={path}" for name, path in models[1:]]]  # fmt: skip
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_WAIT_POLICY": "PASSIVE"}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, proc, timeout_s=600)
        time.sleep(1.0)
        ready = _memory_kb(proc.pid)
        rng = np.random.default_rng(0)
        with httpx.Client(base_url=url, timeout=60) as client:
            for name, _ in models:
                for _ in range(REQUESTS_PER_MODEL):
                    ids = rng.integers(0, nodes, 8).tolist()
                    r = client.post("/v1/predict", json={"nodes": ids, "model": name})
                    r.raise_for_status()
        after = _memory_kb(proc.pid)  # at once: the activations' pages still held
        time.sleep(IDLE_S)  # the server's idle trimmer gives them back after 1 s without work
        return {"ready": ready, "after_traffic": after, "idle_after_traffic": _memory_kb(proc.pid)}
    finally:
        stop_server(proc, timeout_s=120)


def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--quick", action="store_true", help="1 round on 2^16 nodes")
    opts = p.parse_args()
    rounds, log2 = (1, 16) if opts.quick else (3, 18)
    nodes, edges = 2**log2, 16 * 2**log2
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        data = generators.rmat(num_nodes=nodes, num_edges=edges, feature_dim=128)
        store = work / "store"
        write_store(data, store)
        store_mb = sum(f.stat().st_size for f in store.rglob("*") if f.is_file()) / 2**20
        shapes: dict[str, Any] = {}
        for shape, (layers, hidden) in SHAPES.items():
            first, _ = _checkpoint(work / f"{shape}_a", layers, hidden, 0)
            second, second_bytes = _checkpoint(work / f"{shape}_b", layers, hidden, 1)
            fanouts = ",".join(map(str, [10, 5, 5][:layers]))
            one, two = [], []
            for r in range(rounds):
                arms = [("one", [("a", first)]), ("two", [("a", first), ("b", second)])]
                for arm, models in arms if r % 2 == 0 else arms[::-1]:
                    (one if arm == "one" else two).append(_serve(store, models, fanouts, nodes))
                print(f"{shape} round {r + 1}: one {one[-1]}, two {two[-1]} (kB)", flush=True)
            growth = {
                f"{when}_{k}": [
                    (b[when][k] - a[when][k]) * 1024 for a, b in zip(one, two, strict=True)
                ]
                for when in ("ready", "after_traffic", "idle_after_traffic")
                for k in ("pss", "rss")
            }
            shapes[shape] = {
                "second_model_parameter_bytes": second_bytes,
                "one_model_kb": one,
                "two_models_kb": two,
                "growth_bytes": growth,
                "growth_over_parameters_median": {
                    k: float(np.median(v)) / second_bytes for k, v in growth.items()
                },
            }
    payload = {
        "graph": {
            "nodes": nodes,
            "edges": edges,
            "feature_dim": 128,
            "store_mb": round(store_mb, 1),
        },
        "rounds": rounds,
        "requests_per_model": REQUESTS_PER_MODEL,
        "target_growth_over_parameters": TARGET_RATIO,
        "quick": opts.quick,
        "wall_s": round(time.perf_counter() - t0, 1),
        "shapes": shapes,
    }
    out = write_results(result_name("models_memory", opts.quick), payload)
    for shape, sh in shapes.items():
        mb = sh["second_model_parameter_bytes"] / 2**20
        print(f"{shape}: the second model's parameters are {mb:.1f} MB; it adds (median)")
        for key, ratio in sh["growth_over_parameters_median"].items():
            grown = np.median(sh["growth_bytes"][key]) / 2**20
            print(
                f"  {key}: {grown:.1f} MB = {ratio:.2f}x its parameters (target <= {TARGET_RATIO}x)"
            )
    print(f"the store is {store_mb:.0f} MB")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
