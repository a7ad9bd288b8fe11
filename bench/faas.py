"""Serverless GNN serving (FaaS-GNN §5.2–5.3): trace replay against a real object store.

Systems, each on the same published store in SeaweedFS (S3 API, read with obstore), with sample
and inference instances as Ray actors under cgroup memory limits:

- ``full_fetch`` (DGL-serverless): a cold instance downloads the whole topology (sample) or the
  whole feature table (inference); naive scaling;
- ``ondemand_nocache`` (AWSGNN-like): every request fetches its subgraph and all its features
  by byte ranges; naive scaling;
- ``gnnserve``: on-demand fetching + adaptive feature cache + load-aware scheduler;
- ``gnnserve_no_cache`` and ``gnnserve_no_scheduler``: the two ablations.

Instance capacity (§5.1): the peak memory an instance is charged while serving the 8 highest
in-degree queries in turn, profiled per fetch mode (full fetch holds the whole data), +15%. The
cgroup on this VM cannot move a process's existing pages into the group (no
move_charge_at_immigrate), so the capacity counts what an instance allocates after it starts
(data, cache, inference), not the Python runtime itself; GB·s bills that capacity over each
instance's lifetime (launch to keep-alive expiry), as a FaaS platform bills.

Workload (bench/faas_trace.py): two bursty Azure Functions 2019 functions with > 10,000
invocations a day, their burstiest hour replayed in ``--replay-s`` seconds (time compressed,
counts scaled to ``--peak-rps``, default 3/s); query vertices from the edge list's destination
sequence. Keep-alive is ``--keep-alive-s`` (20 s), not the paper's 10 min compressed with the
trace: compressed it would be shorter than a cold start here (2-13 s on 2 cores), which no
platform does; at most 3 instances per function (a concurrency limit: 2 cores). Graphs:
soc_epinions1 (75,877 vertices) and an R-MAT graph of 2^20 vertices and 10M edges, both with
300-dim random float32 features (the paper's choice; neither has features). Models: GCN-2
(hidden 16), GAT-2 (8 heads of 8), random weights (latency and memory do not depend on them).

Rounds alternate the system order; per system the medians over rounds are reported with their
range; ratios are per round. Results: bench/results/faas.json and faas.png.
Run: ``.venv/bin/python bench/faas.py`` (``--quick``: soc_epinions1 + GCN, one round, 45 s).
A round replays ``--replay-s`` (60 s) per system, then waits for scale to zero (GB·s counted to
the last instance's stop).
"""

from __future__ import annotations

import argparse
import json
import shutil
import threading
import time
from concurrent.futures import Future
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

import gnnserve  # noqa: F401  (first: sets the OpenMP wait policy)
from common import (
    DATASETS,
    RESULTS,
    Targets,
    environment,
    median_range,
    ratios,
    save_figure,
    strict,
)
from faas_trace import arrivals, bursty_window, frequent_functions, query_sequence
from gnnserve.data import generators
from gnnserve.data.importers import load_npz
from gnnserve.data.publish import publish
from gnnserve.data.seaweed import ObjectStoreServer
from gnnserve.data.writer import GraphData, write_store
from gnnserve.deploy.faas.function import FunctionSpec
from gnnserve.deploy.faas.profile import profile_predictor
from gnnserve.deploy.faas.service import FaaSResult, FaaSService
from gnnserve.deploy.ray import start_ray, stop_ray
from gnnserve.models.checkpoint import save_checkpoint
from gnnserve.models.zoo import GNN, ModelConfig

SYSTEMS: dict[str, dict[str, Any]] = {
    "full_fetch": {"fetch": "full", "cache": False, "policy": "naive"},
    "ondemand_nocache": {"fetch": "ondemand", "cache": False, "policy": "naive"},
    "gnnserve": {"fetch": "ondemand", "cache": True, "policy": "load_aware"},
    "gnnserve_no_cache": {"fetch": "ondemand", "cache": False, "policy": "load_aware"},
    "gnnserve_no_scheduler": {"fetch": "ondemand", "cache": True, "policy": "naive"},
}
FANOUTS = (10, 10)
PROFILED = 8  # highest in-degree queries the capacity is profiled from
MAX_INSTANCES = 3  # per function, every system: the platform's concurrency limit on 2 cores
FEATURE_DIM = 300
TRACE = DATASETS / "raw" / "traces" / "azure2019_functions_sample1350_invocations.csv.gz"
_MB = 1 << 20


def build_graph(name: str) -> GraphData:
    """soc_epinions1 or the R-MAT graph, with 300-dim random features."""
    if name == "soc_epinions1":
        return load_npz(DATASETS / "soc_epinions1.npz", "random", FEATURE_DIM, seed=0)
    return generators.rmat(num_nodes=2**20, num_edges=10_000_000, feature_dim=FEATURE_DIM)


def prepare(
    work: Path, graph: str, server: ObjectStoreServer
) -> tuple[str, np.ndarray, np.ndarray]:
    """Write and publish ``graph``; returns its URL, the query sequence and its PROFILED
    highest in-degree vertices, highest first."""
    store = work / graph
    if not (store / "meta.json").exists():
        print(f"[faas] writing {graph} ...", flush=True)
        data = build_graph(graph)
        write_store(data, store, overwrite=True)
        np.save(work / f"{graph}_dst.npy", data.edge_index[1])
        del data
    url = f"s3://{server.bucket}/{graph}"
    print(f"[faas] publishing {graph} to {url} ...", flush=True)
    publish(store, url, options=server.options(), overwrite=True, progress=False)
    dst = np.load(work / f"{graph}_dst.npy")
    top = np.argsort(np.bincount(dst))[::-1][:PROFILED].astype(np.int64)
    return url, dst, top


def checkpoint(work: Path, arch: str) -> Path:
    """GCN-2 (hidden 16) or GAT-2 (8 heads x 8), seeded random weights."""
    out = work / f"model_{arch}"
    torch.manual_seed(0)
    hidden, heads = (16, 1) if arch == "gcn" else (64, 8)
    config = ModelConfig(arch, FEATURE_DIM, hidden, 16, 2, heads=heads)
    save_checkpoint(out, GNN(config), config, {})
    return out


def profile_capacity(spec: FunctionSpec, vertices: np.ndarray) -> tuple[int, int]:
    """(inference, sample) capacities in MB: 1.15 x the peak charged to each instance while it
    serves each of ``vertices`` in turn (the maximum in-degree queries), limits off. The sample
    instance's peak depends on the 2-hop neighbourhood, not the seed's degree alone, so one
    query (§5.1) left it too thin: a trace query killed an instance."""
    service = FaaSService(replace(spec, memory_mb=1 << 16), policy="load_aware")
    try:
        for i in range(vertices.size):
            service.predict(vertices[i : i + 1], rng_seed=i, timeout_s=600)
        peaks = service.instance_memory()
    finally:
        service.shutdown()
    infer = max(p["peak_bytes"] for p in peaks["infer"])
    sample = max(p["peak_bytes"] for p in peaks["sample"])
    return int(np.ceil(1.15 * infer / _MB)), int(np.ceil(1.15 * sample / _MB))


def replay(
    service: FaaSService, times: np.ndarray, queries: np.ndarray, drain_s: float
) -> list[tuple[float, FaaSResult | BaseException]]:
    """Submit ``queries[i]`` at ``times[i]`` (open loop); latency from the scheduled arrival."""
    out: list[tuple[float, FaaSResult | BaseException]] = [None] * times.size  # type: ignore[list-item]
    done = threading.Semaphore(0)
    start = time.perf_counter()

    def finish(i: int, due: float, f: Future[FaaSResult]) -> None:
        latency = (time.perf_counter() - due) * 1e3
        error = f.exception()
        out[i] = (latency, error if error is not None else f.result())
        done.release()

    for i, (t, q) in enumerate(zip(times, queries, strict=True)):
        due = start + float(t)
        delay = due - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        future = service.submit(np.array([q], dtype=np.int64), rng_seed=i)
        future.add_done_callback(lambda f, i=i, due=due: finish(i, due, f))
    for _ in range(times.size):
        done.acquire(timeout=drain_s)
    return out


def run_system(
    name: str, base: FunctionSpec, caps: dict[str, tuple[int, int]], trace: dict[str, Any]
) -> dict[str, Any]:
    """Replay the trace on one system; wait for scale to zero; summarise."""
    system = SYSTEMS[name]
    infer_mb, sample_mb = caps[system["fetch"]]
    spec = replace(base, fetch=system["fetch"], cache=system["cache"], memory_mb=infer_mb)
    service = FaaSService(
        spec,
        policy=system["policy"],
        keep_alive_s=trace["keep_alive_s"],
        max_instances=MAX_INSTANCES,
        sample_memory_mb=sample_mb,
    )
    try:
        answers = replay(service, trace["times"], trace["queries"], drain_s=120.0)
        service.wait_scaled_to_zero(timeout_s=trace["keep_alive_s"] * 3 + 30)
        stats = service.summary()
    finally:
        service.shutdown()
    return summarise(name, answers, stats)


def summarise(
    name: str, answers: list[tuple[float, FaaSResult | BaseException]], stats: dict[str, Any]
) -> dict[str, Any]:
    """Latency, errors, fetches, cache and memory of one replay."""
    ok = [(lat, r) for lat, r in answers if isinstance(r, FaaSResult)]
    lat = np.array([lat for lat, _ in ok]) if ok else np.array([np.nan])
    hits = sum(r.output.hits for _, r in ok)
    misses = sum(r.output.misses for _, r in ok)
    errs = [
        abs(r.output.predicted_bytes - r.output.measured_bytes) / r.output.measured_bytes
        for _, r in ok
        if r.output.predicted_bytes and r.output.measured_bytes
    ]
    return {
        "system": name,
        "requests": len(answers),
        "errors": len(answers) - len(ok),
        "mean_ms": float(lat.mean()),
        "p50_ms": float(np.percentile(lat, 50)),
        "p99_ms": float(np.percentile(lat, 99)),
        "cache_hit_rate": hits / (hits + misses) if hits + misses else 0.0,
        "bytes_topology": int(sum(r.sample.bytes_read for _, r in ok)),
        "bytes_features": int(sum(r.output.bytes_read for _, r in ok)),
        "reruns": int(sum(r.output.reran for _, r in ok)),
        "predictor_mean_rel_error_online": float(np.mean(errs)) if errs else None,
        **stats,
    }


def make_trace(
    seed: int, replay_s: float, peak_rps: float, dst: np.ndarray, which: int, keep_alive_s: float
) -> dict:
    """Arrival times and queries of trace ``which`` (0 or 1)."""
    trace = frequent_functions(TRACE, n=2, seed=0)[which]
    start = bursty_window(trace.counts, 60)
    times, info = arrivals(trace.counts, start, 60, replay_s, peak_rps, seed)
    queries = query_sequence(dst, times.size, seed)
    keep_alive = keep_alive_s
    return {
        "times": times,
        "queries": queries,
        "keep_alive_s": keep_alive,
        "info": {
            **info,
            "function": trace.function,
            "window_start_minute": start,
            "name": trace.name,
        },
    }


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--out", default="faas", help="results name (bench/results/<out>.json|png)")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--replay-s", type=float, default=60.0)
    p.add_argument("--peak-rps", type=float, default=3.0)
    p.add_argument("--keep-alive-s", type=float, default=20.0)
    p.add_argument("--work", type=Path, default=Path("/tmp/gnnserve-faas-bench"))
    p.add_argument("--configs", default="soc_epinions1:gcn:0,rmat:gcn:1,soc_epinions1:gat:0")
    return p.parse_args()


def main() -> None:
    args = parse()
    if args.quick:
        args.rounds, args.replay_s, args.configs = 1, 45.0, "soc_epinions1:gcn:0"
    args.work.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {
        "environment": environment(),
        "args": vars(args) | {"work": str(args.work)},
    }
    results["configs"] = []
    started = start_ray(num_cpus=8)
    targets = Targets()
    with ObjectStoreServer.start(args.work / "seaweed", bucket="bench") as server:
        for config in args.configs.split(","):
            graph, arch, which = config.split(":")
            results["configs"].append(run_config(args, server, graph, arch, int(which), targets))
            write(results, targets, "faas_quick" if args.quick else args.out)
    stop_ray(started)
    targets.print()
    if args.quick is False and args.work.name.startswith("gnnserve-faas-bench"):
        shutil.rmtree(args.work / "seaweed", ignore_errors=True)


def run_config(
    args: argparse.Namespace,
    server: ObjectStoreServer,
    graph: str,
    arch: str,
    which: int,
    targets: Targets,
) -> dict[str, Any]:
    """One graph x model x trace: profile, then rounds over the systems."""
    url, dst, top = prepare(args.work, graph, server)
    model = checkpoint(args.work, arch)
    base = FunctionSpec(url, str(model), FANOUTS, options=dict(server.options()))
    print(f"[faas] {graph} {arch}: training the memory predictor ...", flush=True)
    predictor = profile_predictor(base, dst, requests=240, seed=0)
    caps = {f: profile_capacity(replace(base, fetch=f), top) for f in ("ondemand", "full")}
    print(f"[faas] capacities (infer, sample) MB: {caps}", flush=True)
    rounds: dict[str, list[dict[str, Any]]] = {name: [] for name in SYSTEMS}
    names = list(SYSTEMS)
    trace_info = None
    for r in range(args.rounds):
        trace = make_trace(r, args.replay_s, args.peak_rps, dst, which, args.keep_alive_s)
        trace_info = trace["info"]
        for name in names if r % 2 == 0 else names[::-1]:
            print(f"[faas] round {r} {graph} {arch} {name} ...", flush=True)
            row = run_system(name, base, caps, trace)
            rounds[name].append(row)
            print(
                f"[faas]   mean {row['mean_ms']:.0f} ms p99 {row['p99_ms']:.0f} ms "
                f"cold {row['cold_starts']} GB*s {row['gb_seconds']:.1f} "
                f"hit {row['cache_hit_rate']:.2f} errors {row['errors']}",
                flush=True,
            )
    out = {
        "graph": graph,
        "model": arch,
        "trace": trace_info,
        "capacity_mb": caps,
        "predictor": predictor,
        "rounds": rounds,
        "summary": {},
        "ratios": {},
    }
    for name, rows in rounds.items():
        out["summary"][name] = {
            key: median_range([row[key] for row in rows])
            for key in (
                "mean_ms",
                "p99_ms",
                "gb_seconds",
                "cold_starts",
                "cache_hit_rate",
                "errors",
                "failures",
            )
        }
    g = rounds["gnnserve"]

    def ratio(base_name: str, key: str) -> dict[str, Any]:
        return median_range(ratios([x[key] for x in rounds[base_name]], [x[key] for x in g]))

    out["ratios"] = {
        "mean_full_over_gnnserve": ratio("full_fetch", "mean_ms"),
        "mean_ondemand_over_gnnserve": ratio("ondemand_nocache", "mean_ms"),
        "p99_full_over_gnnserve": ratio("full_fetch", "p99_ms"),
        "p99_ondemand_over_gnnserve": ratio("ondemand_nocache", "p99_ms"),
        "gbs_gnnserve_over_full": median_range(
            ratios([x["gb_seconds"] for x in g], [x["gb_seconds"] for x in rounds["full_fetch"]])
        ),
        "mean_no_cache_over_gnnserve": ratio("gnnserve_no_cache", "mean_ms"),
        "mean_no_scheduler_over_gnnserve": ratio("gnnserve_no_scheduler", "mean_ms"),
    }
    tag = f"{graph}/{arch}"
    rr = out["ratios"]
    targets.check(
        f"{tag} mean latency full fetch / gnnserve", rr["mean_full_over_gnnserve"]["median"], 5.0
    )
    targets.check(
        f"{tag} mean latency on-demand / gnnserve",
        rr["mean_ondemand_over_gnnserve"]["median"],
        1.25,
    )
    targets.check(f"{tag} p99 full fetch / gnnserve", rr["p99_full_over_gnnserve"]["median"], 5.0)
    targets.check(
        f"{tag} p99 on-demand / gnnserve", rr["p99_ondemand_over_gnnserve"]["median"], 2.0
    )
    targets.check(
        f"{tag} GB*s gnnserve / full fetch",
        rr["gbs_gnnserve_over_full"]["median"],
        0.5,
        higher_is_better=False,
    )
    targets.check(
        f"{tag} mean no-cache / gnnserve", rr["mean_no_cache_over_gnnserve"]["median"], 1.0
    )
    targets.check(
        f"{tag} mean no-scheduler / gnnserve", rr["mean_no_scheduler_over_gnnserve"]["median"], 1.0
    )
    targets.check(
        f"{tag} predictor mean rel error (held out)",
        predictor["mean_rel_error"],
        0.10,
        higher_is_better=False,
    )
    killed = sum(row["failures"] for rows in rounds.values() for row in rows)
    targets.check(f"{tag} instances killed for memory", killed, 0, higher_is_better=False)
    return out


PLOTTED = ("mean_ms", "p99_ms", "gb_seconds")
LABELS = ("mean latency (ms)", "p99 latency (ms)", "instance memory (GB*s)")


def _bars(ax: Any, cfg: dict[str, Any], key: str) -> None:
    """Median bars with min-max whiskers of ``key`` per system."""
    names = list(cfg["summary"])
    stats = [cfg["summary"][n][key] for n in names]
    med = [x["median"] for x in stats]
    low = [m - x["min"] for m, x in zip(med, stats, strict=True)]
    high = [x["max"] - m for m, x in zip(med, stats, strict=True)]
    ax.bar(range(len(names)), med, yerr=[low, high], color=["#999", "#bbb", "#2a7", "#7c9", "#9db"])
    ax.set_xticks(range(len(names)), [n.replace("_", "\n") for n in names], fontsize=7)


def write(results: dict[str, Any], targets: Targets, name: str) -> None:
    """JSON and the PNG (mean and p99 per system, GB*s), after every config."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    results["targets"] = targets.rows
    text = json.dumps(strict(results), indent=2, allow_nan=False, default=float)
    (RESULTS / f"{name}.json").write_text(text)
    configs = results["configs"]
    fig, axes = plt.subplots(len(configs), 3, figsize=(15, 3.6 * len(configs)), squeeze=False)
    for row, cfg in zip(axes, configs, strict=True):
        for ax, key, label in zip(row, PLOTTED, LABELS, strict=True):
            _bars(ax, cfg, key)
            ax.set_title(f"{cfg['graph']} {cfg['model']}: {label}", fontsize=9)
            if key != "gb_seconds":
                ax.set_yscale("log")
    save_figure(fig, RESULTS / f"{name}.png")


if __name__ == "__main__":
    main()
