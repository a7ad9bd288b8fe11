"""Serverless GNN serving (FaaS-GNN §5.2-5.3): long trace replays against a real object store.

Systems, each on the same published store in SeaweedFS (S3 API, read with obstore), with sample
and inference instances charged in full to cgroup memory limits (runtime included) and given a
CPU quota in proportion to their memory (FaaS-GNN §5.1): ``--mb-per-cpu`` 256 MB per core here
(AWS Lambda's 1,769 would give a 370 MB instance a fifth of a core, on which the Python runtime
alone needs seconds to start, and a run at 512 left the on-demand systems unable to keep up with
the trace's mean rate; every system gets the same rule):

- ``full_fetch`` (DGL-serverless): a cold instance downloads the whole topology (sample) or the
  whole feature table (inference); naive scaling;
- ``ondemand_nocache`` (AWSGNN-like): every request fetches its subgraph and all its features
  by byte ranges; naive scaling;
- ``gnnserve``: on-demand fetching + adaptive feature cache + load-aware scheduler;
- ``gnnserve_no_cache`` and ``gnnserve_no_scheduler``: the two ablations.

Each runs with ``--launch process`` (a new process per instance: the paper's condition) and the
gnnserve arms also with ``--launch fork`` (instances forked from a warm template).

Capacity (§5.1): the peak memory charged to an instance (runtime included) while it serves the 8
highest in-degree queries in turn, per fetch mode, x1.15; the same capacity whichever launch
path. The instance cap per function is the smaller of what a memory budget (``--budget-gb``)
and a CPU budget (``--cpu-budget``, default this machine's cores) hold of the largest pair of
capacities (full fetch's) and their quotas, the same for every system: a quota only means
something while its cores exist (with the memory budget alone, 19 instances of ~1 core each
shared 2 cores and process cold starts took 67-94 s). ``--cpu-budget 0``: memory alone. GB·s
bills capacity x lifetime (launch to keep-alive expiry), as a FaaS platform bills; fork arms
also report their templates' resident memory over the replay.

Workload (bench/faas_trace.py): two bursty Azure Functions 2019 functions with > 10,000
invocations a day (trace-0, trace-1), an hour of each replayed in ``--replay-s`` seconds (600:
6x time compression), counts scaled so the busiest minute offers ``--peak-rps``; keep-alive is
the platform's 10 minutes compressed alike (100 s). Query vertices follow the edge list grouped
by source (consecutive queries are out-neighbours of one vertex, as the recipients of one user's
interactions in a log), from a random start. Graphs: an R-MAT graph of 2^20 vertices and 10M
edges with 300-dim float32 features (1.26 GB: full fetch is costly) and soc_epinions1 (75,877
vertices, the small one), both with random features (the paper's choice; neither has any).
Model: GCN-2 (hidden 16), random weights (latency and memory do not depend on them); fanouts
10,10. Serve's default 25,10 reads about twice the rows: in a first run, before stores were
published in 1 MiB blocks (SeaweedFS on these 2 cores then served a range of the 1.2 GB feature
object in ~2 ms; 150 ranges: 337 ms, against 110 ms on an 86 MB object), a warm request at 25,10
took ~2 s of fetching under load and no on-demand system kept up with the trace's mean rate
(mean latency 191 s, all queueing). Those figures predate block publishing; see
docs/benchmarks.md for the current ones.

Every request is saved (arrival, latency, work and wait, cache hits, predicted and measured
memory). Rounds alternate the arm order; medians over rounds are reported with their range;
ratios are per round. Results: bench/results/<out>.json and .png, rewritten after every arm.
Run: ``.venv/bin/python bench/faas.py`` (``--quick``: soc_epinions1, 90 s replay, two arms).
"""

from __future__ import annotations

import argparse
import json
import shutil
import threading
import time
from concurrent.futures import Future
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch

import gnnserve  # noqa: F401  (first: sets the OpenMP wait policy)
from common import DATASETS, RESULTS, Targets, environment, median_range, ratios, strict
from faas_plot import plot
from faas_trace import arrivals, bursty_window, frequent_functions, query_sequence
from gnnserve.data import generators
from gnnserve.data.importers import load_npz
from gnnserve.data.publish import publish
from gnnserve.data.seaweed import ObjectStoreServer
from gnnserve.data.writer import GraphData, write_store
from gnnserve.deploy.faas.function import FunctionSpec
from gnnserve.deploy.faas.profile import BIG_PEAK, profile_predictor
from gnnserve.deploy.faas.service import (
    FaaSResult,
    FaaSService,
    cpu_instance_cap,
    cpu_quota,
    machine_cores,
)
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
ARMS = (  # most important first: a cut-short run still has the headline
    "gnnserve/process,full_fetch/process,ondemand_nocache/process,gnnserve/fork,"
    "gnnserve_no_cache/process,gnnserve_no_scheduler/process,"
    "gnnserve_no_cache/fork,gnnserve_no_scheduler/fork"
)
FANOUTS = (10, 10)
PROFILED = 8  # highest in-degree queries the capacity is profiled from
FEATURE_DIM = 300
TRACE = DATASETS / "raw" / "traces" / "azure2019_functions_sample1350_invocations.csv.gz"
PLATFORM_KEEP_ALIVE_S = 600.0  # the platform's keep-alive, compressed with the trace
_MB = 1 << 20


def build_graph(name: str) -> GraphData:
    """soc_epinions1 or the R-MAT graph, with 300-dim random features."""
    if name == "soc_epinions1":
        return load_npz(DATASETS / "soc_epinions1.npz", "random", FEATURE_DIM, seed=0)
    return generators.rmat(num_nodes=2**20, num_edges=10_000_000, feature_dim=FEATURE_DIM)


def prepare(
    work: Path, graph: str, server: ObjectStoreServer
) -> tuple[str, np.ndarray, np.ndarray]:
    """Write and publish ``graph``; returns its URL, the access sequence (destinations of the
    edge list grouped by source) and its PROFILED highest in-degree vertices."""
    store = work / graph
    seq = work / f"{graph}_access.npy"
    if not (store / "meta.json").exists() or not seq.exists():
        print(f"[faas] writing {graph} ...", flush=True)
        data = build_graph(graph)
        write_store(data, store, overwrite=True)
        src, dst = data.edge_index
        np.save(seq, dst[np.argsort(src, kind="stable")])
        del data
    url = f"s3://{server.bucket}/{graph}"
    print(f"[faas] publishing {graph} to {url} ...", flush=True)
    publish(store, url, options=server.options(), overwrite=True, progress=False)
    access = np.load(seq)
    top = np.argsort(np.bincount(access))[::-1][:PROFILED].astype(np.int64)
    return url, access, top


def checkpoint(work: Path, arch: str) -> Path:
    """GCN-2 (hidden 16) or GAT-2 (8 heads x 8), seeded random weights."""
    out = work / f"model_{arch}"
    torch.manual_seed(0)
    hidden, heads = (16, 1) if arch == "gcn" else (64, 8)
    config = ModelConfig(arch, FEATURE_DIM, hidden, 16, 2, heads=heads)
    save_checkpoint(out, GNN(config), config, {})
    return out


def profile_capacity(spec: FunctionSpec, vertices: np.ndarray) -> tuple[int, int]:
    """(inference, sample) capacities in MB: 1.15 x the peak charged to each instance (process
    launch: runtime included) while it serves each of ``vertices`` in turn, limits off."""
    service = FaaSService(replace(spec, memory_mb=1 << 16), sample_memory_mb=1 << 16)
    try:
        for i in range(vertices.size):
            service.predict(vertices[i : i + 1], rng_seed=i, timeout_s=900)
        peaks = service.instance_memory()
    finally:
        service.shutdown()
    infer = max(p["peak_bytes"] for p in peaks["infer"])
    sample = max(p["peak_bytes"] for p in peaks["sample"])
    return int(np.ceil(1.15 * infer / _MB)), int(np.ceil(1.15 * sample / _MB))


def replay(
    service: FaaSService, times: np.ndarray, queries: np.ndarray, drain_s: float
) -> list[dict[str, Any]]:
    """Submit ``queries[i]`` at ``times[i]`` (open loop); one record per request, latency from
    the scheduled arrival."""
    records: list[dict[str, Any]] = [{} for _ in range(times.size)]
    done = threading.Semaphore(0)
    start = time.perf_counter()

    def finish(i: int, due: float, f: Future[FaaSResult]) -> None:
        latency = (time.perf_counter() - due) * 1e3
        records[i] = record(float(times[i]), int(queries[i]), latency, f)
        done.release()

    for i, (t, q) in enumerate(zip(times, queries, strict=True)):
        due = start + float(t)
        delay = due - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        future = service.submit(np.array([q], dtype=np.int64), rng_seed=i)
        future.add_done_callback(partial(finish, i, due))
    deadline = time.monotonic() + drain_s
    for _ in range(times.size):
        done.acquire(timeout=max(0.0, deadline - time.monotonic()))
    missing = {"error": "no answer"}
    return [r or {"t_s": float(t), **missing} for r, t in zip(records, times, strict=True)]


def record(t: float, query: int, latency: float, f: Future[FaaSResult]) -> dict[str, Any]:
    """What one request did and cost."""
    error = f.exception()
    if error is not None:
        return {"t_s": t, "query": query, "latency_ms": latency, "error": str(error)[:200]}
    r = f.result()
    work = r.sample.sample_ms + r.output.fetch_ms + r.output.compute_ms
    return {
        "t_s": t,
        "query": query,
        "latency_ms": latency,
        "work_ms": work,
        "wait_ms": max(0.0, latency - work),  # queueing, cold starts, transfers
        "sample_ms": r.sample.sample_ms,
        "fetch_ms": r.output.fetch_ms,
        "compute_ms": r.output.compute_ms,
        "hits": r.output.hits,
        "misses": r.output.misses,
        "topology_bytes": r.sample.bytes_read,
        "feature_bytes": r.output.bytes_read,
        "predicted_bytes": r.output.predicted_bytes,
        "measured_bytes": r.output.measured_bytes,
        "cleared": r.output.cleared,
    }


def template_rss(service: FaaSService) -> int:
    """Resident bytes of the fork launcher's template processes (0 for process launch)."""
    total = 0
    for future in getattr(service.launcher, "_templates", {}).values():
        pid = future.result().process.pid
        with open(f"/proc/{pid}/statm") as f:
            total += int(f.read().split()[1]) * 4096
    return total


def run_arm(
    arm: str, base: FunctionSpec, caps: dict[str, tuple[int, int]], trace: dict[str, Any],
    args: argparse.Namespace, max_instances: int,
) -> dict[str, Any]:  # fmt: skip
    """Replay the trace on one system and launch path; wait for scale to zero; summarise."""
    name, launch = arm.split("/")
    system = SYSTEMS[name]
    infer_mb, sample_mb = caps[system["fetch"]]
    spec = replace(base, fetch=system["fetch"], cache=system["cache"], memory_mb=infer_mb)
    service = FaaSService(
        spec,
        policy=system["policy"],
        keep_alive_s=trace["keep_alive_s"],
        max_instances=max_instances,
        sample_memory_mb=sample_mb,
        launch=launch,
        mb_per_cpu=args.mb_per_cpu,
    )
    started = time.monotonic()
    try:
        templates = template_rss(service)
        records = replay(service, trace["times"], trace["queries"], drain_s=300.0)
        service.wait_scaled_to_zero(timeout_s=trace["keep_alive_s"] * 3 + 60)
        stats = service.summary()
    finally:
        service.shutdown()
    lifetime = time.monotonic() - started
    stats["template_gb_seconds"] = templates / 2**30 * lifetime
    return summarise(arm, records, stats)


def summarise(arm: str, records: list[dict[str, Any]], stats: dict[str, Any]) -> dict[str, Any]:
    """Latency, errors, cache, memory prediction and instances of one replay (records kept)."""
    ok = [r for r in records if "error" not in r]
    lat = np.array([r["latency_ms"] for r in ok]) if ok else np.array([np.nan])
    hits = sum(r["hits"] for r in ok)
    misses = sum(r["misses"] for r in ok)
    cold = stats["cold_start_s"]
    return {
        "arm": arm,
        "requests": len(records),
        "errors": len(records) - len(ok),
        "mean_ms": float(lat.mean()),
        "p50_ms": float(np.percentile(lat, 50)),
        "p99_ms": float(np.percentile(lat, 99)),
        "wait_mean_ms": float(np.mean([r["wait_ms"] for r in ok])) if ok else None,
        "cache_reuse": hits / (hits + misses) if hits + misses else 0.0,
        "cache_clears": int(sum(r["cleared"] for r in ok)),
        **online_error(ok),
        **{k: v for k, v in stats.items() if k != "cold_start_s"},
        "cold_start_p50_s": float(np.median(cold)) if cold else None,
        "cold_start_s": stats["cold_start_s"],
        "gb_seconds_with_templates": stats["gb_seconds"] + stats["template_gb_seconds"],
        "records": records,
    }  # fmt: skip


def online_error(ok: list[dict[str, Any]]) -> dict[str, Any]:
    """Mean |predicted - measured| / measured of the served requests, for measured peaks of at
    least BIG_PEAK and below (None where no request had a prediction)."""
    out: dict[str, Any] = {}
    for key, keep in (("big", lambda m: m >= BIG_PEAK), ("small", lambda m: 0 < m < BIG_PEAK)):
        errs = [
            abs(r["predicted_bytes"] - r["measured_bytes"]) / r["measured_bytes"]
            for r in ok
            if r["predicted_bytes"] and keep(r["measured_bytes"])
        ]
        out[f"predictor_online_error_{key}"] = float(np.mean(errs)) if errs else None
        out[f"predictor_online_n_{key}"] = len(errs)
    return out


def make_trace(seed: int, args: argparse.Namespace, access: np.ndarray, which: int) -> dict:
    """Arrival times and queries of trace ``which`` (0 or 1)."""
    trace = frequent_functions(TRACE, n=2, seed=0)[which]
    start = bursty_window(trace.counts, args.trace_minutes)
    times, info = arrivals(
        trace.counts, start, args.trace_minutes, args.replay_s, args.peak_rps, seed
    )
    compression = info["time_compression"]
    return {
        "times": times,
        "queries": query_sequence(access, times.size, seed),
        "keep_alive_s": PLATFORM_KEEP_ALIVE_S / compression,
        "info": {**info, "function": trace.function, "window_start_minute": start,
                 "name": trace.name},
    }  # fmt: skip


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--out", default="faas", help="results name (bench/results/<out>.json|png)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--replay-s", type=float, default=600.0)
    p.add_argument("--trace-minutes", type=int, default=60)
    p.add_argument("--peak-rps", type=float, default=9.0)
    p.add_argument("--budget-gb", type=float, default=16.0, help="memory for all instances")
    p.add_argument("--mb-per-cpu", type=float, default=256.0)
    p.add_argument(
        "--cpu-budget", type=float, default=float(machine_cores()),
        help="cores the instances' quotas may add up to (0: cap from memory alone)",
    )  # fmt: skip
    p.add_argument("--arms", default=ARMS, help="system/launch pairs, comma-separated")
    p.add_argument("--work", type=Path, default=Path("/tmp/gnnserve-faas-bench"))
    p.add_argument(
        "--configs",
        default="rmat:gcn:0,rmat:gcn:1,soc_epinions1:gcn:0,soc_epinions1:gcn:1",
        help="graph:model:trace, comma-separated",
    )
    return p.parse_args()


def main() -> None:
    args = parse()
    if args.quick:
        args.rounds, args.replay_s, args.trace_minutes = 1, 90.0, 15
        args.configs, args.arms = "soc_epinions1:gcn:0", "gnnserve/fork,ondemand_nocache/process"
    args.work.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {
        "environment": environment(),
        "args": vars(args) | {"work": str(args.work)},
        "configs": [],
    }
    started = start_ray(num_cpus=8)
    targets = Targets()
    name = "faas_quick" if args.quick else args.out
    with ObjectStoreServer.start(args.work / "seaweed", bucket="bench") as server:
        for config in args.configs.split(","):
            graph, arch, which = config.split(":")
            cfg: dict[str, Any] = {"graph": graph, "model": arch, "trace_index": int(which)}
            results["configs"].append(cfg)
            run_config(args, server, cfg, targets, lambda: write(results, targets, name))
    stop_ray(started)
    targets.print()
    if not args.quick:
        shutil.rmtree(args.work / "seaweed", ignore_errors=True)


def run_config(
    args: argparse.Namespace, server: ObjectStoreServer, out: dict[str, Any], targets: Targets,
    save: Any,
) -> None:  # fmt: skip
    """One graph x model x trace: profile, then rounds over the arms; ``out`` filled in place
    and saved after every arm."""
    graph, arch = out["graph"], out["model"]
    url, access, top = prepare(args.work, graph, server)
    model = checkpoint(args.work, arch)
    base = FunctionSpec(url, str(model), FANOUTS, options=dict(server.options()))
    print(f"[faas] {graph} {arch}: training the memory predictor ...", flush=True)
    out["predictor"] = profile_predictor(base, access, requests=240, seed=0)
    caps = {f: profile_capacity(replace(base, fetch=f), top) for f in ("ondemand", "full")}
    largest = max(caps.values(), key=sum)
    memory_cap = max(1, int(args.budget_gb * 1024 // sum(largest)))
    quotas = tuple(cpu_quota(mb, args.mb_per_cpu) for mb in largest)
    cpu_cap = cpu_instance_cap(args.cpu_budget, quotas)
    max_instances = min(memory_cap, cpu_cap or memory_cap)
    print(
        f"[faas] capacities (infer, sample) MB {caps}; {max_instances} per function "
        f"(memory budget: {memory_cap}, CPU budget: {cpu_cap})",
        flush=True,
    )
    out.update(
        capacity_mb=caps, max_instances=max_instances, memory_cap=memory_cap, cpu_cap=cpu_cap,
        rounds={}, summary={}, ratios={},
    )  # fmt: skip
    arms = args.arms.split(",")
    for r in range(args.rounds):
        trace = make_trace(r, args, access, out["trace_index"])
        out["trace"] = trace["info"] | {"keep_alive_s": trace["keep_alive_s"]}
        for arm in arms if r % 2 == 0 else arms[::-1]:
            print(f"[faas] round {r} {graph} {arch} {arm} ...", flush=True)
            row = run_arm(arm, base, caps, trace, args, max_instances)
            out["rounds"].setdefault(arm, []).append(row)
            print(
                f"[faas]   mean {row['mean_ms']:.0f} ms p99 {row['p99_ms']:.0f} ms "
                f"cold {row['cold_starts']} (p50 {row['cold_start_p50_s']} s) "
                f"GB*s {row['gb_seconds']:.0f} reuse {row['cache_reuse']:.2f} "
                f"errors {row['errors']} killed {row['failures']}",
                flush=True,
            )
            summarise_config(out)
            save()
    check_targets(out, targets)
    save()


SUMMARY_KEYS = (
    "mean_ms", "p50_ms", "p99_ms", "gb_seconds", "gb_seconds_with_templates", "cold_starts",
    "cold_start_p50_s", "cache_reuse", "errors", "failures", "retries", "requests",
    "predictor_online_error_big", "predictor_online_error_small",
)  # fmt: skip


def summarise_config(out: dict[str, Any]) -> None:
    """Medians over rounds per arm, and the per-round ratios the targets read."""
    rounds = out["rounds"]
    for arm, rows in rounds.items():
        out["summary"][arm] = {
            key: median_range([row[key] for row in rows])
            for key in SUMMARY_KEYS
            if all(row[key] is not None for row in rows)
        }

    def ratio(num: str, den: str, key: str) -> dict[str, Any] | None:
        if num not in rounds or den not in rounds:
            return None
        n = min(len(rounds[num]), len(rounds[den]))
        pairs = ratios([x[key] for x in rounds[num][:n]], [x[key] for x in rounds[den][:n]])
        return median_range(pairs)

    g, f = "gnnserve/process", "gnnserve/fork"
    out["ratios"] = {
        "mean_full_over_gnnserve": ratio("full_fetch/process", g, "mean_ms"),
        "mean_ondemand_over_gnnserve": ratio("ondemand_nocache/process", g, "mean_ms"),
        "p99_full_over_gnnserve": ratio("full_fetch/process", g, "p99_ms"),
        "p99_ondemand_over_gnnserve": ratio("ondemand_nocache/process", g, "p99_ms"),
        "gbs_gnnserve_over_full": ratio(g, "full_fetch/process", "gb_seconds"),
        "mean_process_over_fork": ratio(g, f, "mean_ms"),
        **{
            f"mean_{abl}_over_gnnserve_{launch}": ratio(
                f"gnnserve_{abl}/{launch}", f"gnnserve/{launch}", "mean_ms"
            )
            for abl in ("no_cache", "no_scheduler")
            for launch in ("process", "fork")
        },
    }


def check_targets(out: dict[str, Any], targets: Targets) -> None:
    """The issue's targets, on what this config measured."""
    tag = f"{out['graph']}/{out['model']}/trace-{out['trace_index']}"
    goals = [
        ("mean_full_over_gnnserve", "mean latency full fetch / gnnserve (process)", 5.0, True),
        ("mean_ondemand_over_gnnserve", "mean latency on-demand / gnnserve (process)", 1.25, True),
        ("p99_full_over_gnnserve", "p99 full fetch / gnnserve (process)", 5.0, True),
        ("p99_ondemand_over_gnnserve", "p99 on-demand / gnnserve (process)", 2.0, True),
        ("gbs_gnnserve_over_full", "GB*s gnnserve / full fetch (process)", 0.5, False),
        ("mean_process_over_fork", "mean latency gnnserve process / fork", 2.0, True),
    ] + [
        (f"mean_{a}_over_gnnserve_{launch}", f"mean latency {a} / gnnserve ({launch})", 1.0, True)
        for a in ("no_cache", "no_scheduler")
        for launch in ("process", "fork")
    ]  # fmt: skip
    for key, label, goal, higher in goals:
        if out["ratios"].get(key) is not None:
            targets.check(f"{tag} {label}", out["ratios"][key]["median"], goal, higher)
    summary = out["summary"]
    for arm in ("gnnserve/process", "gnnserve/fork"):
        if arm in summary:
            targets.check(f"{tag} cache reuse {arm}", summary[arm]["cache_reuse"]["median"], 0.6)
    if "gnnserve/fork" in summary:
        p50 = summary["gnnserve/fork"].get("cold_start_p50_s")
        if p50 is not None:
            targets.check(f"{tag} fork cold start p50 (s)", p50["median"], 0.5, False)
    big = summary.get("gnnserve/process", {}).get("predictor_online_error_big")
    if big is not None:
        targets.check(f"{tag} predictor online error, peaks >= 1 MB", big["median"], 0.15, False)
    killed = sum(row["failures"] for rows in out["rounds"].values() for row in rows)
    targets.check(f"{tag} instances killed for memory", killed, 0, higher_is_better=False)


def write(results: dict[str, Any], targets: Targets, name: str) -> None:
    """JSON (every request kept) and the PNG."""
    results["targets"] = targets.rows
    text = json.dumps(strict(results), indent=1, allow_nan=False, default=float)
    (RESULTS / f"{name}.json").write_text(text)
    plot(results, RESULTS / f"{name}.png")


if __name__ == "__main__":
    main()
