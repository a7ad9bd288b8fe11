"""HTTP serving load: `gnnserve serve` vs the PyG baseline server (bench/baseline_server.py).

GraphSAGE, 2 layers, hidden 256, fanouts [25, 10], single-node requests on fb100_cornell5 with
128-dim random features (both servers load the same store and checkpoint; weights are a seeded
random init: throughput does not depend on their values). Open-loop Poisson load at a ladder of
rates, one server at a time, the load generator in this process. Reports, per server, the highest
throughput whose p99 <= 30 ms, and both servers' p99 at a load both sustain.

    python bench/serving.py            # full run (< 10 min)
    python bench/serving.py --quick    # smoke run
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import gnnserve  # noqa: F401  (first: sets the OpenMP wait policy)

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import DATASETS, Targets, parse_args, save_figure, write_results  # noqa: E402
from gnnserve import loadgen  # noqa: E402
from gnnserve.data.writer import GraphData, write_store  # noqa: E402
from gnnserve.demo import free_port, start_server, stop_server, wait_ready  # noqa: E402
from gnnserve.models.checkpoint import save_checkpoint  # noqa: E402
from gnnserve.models.zoo import GNN, ModelConfig  # noqa: E402

P99_BUDGET_MS = 30.0
RATES = [50, 100, 150, 200, 250, 300, 400, 500, 650, 800, 1000, 1250, 1600, 2000, 2500, 3200]


def prepare(workdir: Path) -> tuple[Path, Path, int]:
    """fb100_cornell5 store with 128-dim features and a random-init GraphSAGE checkpoint."""
    with np.load(DATASETS / "fb100_cornell5.npz") as z:
        edge_index, n = z["edge_index"], int(z["num_nodes"])
    x = np.random.default_rng(0).standard_normal((n, 128), dtype=np.float32)
    store = workdir / "store"
    write_store(GraphData("fb100_cornell5", n, edge_index, x), store)
    import torch

    torch.manual_seed(0)
    config = ModelConfig(arch="sage", in_dim=128, hidden_dim=256, out_dim=2, num_layers=2)
    ckpt = workdir / "sage"
    save_checkpoint(ckpt, GNN(config), config, {"note": "random init for the serving benchmark"})
    return store, ckpt, n


def start_baseline(store: Path, ckpt: Path, port: int) -> subprocess.Popen[bytes]:
    """Start bench/baseline_server.py on loopback."""
    cmd = [
        sys.executable,
        str(Path(__file__).with_name("baseline_server.py")),
        "--store",
        str(store),
        "--model",
        str(ckpt),
        "--port",
        str(port),
    ]
    return subprocess.Popen(cmd, env={**os.environ, "PYTHONUNBUFFERED": "1"})


def wait_health(url: str, proc: subprocess.Popen[bytes], timeout_s: float = 120.0) -> None:
    """Poll ``url`` until it answers 200."""
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"baseline exited with {proc.returncode}")
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise RuntimeError("baseline not ready")


def ladder(url: str, num_nodes: int, duration: float, rates: list[float]) -> list[dict[str, float]]:
    """Open-loop runs at increasing rates until p99 passes 3x the budget or errors appear."""
    rows = []
    for rate in rates:
        rng = np.random.default_rng(int(rate))
        nodes = rng.integers(0, num_nodes, int(rate * duration) + 1)
        report = asyncio.run(
            loadgen.open_loop(
                url, lambda i, n=nodes: {"nodes": [int(n[i])]}, rate, duration, seed=int(rate)
            )
        )
        row = report.summary()
        print(
            f"  offered {rate:6.0f}/s  got {row['throughput_rps']:7.1f}/s  "
            f"p50 {row['p50_ms']:7.2f} ms  p99 {row['p99_ms']:8.2f} ms  errors {row['errors']}"
        )
        rows.append(row)
        if row["p99_ms"] > 3 * P99_BUDGET_MS or row["errors"]:
            break
    return rows


def best_within_budget(rows: list[dict[str, float]]) -> float:
    """Highest throughput among runs with p99 <= budget and no errors (0 if none)."""
    ok = [r["throughput_rps"] for r in rows if r["p99_ms"] <= P99_BUDGET_MS and not r["errors"]]
    return max(ok, default=0.0)


def run_server(
    kind: str, store: Path, ckpt: Path, n: int, duration: float, rates: list[float]
) -> list[dict[str, float]]:
    """Start one server, warm it up, run the ladder, stop it."""
    port = free_port()
    if kind == "gnnserve":
        proc = start_server(store, ckpt, port, "--fanouts", "25,10")
        wait_ready(f"http://127.0.0.1:{port}", proc)
        url = f"http://127.0.0.1:{port}/v1/predict"
    else:
        proc = start_baseline(store, ckpt, port)
        wait_health(f"http://127.0.0.1:{port}/health", proc)
        url = f"http://127.0.0.1:{port}/predict"
    try:
        warm = [{"nodes": [i]} for i in range(200)]
        asyncio.run(loadgen.closed_loop(url, warm, 8))
        print(f"[{kind}]")
        return ladder(url, n, duration, rates)
    finally:
        stop_server(proc)


def plot(results: dict[str, list[dict[str, float]]], path: Path) -> None:
    """p99 latency against achieved throughput, both servers, with the 30 ms budget."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for name, rows in results.items():
        ax.plot([r["throughput_rps"] for r in rows], [r["p99_ms"] for r in rows], "o-", label=name)
    ax.axhline(P99_BUDGET_MS, color="grey", ls=":", label="p99 budget 30 ms")
    ax.set(
        xscale="log",
        yscale="log",
        xlabel="throughput (requests/s)",
        ylabel="p99 latency (ms)",
        title="single-node requests, GraphSAGE 2x256, fanouts [25, 10]",
    )
    ax.legend()
    save_figure(fig, path)


def main() -> None:
    args = parse_args(__doc__, "smoke run: short steps")
    duration = 2.0 if args.quick else 6.0
    with tempfile.TemporaryDirectory() as tmp:
        store, ckpt, n = prepare(Path(tmp))
        results = {
            k: run_server(k, store, ckpt, n, duration, RATES) for k in ("baseline", "gnnserve")
        }
        best = {k: best_within_budget(v) for k, v in results.items()}
        # fixed load both sustain: the baseline's best rate within budget (at least the lowest rung)
        fixed = max(best["baseline"], RATES[0])
        fixed_rows = {k: run_server(k, store, ckpt, n, duration, [fixed])[0] for k in results}
    ratio = best["gnnserve"] / best["baseline"] if best["baseline"] else float("inf")
    out = write_results(
        "serving",
        {
            "p99_budget_ms": P99_BUDGET_MS,
            "duration_s_per_rate": duration,
            "quick": args.quick,
            "ladder": results,
            "throughput_within_budget": best,
            "throughput_ratio": ratio,
            "fixed_load_rps": fixed,
            "fixed_load": fixed_rows,
        },
    )
    plot(results, out.with_suffix(".png"))
    print(
        f"throughput at p99 <= {P99_BUDGET_MS} ms: gnnserve {best['gnnserve']:.0f}/s, "
        f"baseline {best['baseline']:.0f}/s ({ratio:.1f}x)"
    )
    print(
        f"p99 at {fixed:.0f}/s: gnnserve {fixed_rows['gnnserve']['p99_ms']:.2f} ms, "
        f"baseline {fixed_rows['baseline']['p99_ms']:.2f} ms"
    )
    print(f"wrote {out} and {out.with_suffix('.png')}")
    targets = Targets()
    targets.check("serving_throughput_ratio_at_p99_30ms", ratio, 5.0)
    targets.print()


if __name__ == "__main__":
    main()
