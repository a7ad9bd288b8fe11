"""HTTP request latency while the graph changes: `gnnserve serve --update-log` on demand, with
`--presample`, with `--deploy dgs` (1 sampling + 1 serving Ray worker), and with `--workers 2`
(two server processes sharing the log; `--modes` adds it), on fb100_cornell5 and soc_epinions1.

Single-node prediction requests (seeds drawn proportionally to in-degree, so skewed toward hubs)
arrive open-loop at a fixed rate; at the same time update batches of 100 operations (half edge
inserts, half deletes of existing edges) are POSTed to /v1/graph/updates at increasing rates.
Model: random-init GraphSAGE 2 x 64 on 16-dim random features, fanouts [25, 10]. The client
(this process) shares the machine's cores with the server.

Cells at 0, 10K and 40K offered updates/s, 3 interleaved rounds (order reversed every other
round), medians beside the applied rate (a client or server that cannot keep up applies less:
compare cells at equal applied rates). Edge-only update bodies take the server's scan path.

    python bench/dynamic_http.py            # full run (~14 min)
    python bench/dynamic_http.py --quick    # smoke run (one round, 2 s cells)
    python bench/dynamic_http.py --modes dgs --datasets soc_epinions1   # a subset of the cells
    python bench/dynamic_http.py --modes presample,workers2,dgs --datasets fb100_cornell5
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import numpy as np
import torch

import gnnserve  # noqa: F401  (first: sets the OpenMP wait policy)

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import Targets, result_name, write_results  # noqa: E402
from dynamic import (  # noqa: E402
    BATCH,
    cell_rounds,
    check_latency_targets,
    make_store,
    plot_latency,
    summarise,
    update_stream,
)
from gnnserve import loadgen  # noqa: E402
from gnnserve.demo import start_server, stop_server, wait_ready  # noqa: E402
from gnnserve.graph import open_graph_store  # noqa: E402
from gnnserve.models.checkpoint import save_checkpoint  # noqa: E402
from gnnserve.models.zoo import GNN, ModelConfig  # noqa: E402
from gnnserve.ports import free_port  # noqa: E402

UPDATE_RATES = [0, 10_000, 40_000]  # offered updates per second (batches of 100 edge ops)
MODE_FLAGS = {  # serve flags of each mode
    "on_demand": [],
    "presample": ["--presample"],
    "dgs": ["--deploy", "dgs", "--deploy-workers", "1"],  # 1 sampling + 1 serving Ray actor
    "workers2": ["--workers", "2"],  # two server processes sharing one update log
}
DEFAULT_MODES = "on_demand,presample,dgs"
ROUNDS = 3  # interleaved: every (mode, rate) cell once per round, the order reversed each round
REQUEST_RATE = 300.0  # prediction requests per second


def make_checkpoint(out: Path) -> Path:
    """Random-init GraphSAGE for the 16-dim features of ``make_store``."""
    torch.manual_seed(0)
    config = ModelConfig(arch="sage", in_dim=16, hidden_dim=64, out_dim=2, num_layers=2)
    save_checkpoint(out, GNN(config), config, {"note": "random init for bench/dynamic_http.py"})
    return out


async def send_updates(url: str, batches: list[list[dict]], rate: float, duration: float) -> int:
    """POST batches paced to ``rate`` updates/s for ``duration`` s; returns updates applied."""
    applied = 0
    async with aiohttp.ClientSession() as session:
        start = time.perf_counter()
        for i, batch in enumerate(batches):
            due = start + i * BATCH / rate
            if due - start > duration:
                break
            await asyncio.sleep(max(0.0, due - time.perf_counter()))
            async with session.post(url, json={"ops": batch}) as resp:
                if resp.status == 200:
                    applied += len(batch)
                await resp.read()
    return applied


async def one_cell(
    base: str, seeds: np.ndarray, batches: list[list[dict]], rate: float, duration: float
) -> dict[str, float]:
    """Requests and (when rate > 0) updates together for ``duration`` s."""

    def payload(i: int) -> dict[str, object]:
        return {"nodes": [int(seeds[i % seeds.size])]}

    requests = loadgen.open_loop(f"{base}/v1/predict", payload, REQUEST_RATE, duration)
    if rate:
        report, applied = await asyncio.gather(
            requests, send_updates(f"{base}/v1/graph/updates", batches, rate, duration)
        )
    else:
        report, applied = await requests, 0
    row = report.summary()
    row.update({"offered_update_rate": rate, "achieved_update_rate": applied / duration})
    return row


def run_cell(
    store: Path,
    ckpt: Path,
    work: Path,
    mode: str,
    rate: float,
    batches: list[list[dict]],
    seeds: np.ndarray,
    duration: float,
) -> dict[str, float]:
    """One (mode, update rate) cell on a fresh server (fresh update log)."""
    log = work / f"updates-{store.name}-{mode}-{rate}.log"
    log.unlink(missing_ok=True)
    port = free_port()
    extra = ["--update-log", str(log), "--fsync", "never", "--fanouts", "25,10"]
    proc = start_server(store, ckpt, port, *extra, *MODE_FLAGS[mode])
    base = f"http://127.0.0.1:{port}"
    try:
        wait_ready(base, proc)
        asyncio.run(
            loadgen.closed_loop(f"{base}/v1/predict", [{"nodes": [int(s)]} for s in seeds[:300]], 8)
        )
        return asyncio.run(one_cell(base, seeds, batches, rate, duration))
    finally:
        stop_server(proc)


def run_rounds(
    name: str,
    store: Path,
    ckpt: Path,
    work: Path,
    batches: list[list[dict]],
    seeds: np.ndarray,
    duration: float,
    rounds: int,
    modes: list[str],
) -> dict[str, list[dict]]:
    """Every (mode, rate) cell once per round, the order reversed in odd rounds; medians."""

    def run(mode: str, rate: int) -> dict:
        return run_cell(store, ckpt, work, mode, rate, batches, seeds, duration)

    def describe(mode: str, rate: int, row: dict) -> str:
        return (
            f"[{name}] {mode:9s} updates offered {rate:6d}/s applied "
            f"{row['achieved_update_rate']:6.0f}/s  p50 {row['p50_ms']:.2f} ms  "
            f"p99 {row['p99_ms']:.2f} ms  ok {row['ok']} errors {row['errors']}"
        )

    cells = cell_rounds(modes, UPDATE_RATES, rounds, run, describe)
    return summarise(cells, ("achieved_update_rate", "p50_ms", "p99_ms"), "ok")


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: one round, 2 s cells")
    parser.add_argument("--modes", default=DEFAULT_MODES, help="comma-separated")
    parser.add_argument("--datasets", default="fb100_cornell5,soc_epinions1")
    args = parser.parse_args()
    modes = args.modes.split(",")
    if not set(modes) <= set(MODE_FLAGS):
        raise SystemExit(f"--modes: each one of {list(MODE_FLAGS)}")
    duration = 2.0 if args.quick else 8.0  # 2,400 requests a cell: p99 on >= 2,000
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        ckpt = make_checkpoint(work / "sage")
        for name in args.datasets.split(","):
            store = make_store(name, work)
            batches = update_stream(store, int(max(UPDATE_RATES) * duration * 1.2), 1)
            deg = open_graph_store(store).in_degree().astype(float)
            seeds = np.random.default_rng(3).choice(deg.size, 20_000, p=deg / deg.sum())
            rounds = 1 if args.quick else ROUNDS
            results[name] = run_rounds(
                name, store, ckpt, work, batches, seeds, duration, rounds, modes
            )
    out = write_results(
        result_name(
            "dynamic_http" + ("" if args.modes == DEFAULT_MODES else "_" + "_".join(modes)),
            args.quick,
        ),
        {
            "request_rate": REQUEST_RATE,
            "batch": BATCH,
            "update_rates": UPDATE_RATES,
            "quick": args.quick,
            "results": results,
        },
    )
    title = f"HTTP, {REQUEST_RATE:.0f} req/s"
    plot_latency(results, out.with_suffix(".png"), title, "achieved_update_rate")
    print(f"wrote {out} and {out.with_suffix('.png')}")
    targets = Targets()
    for name, res in results.items():
        check_latency_targets(targets, f"{name}_http", res)
    targets.print()


if __name__ == "__main__":
    main()
