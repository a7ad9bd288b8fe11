"""Workload-aware serving (Quiver §4–§6) on this machine: placement, pipelines, routing.

Sections (``--sections``, comma-separated; all by default):

- ``placement`` (bench/quiver_placement.py): hot-tier hit rate of FAP vs degree-ranked vs random
  placement at 10% and 25% RAM budgets on a Zipf-skewed and a uniform stream, with the best
  static placement (ranked by the scored accesses themselves) as the ceiling; share of feature
  reads served remotely across P = 2, 4 (and 8, by counting) servers for FAP vs hash vs degree.
- ``pipelines`` (bench/quiver_pipelines.py): throughput of 1 vs 2 vs 4 shared-queue pipelines,
  and of 2 and 4 pipelines with a queue each (client i on pipeline i mod N).
- ``calibration``, ``slo``, ``routing`` (bench/quiver_routing.py): the calibration curves and
  crossover points per graph; PSGS-Strict / Loose vs fixed batch-size bounds at a 10 ms SLO
  (``slo``) and at 30 ms (``slo30``: 10 ms is out of reach for a 128-node request on 2 cores);
  hybrid routing vs each single path (capacity at p99 <= 30 ms). On fb100.
- ``devices`` (bench/quiver_devices.py): sample + feature gather per batch on every sampling path
  this machine has (inline, parallel, torch; cuda with a GPU) vs PyG's NeighborLoader (on the
  GPU too where there is one), per graph.

Graphs: fb100_cornell5 (16,801 nodes) and an R-MAT graph of 2^20 nodes and 10M edges (``--rmat``;
minutes to generate). Results: bench/results/quiver.json and quiver.png.
Run: ``.venv/bin/python bench/quiver.py`` (``--quick``: fb100 only, fewer requests, 1 round).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np
import torch

import gnnserve  # noqa: F401  (first: sets the OpenMP wait policy)
from common import RESULTS, Targets, environment, fb100_sage, save_figure, strict
from gnnserve.data import generators
from gnnserve.data.writer import write_store
from gnnserve.deploy.ray import start_ray, stop_ray
from gnnserve.graph import open_graph_store
from gnnserve.models.checkpoint import save_checkpoint
from gnnserve.models.zoo import GNN, ModelConfig
from quiver_devices import run_devices
from quiver_pipelines import run_pipelines
from quiver_placement import (
    BUDGETS,
    gather_times,
    measured_remote_share,
    remote_shares,
    run_stream,
    server_plans,
)
from quiver_routing import run_calibration, run_routing, run_slo
from quiver_streams import STREAMS

FANOUTS = [25, 10]
SERVERS = (2, 4, 8)


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--quick", action="store_true")
    p.add_argument(
        "--sections", default="placement,pipelines,calibration,slo,slo30,routing,devices"
    )
    p.add_argument("--rmat", action="store_true", help="also the 2^20-node R-MAT graph")
    p.add_argument("--requests", type=int, default=20_000, help="per stream half")
    p.add_argument("--measured", type=int, default=2000, help="requests through real stores")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--window-s", type=float, default=10.0)
    p.add_argument("--work", type=Path, default=Path("/tmp/gnnserve-quiver-bench"))
    return p.parse_args()


def graphs(args: argparse.Namespace) -> dict[str, tuple[Path, Path]]:
    """(store, checkpoint) of each benchmark graph (written once into ``--work``)."""
    fb = args.work / "fb100"
    if not (fb / "store" / "meta.json").exists():
        fb.mkdir(parents=True, exist_ok=True)
        fb100_sage(fb, "quiver bench")
    out = {"fb100_cornell5": (fb / "store", fb / "sage")}
    if args.rmat:
        rmat = args.work / "rmat"
        if not (rmat / "store" / "meta.json").exists():
            print("[quiver] generating R-MAT 2^20 nodes / 10M edges ...", flush=True)
            data = generators.rmat(num_nodes=2**20, num_edges=10_000_000, feature_dim=64)
            write_store(data, rmat / "store", overwrite=True)
        if not (rmat / "sage").exists():
            torch.manual_seed(0)
            config = ModelConfig(arch="sage", in_dim=64, hidden_dim=64, out_dim=16, num_layers=2)
            save_checkpoint(rmat / "sage", GNN(config), config, {"note": "quiver bench"})
        out["rmat"] = (rmat / "store", rmat / "sage")
    return out


def placement(
    args: argparse.Namespace, stores: dict[str, tuple[Path, Path]], targets: Targets
) -> list:
    """Hit rates and remote shares per graph and stream."""
    rows = []
    for name, (store, _) in stores.items():
        graph = open_graph_store(store)
        for kind in STREAMS:
            print(f"[quiver] placement {name} {kind} ...", flush=True)
            row = run_stream(graph, FANOUTS, kind, args.requests, SERVERS)
            row["remote_share_counted"] = remote_shares(graph, FANOUTS, row, SERVERS)
            row["remote_share_measured"] = measured_shares(store, graph, row, args.measured)
            row["gather_ms"] = {
                f"{b:.0%}": gather_times(
                    store, row["ranking"], graph, FANOUTS, row["future"][: args.measured], b
                )
                for b in BUDGETS
            }
            report(name, kind, row, targets)
            public = {k: v for k, v in row.items() if k not in PRIVATE}
            rows.append({"graph": name, **public})
    return rows


PRIVATE = ("history", "future", "accesses", "ranking")


def measured_shares(store: Path, graph: Any, row: dict, requests: int) -> dict:
    """Remote share through real feature-server actors for P = 2, 4 (a share of the stream)."""
    started = start_ray(num_cpus=4)
    try:
        out = {}
        for p in (2, 4):
            plans = server_plans(graph, FANOUTS, row["history"], p)
            seeds = row["future"][:requests]
            out[str(p)] = {
                n: measured_remote_share(store, plan, graph, FANOUTS, seeds)
                for n, plan in plans.items()
            }
        return out
    finally:
        stop_ray(started)


def report(name: str, kind: str, row: dict, targets: Targets) -> None:
    """Print a stream's figures and record its targets."""
    hr = row["hit_rate"]
    for b in BUDGETS:
        key = f"{b:.0%}"
        print(
            f"[quiver] {name} {kind} hot {key}: fap {hr['fap'][key]:.3f} degree "
            f"{hr['degree'][key]:.3f} past reads {hr['past_reads'][key]:.3f} lru "
            f"{hr['lru'][key]:.3f} random "
            f"{hr['random'][key]:.3f} best static {hr['best_static'][key]:.3f}",
            flush=True,
        )
        gain = hr["fap"][key] - hr["degree"][key]
        goal = 0.10 if kind == "zipf" else 0.0
        targets.check(f"{name} {kind} hot {key}: FAP - degree hit rate", gain, goal)
        past = hr["fap"][key] - hr["past_reads"][key]
        targets.check(f"{name} {kind} hot {key}: FAP - past-reads hit rate", past, 0.0)
        lru = hr["fap"][key] - hr["lru"][key]
        targets.check(f"{name} {kind} hot {key}: FAP - LRU hit rate", lru, 0.0)
        g = row["gather_ms"][key]
        print(f"[quiver]   gather ms {key}: " + " ".join(f"{k} {v:.3f}" for k, v in g.items()))
    for p, shares in row["remote_share_counted"].items():
        print(
            f"[quiver]   P={p} remote share: " + " ".join(f"{k} {v:.3f}" for k, v in shares.items())
        )
    for p, shares in row["remote_share_measured"].items():
        print(
            f"[quiver]   P={p} measured:     " + " ".join(f"{k} {v:.3f}" for k, v in shares.items())
        )
    four = row["remote_share_counted"]["4"]
    targets.check(
        f"{name} {kind} P=4 remote bytes FAP / hash", four["fap"] / four["hash"], 0.5,
        higher_is_better=False,
    )  # fmt: skip
    if kind == "zipf":  # equal memory: both hold N/P rows per server
        equal = four["fap_no_slack"] / four["hash"]
        targets.check(f"{name} zipf P=4 remote bytes, equal memory: FAP / hash", equal, 0.7, False)


def main() -> None:
    args = parse()
    if args.quick:
        args.requests, args.rounds, args.window_s, args.measured = 3000, 1, 3.0, 300
    args.work.mkdir(parents=True, exist_ok=True)
    stores = graphs(args)
    name = "quiver_quick" if args.quick else "quiver"
    path = RESULTS / f"{name}.json"
    results: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
    for section in args.sections.split(","):  # a rerun of some sections keeps the others
        targets = Targets()
        results[section] = {
            "environment": environment(),
            "args": vars(args) | {"work": str(args.work)},
            "results": SECTIONS[section](args, stores, targets),
            "targets": targets.rows,
        }
        results["targets"] = [t for s in results.values() if "results" in s for t in s["targets"]]
        path.write_text(json.dumps(strict(results), indent=2, allow_nan=False, default=float))
        targets.print()
    plot(results, RESULTS / f"{name}.png")


def pipelines(
    args: argparse.Namespace, stores: dict[str, tuple[Path, Path]], targets: Targets
) -> dict:
    """Throughput of 1, 2 and 4 shared-queue pipelines on fb100, and of 2 and 4 pipelines with
    a queue each."""
    store, ckpt = stores["fb100_cornell5"]
    out = run_pipelines(store, ckpt, 16_801, [1, 2, 4], args.rounds, args.window_s)
    targets.check("shared-queue pipelines (best) / one", _best_ratio(out), 1.3)
    for c, v in out["shared_over_own_queues"].items():
        targets.check(f"{c} pipelines: shared queue / a queue per pipeline", v["median"], 1.2)
    return out


def _best_ratio(out: dict[str, Any]) -> float:
    return max(v["median"] for c, v in out["ratio_over_one"].items() if c.isdigit() and c != "1")


def calibration(
    args: argparse.Namespace, stores: dict[str, tuple[Path, Path]], targets: Targets
) -> dict:
    """Calibration curves and the four crossover points per graph (profiles in ``--work``)."""
    return {
        name: run_calibration(store, ckpt, args.work, args.quick)
        for name, (store, ckpt) in stores.items()
    }


def _fb100_profile(args: argparse.Namespace, stores: dict[str, tuple[Path, Path]]) -> Path:
    profile = args.work / "calibration_fb100_cornell5.json"
    if not profile.exists():
        store, ckpt = stores["fb100_cornell5"]
        run_calibration(store, ckpt, args.work, args.quick)
    return profile


def slo(
    args: argparse.Namespace,
    stores: dict[str, tuple[Path, Path]],
    targets: Targets,
    slo_ms: float = 10.0,
) -> dict:
    """PSGS-Strict / Loose vs fixed batch-size bounds at a 10 ms SLO on fb100."""
    store, ckpt = stores["fb100_cornell5"]
    profile = _fb100_profile(args, stores)
    out = run_slo(store, ckpt, profile, args.rounds, args.window_s, slo_ms=slo_ms)
    for row in out["targets"]:
        targets.check(**{**row, "name": f"{slo_ms:g} ms SLO: {row['name']}"})
    return out


def slo30(args: argparse.Namespace, stores: dict[str, tuple[Path, Path]], targets: Targets) -> dict:
    """The same at 30 ms: on 2 cores a 128-node request alone takes ~9 ms of batch time, so
    99% within 10 ms is out of reach for every bound."""
    return slo(args, stores, targets, slo_ms=30.0)


def routing(
    args: argparse.Namespace, stores: dict[str, tuple[Path, Path]], targets: Targets
) -> dict:
    """Hybrid routing vs each single sampling path on fb100 (capacity at p99 <= 30 ms)."""
    store, ckpt = stores["fb100_cornell5"]
    out = run_routing(store, ckpt, _fb100_profile(args, stores), args.rounds, args.window_s)
    for row in out["targets"]:
        targets.check(**row)
    return out


def devices(
    args: argparse.Namespace, stores: dict[str, tuple[Path, Path]], targets: Targets
) -> dict:
    """Sample + gather per batch on every sampling path here (cuda with a GPU) vs PyG's
    NeighborLoader, per graph; with a GPU the cuda path's latency over PyG's on the GPU is a
    target (Quiver reports 35x lower latency than PyG)."""
    out = {}
    for name, (store, _) in stores.items():
        print(f"[quiver] devices {name} ...", flush=True)
        out[name] = run_devices(store, FANOUTS, args.rounds, args.quick)
        if "cuda" in out[name]["paths"]:
            for size, row in out[name]["batch_sizes"].items():
                if "cuda_speedup_over_pyg" not in row:
                    continue  # no PyG sampler on this machine: nothing to compare with
                speedup = row["cuda_speedup_over_pyg"]["median"]
                targets.check(f"{name} {size} seeds: PyG on GPU / cuda path ms", speedup, 35.0)
    return out


SECTIONS = {
    "placement": placement,
    "pipelines": pipelines,
    "calibration": calibration,
    "slo": slo,
    "slo30": slo30,
    "routing": routing,
    "devices": devices,
}


def plot(results: dict[str, Any], path: Path) -> None:
    """Hit rates per policy (one panel per graph x stream) and pipeline throughput."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = results.get("placement", {}).get("results", [])
    pipes = results.get("pipelines", {}).get("results")
    devices = results.get("devices", {}).get("results", {})
    panels = len(rows) + (1 if pipes else 0) + len(devices)
    fig, axes = plt.subplots(1, max(panels, 1), figsize=(4.2 * max(panels, 1), 3.4), squeeze=False)
    for ax, row in zip(axes[0], rows, strict=False):
        names = list(row["hit_rate"])
        for i, b in enumerate(BUDGETS):
            key = f"{b:.0%}"
            vals = [row["hit_rate"][n][key] for n in names]
            ax.bar(np.arange(len(names)) + 0.4 * i, vals, 0.4, label=f"hot tier {key}")
        ax.set_xticks(
            np.arange(len(names)) + 0.2, [n.replace("_", "\n") for n in names], fontsize=7
        )
        ax.set_title(f"{row['graph']} {row['stream']}: hot-tier hit rate", fontsize=9)
        ax.legend(fontsize=7)
    if pipes:
        ax = axes[0][len(rows)]
        rps = pipes["rps"]
        med = [rps[c]["median"] for c in rps]
        err = [[m - rps[c]["min"] for m, c in zip(med, rps, strict=True)],
               [rps[c]["max"] - m for m, c in zip(med, rps, strict=True)]]  # fmt: skip
        ax.bar(range(len(rps)), med, yerr=err, color="#2a7")
        labels = [f"{c} shared" if c.isdigit() else f"{c[:-1]} own queues" for c in rps]
        ax.set_xticks(range(len(rps)), labels, fontsize=7)
        ax.set_title("pipelines: req/s", fontsize=9)
    first = len(rows) + (1 if pipes else 0)
    for ax, (graph, out) in zip(axes[0][first:], devices.items(), strict=True):
        plot_devices(ax, graph, out)
    save_figure(fig, path)


def plot_devices(ax: Any, graph: str, out: dict[str, Any]) -> None:
    """ms per batch (sample + gather, log scale) of each path and PyG, per batch size."""
    sizes = list(out["batch_sizes"])
    arms = [k for k in out["batch_sizes"][sizes[0]] if "speedup" not in k]
    for i, size in enumerate(sizes):
        row = out["batch_sizes"][size]
        med = [row[a]["median"] for a in arms]
        err = [[m - row[a]["min"] for m, a in zip(med, arms, strict=True)],
               [row[a]["max"] - m for m, a in zip(med, arms, strict=True)]]  # fmt: skip
        width = 0.8 / len(sizes)
        ax.bar(np.arange(len(arms)) + width * i, med, width, yerr=err, label=f"{size} seeds")
    ax.set_xticks(np.arange(len(arms)) + 0.4 - 0.4 / len(sizes), arms, fontsize=7)
    ax.set_yscale("log")
    ax.set_title(f"{graph}: sample + gather ms per batch", fontsize=9)
    ax.legend(fontsize=7)


if __name__ == "__main__":
    main()
