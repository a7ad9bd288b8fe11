"""Sampling latency on a changing graph: DGS pre-sampling vs on-demand sampling, and ingestion.

On fb100_cornell5 and soc_epinions1, 2-hop [25, 10] sampling of single-seed requests whose
seeds are drawn proportionally to in-degree (skewed toward hubs), while an update stream (half
inserts of random edges, half deletes of existing ones, batches of 100) is applied through the
dynamic store at increasing rates. Both modes read the same kind of store under the same lock:
a request = pin a version, sample, release. Latency is wall time per request in this process.
Ingestion: updates/s and MB/s (update-log bytes) one store applies with pre-sampling attached,
from JSON-like operations, and edge events/s and MB/s from Arrow IPC batches of 10K events
(without and with pre-sampling). Readers never wait for a batch (left-right copies): the p99
under updates measures what is left, CPU and GIL sharing with the writer.

Latency cells: offered rates 0, 10K and 40K updates/s, 4 s each, 3 interleaved rounds (the
cell order reversed every other round), medians reported with the applied rate of each cell:
compare cells at equal APPLIED rates (a writer slower than the offered rate applies less).

    python bench/dynamic.py            # full run (< 12 min)
    python bench/dynamic.py --quick    # smoke run (one round, 1 s cells)
"""

from __future__ import annotations

import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

import gnnserve  # noqa: F401  (first: sets the OpenMP wait policy)

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (  # noqa: E402
    DATASETS,
    Targets,
    parse_args,
    result_name,
    save_figure,
    write_results,
)
from gnnserve.data.writer import GraphData, write_store  # noqa: E402
from gnnserve.dynamic.store import DynamicStore  # noqa: E402
from gnnserve.dynamic.warmup import warm_up_updates  # noqa: E402
from gnnserve.features import open_feature_store  # noqa: E402
from gnnserve.graph import open_graph_store  # noqa: E402
from gnnserve.sampling import NeighborSampler  # noqa: E402
from gnnserve.sampling.presample import PreSampler  # noqa: E402
from gnnserve.sampling.warmup import warm_up_presample_updates  # noqa: E402

FANOUTS = [25, 10]
RATES = [0, 10000, 40000]  # offered updates per second (each cell reports what was applied)
ROUNDS = 3  # interleaved: every (mode, rate) cell once per round, the order reversed each round
BATCH = 100  # operations per update batch


def make_store(name: str, workdir: Path) -> Path:
    """The dataset's graph with 16-dim zero features (sampling never reads them)."""
    with np.load(DATASETS / f"{name}.npz") as z:
        edge_index, n = z["edge_index"], int(z["num_nodes"])
    out = workdir / name
    write_store(GraphData(name, n, edge_index, np.zeros((n, 16), np.float32)), out)
    return out


def update_stream(store: Path, count: int, seed: int) -> list[list[dict]]:
    """Batches of ops: inserts of random pairs interleaved with deletes of distinct old edges."""
    graph = open_graph_store(store)
    indptr, indices = graph.csr()
    rng = np.random.default_rng(seed)
    picks = rng.choice(graph.num_edges, count // 2, replace=False)
    dst = np.searchsorted(indptr, picks, side="right") - 1
    src = np.asarray(indices)[picks]
    new = rng.integers(0, graph.num_nodes, (count // 2, 2))
    ops: list[dict] = []
    for i in range(count // 2):
        ops.append({"op": "add_edge", "src": int(new[i, 0]), "dst": int(new[i, 1])})
        ops.append({"op": "delete_edge", "src": int(src[i]), "dst": int(dst[i])})
    return [ops[i : i + BATCH] for i in range(0, len(ops), BATCH)]


def open_dynamic(store: Path, log: Path, presample: bool):  # type: ignore[no-untyped-def]
    """A fresh dynamic store and the sampler of the mode under test."""
    log.unlink(missing_ok=True)
    dyn = DynamicStore(open_graph_store(store), open_feature_store(store), log, fsync="never")
    warm_up_updates()  # as the server's start-up: no update waits on numba JIT
    if presample:
        sampler = PreSampler(*dyn.graph.csr(), FANOUTS, seed=0)
        dyn.subscribe(sampler)
        warm_up_presample_updates(FANOUTS)
        return dyn, sampler
    return dyn, NeighborSampler(dyn.view, FANOUTS, seed=0)


def run_updates(
    dyn: DynamicStore,
    batches: list[list[dict]],
    rate: float,
    stop: threading.Event,
    applied: list[int],
) -> None:
    """Apply batches paced to ``rate`` updates/s until stopped or out of batches."""
    start = time.perf_counter()
    for i, batch in enumerate(batches):
        due = start + i * BATCH / rate
        while (wait := due - time.perf_counter()) > 0:
            if stop.wait(min(wait, 0.01)):
                return
        if stop.is_set():
            return
        dyn.apply(batch)
        applied[0] += len(batch)


def measure(dyn: DynamicStore, sampler, seeds: np.ndarray, duration: float) -> np.ndarray:  # type: ignore[no-untyped-def]
    """Closed-loop single-seed requests for ``duration`` s; latency per request in ms."""
    graph, out = dyn.view, []
    end = time.perf_counter() + duration
    i = 0
    while time.perf_counter() < end:
        t0 = time.perf_counter()
        graph.acquire_read()
        try:
            sampler.sample(seeds[i % seeds.size : i % seeds.size + 1])
        finally:
            graph.release_read()
        out.append((time.perf_counter() - t0) * 1e3)
        i += 1
    return np.array(out)


def latency_cell(
    store: Path,
    work: Path,
    presample: bool,
    rate: float,
    duration: float,
    batches: list[list[dict]],
) -> dict[str, float]:
    """One (mode, update rate) measurement on a fresh store."""
    dyn, sampler = open_dynamic(store, work / "log", presample)
    deg = dyn.graph.in_degree().astype(float)
    seeds = np.random.default_rng(3).choice(deg.size, 200_000, p=deg / deg.sum())
    measure(dyn, sampler, seeds, 0.3)  # warm-up (kernel loads)
    stop, applied = threading.Event(), [0]
    updater = threading.Thread(target=run_updates, args=(dyn, batches, rate, stop, applied))
    if rate:
        updater.start()
    start = time.perf_counter()
    lat = measure(dyn, sampler, seeds, duration)
    elapsed = time.perf_counter() - start
    stop.set()
    if rate:
        updater.join()
    dyn.close()
    return {
        "offered_rate": rate,
        "achieved_rate": applied[0] / elapsed,
        "requests": lat.size,
        "p50_ms": float(np.percentile(lat, 50)),
        "p99_ms": float(np.percentile(lat, 99)),
    }


def latency_rounds(
    name: str, store: Path, work: Path, duration: float, batches: list[list[dict]], rounds: int
) -> dict[str, list[dict]]:
    """Every (mode, rate) cell once per round, the order reversed in odd rounds; per mode and
    rate the median over rounds of p50, p99 and the applied rate, and the rounds' cells."""

    def run(mode: str, rate: int) -> dict:
        return latency_cell(store, work, mode == "presample", rate, duration, batches)

    def describe(mode: str, rate: int, cell: dict) -> str:
        return (
            f"[{name}] {mode:9s} offered {rate:6d}/s applied {cell['achieved_rate']:8.0f}/s  "
            f"p50 {cell['p50_ms']:.3f} ms  p99 {cell['p99_ms']:.3f} ms  "
            f"({cell['requests']} requests)"
        )

    cells = cell_rounds(["on_demand", "presample"], RATES, rounds, run, describe)
    return summarise(cells, ("achieved_rate", "p50_ms", "p99_ms"), "requests")


def cell_rounds(
    modes: list[str],
    rates: list[int],
    rounds: int,
    run: Callable[[str, int], dict],
    describe: Callable[[str, int, dict], str],
) -> dict[tuple[str, int], list[dict]]:
    """``run(mode, rate)`` for every cell once per round, the order reversed in odd rounds (a
    drift of the machine falls on every cell alike); ``describe(mode, rate, cell)`` printed
    after each cell with its round. Returns each cell's rounds."""
    order = [(mode, rate) for mode in modes for rate in rates]
    cells: dict[tuple[str, int], list[dict]] = {}
    for r in range(rounds):
        for mode, rate in order if r % 2 == 0 else order[::-1]:
            cell = run(mode, rate)
            cells.setdefault((mode, rate), []).append(cell)
            print(f"round {r}: {describe(mode, rate, cell)}", flush=True)
    return cells


def summarise(
    cells: dict[tuple[str, int], list[dict]], medians: tuple[str, ...], count: str
) -> dict[str, list[dict]]:
    """Per mode, one row per offered rate: the median over rounds of each of ``medians``, the
    fewest ``count`` of any round, and the rounds' cells."""
    out: dict[str, list[dict]] = {}
    for (mode, rate), runs in cells.items():
        out.setdefault(mode, []).append(
            {
                "offered_rate": rate,
                **{k: float(np.median([c[k] for c in runs])) for k in medians},
                f"min_{count}": min(c[count] for c in runs),
                "rounds": runs,
            }
        )
    return out


def ingestion(store: Path, work: Path, batches: list[list[dict]], duration: float) -> dict:
    """Updates/s and log MB/s of one store with pre-sampling attached, applying flat out."""
    dyn, _ = open_dynamic(store, work / "log", presample=True)
    start, count, i = time.perf_counter(), 0, 0
    base_bytes = dyn.log.bytes_written
    while time.perf_counter() - start < duration and i < len(batches):
        dyn.apply(batches[i])
        count += len(batches[i])
        i += 1
    elapsed = time.perf_counter() - start
    mb = (dyn.log.bytes_written - base_bytes) / 1e6
    dyn.close()
    return {"updates_per_s": count / elapsed, "mb_per_s": mb / elapsed}


BULK_ROWS = 10_000  # events per Arrow batch


def bulk_stream(store: Path, seed: int, limit: int = 2_000_000) -> list[bytes]:
    """Arrow IPC batches of BULK_ROWS events: inserts of random pairs interleaved with deletes
    of distinct existing edges (as ``update_stream``), built as arrays."""
    import pyarrow as pa

    from gnnserve.dynamic.bulk import to_stream

    graph = open_graph_store(store)
    indptr, indices = graph.csr()
    half = min(limit, int(0.9 * graph.num_edges)) // 2 // BULK_ROWS * BULK_ROWS
    rng = np.random.default_rng(seed)
    picks = rng.choice(graph.num_edges, half, replace=False)
    src, dst = np.empty(2 * half, np.int64), np.empty(2 * half, np.int64)
    src[0::2], dst[0::2] = rng.integers(0, graph.num_nodes, (2, half))
    src[1::2], dst[1::2] = np.asarray(indices)[picks], np.searchsorted(indptr, picks, "right") - 1
    op = np.tile(np.array([0, 1], np.int8), half)
    return [
        to_stream(pa.table({"op": op[lo:hi], "src": src[lo:hi], "dst": dst[lo:hi]}))
        for lo, hi in ((i, i + BULK_ROWS) for i in range(0, 2 * half, BULK_ROWS))
    ]


def bulk_ingestion(store: Path, work: Path, payloads: list[bytes], presample: int) -> dict:
    """Edge events/s and MB/s (Arrow bytes) of one store applying Arrow batches flat out:
    decode, validate, log (one binary record each, fsync never), apply to both copies."""
    from gnnserve.dynamic.bulk import read_stream

    dyn, _ = open_dynamic(store, work / "log", bool(presample))
    dyn.apply_columns(read_stream(payloads[0]))  # warm-up: kernels compiled
    start = time.perf_counter()
    for payload in payloads[1:]:
        dyn.apply_columns(read_stream(payload))
    dyn.close()  # includes the last batch's catch-up on the second copy
    elapsed = time.perf_counter() - start
    events = BULK_ROWS * (len(payloads) - 1)
    return {
        "presample": bool(presample),
        "batch_rows": BULK_ROWS,
        "events": events,
        "events_per_s": events / elapsed,
        "mb_per_s": sum(map(len, payloads[1:])) / 1e6 / elapsed,
    }


def dgs_ingestion(store: Path, batches: list[list[dict]], n_sampling: int, duration: float) -> dict:
    """Events/s and MB/s (24 B per event: kind, src, dst) through Ray DGS sampling workers."""
    from gnnserve.deploy.dgs import DGSService
    from gnnserve.sampling.presample import DELETE, INSERT

    ops = [op for batch in batches for op in batch]
    kinds = np.array([INSERT if op["op"] == "add_edge" else DELETE for op in ops])
    srcs = np.array([op["src"] for op in ops], dtype=np.int64)
    dsts = np.array([op["dst"] for op in ops], dtype=np.int64)
    indptr, indices = open_graph_store(store).csr()
    chunk, applied = 20_000, 0
    with DGSService(indptr, indices, FANOUTS, n_sampling, 1, seed=0) as service:
        service.apply_events(kinds[:chunk], srcs[:chunk], dsts[:chunk])  # warm-up
        start = time.perf_counter()
        for lo in range(chunk, kinds.size, chunk):
            if time.perf_counter() - start > duration:
                break
            service.apply_events(
                kinds[lo : lo + chunk], srcs[lo : lo + chunk], dsts[lo : lo + chunk]
            )
            applied += min(chunk, kinds.size - lo)
        elapsed = time.perf_counter() - start
    return {
        "sampling_workers": n_sampling,
        "events_per_s": applied / elapsed,
        "mb_per_s": applied * 24 / 1e6 / elapsed,
    }


def plot_latency(results: dict, path: Path, title: str, rate_key: str) -> None:
    """p50/p99 against the applied update rate, both modes, one panel per dataset."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(5 * len(results), 4), squeeze=False)
    for ax, (name, res) in zip(axes[0], results.items(), strict=True):
        for mode in res:
            if not isinstance(res[mode], list) or not res[mode] or "p99_ms" not in res[mode][0]:
                continue  # ingestion rows
            rates = [r[rate_key] for r in res[mode]]
            ax.plot(rates, [r["p99_ms"] for r in res[mode]], "o-", label=f"{mode} p99")
            ax.plot(rates, [r["p50_ms"] for r in res[mode]], "x--", label=f"{mode} p50")
        ax.set(
            title=f"{name}: {title}",
            xlabel="updates/s applied",
            ylabel="ms per request",
            yscale="log",
        )
        ax.tick_params(axis="x", labelrotation=30)
        ax.legend(fontsize=8)
    save_figure(fig, path)


def check_latency_targets(targets: Targets, name: str, res: dict) -> None:
    """Pre-sampled p99 vs on-demand p99 (no updates), and, for each pre-sampling mode measured
    (``presample``, ``dgs``), its p99 at the top update rate vs none."""
    if "on_demand" in res and "presample" in res:
        targets.check(
            f"{name}_presample_p99_over_on_demand",
            res["presample"][0]["p99_ms"] / res["on_demand"][0]["p99_ms"],
            1 / 3,
            higher_is_better=False,
        )
    for mode in ("presample", "dgs"):
        if mode in res:
            targets.check(
                f"{name}_{mode}_p99_at_top_rate_over_idle",
                res[mode][-1]["p99_ms"] / res[mode][0]["p99_ms"],
                1.5,
                higher_is_better=False,
            )


def main() -> None:
    args = parse_args(__doc__, "smoke run: 1 s per cell")
    duration = 1.0 if args.quick else 4.0
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for name in ("fb100_cornell5", "soc_epinions1"):
            store = make_store(name, work)
            batches = update_stream(store, int(max(RATES) * duration * 1.2) // BATCH * BATCH, 1)
            res: dict = latency_rounds(
                name, store, work, duration, batches, 1 if args.quick else ROUNDS
            )
            res["ingestion"] = ingestion(store, work, batches, duration)
            print(
                f"[{name}] ingestion {res['ingestion']['updates_per_s']:.0f} updates/s, "
                f"{res['ingestion']['mb_per_s']:.2f} MB/s"
            )
            payloads = bulk_stream(store, 2, limit=200_000 if args.quick else 2_000_000)
            res["bulk_ingestion"] = [bulk_ingestion(store, work, payloads, p) for p in (0, 1)]
            for row in res["bulk_ingestion"]:
                print(
                    f"[{name}] Arrow ingestion (pre-sampling {row['presample']}): "
                    f"{row['events_per_s']:.0f} events/s, {row['mb_per_s']:.1f} MB/s"
                )
            res["dgs_ingestion"] = [dgs_ingestion(store, batches, k, 2 * duration) for k in (1, 2)]
            for row in res["dgs_ingestion"]:
                print(
                    f"[{name}] DGS {row['sampling_workers']} sampling worker(s): "
                    f"{row['events_per_s']:.0f} events/s, {row['mb_per_s']:.2f} MB/s"
                )
            results[name] = res
    out = write_results(
        result_name("dynamic", args.quick),
        {
            "fanouts": FANOUTS,
            "rates": RATES,
            "batch": BATCH,
            "quick": args.quick,
            "results": results,
        },
    )
    plot_latency(results, out.with_suffix(".png"), "[25, 10], degree-skewed seeds", "achieved_rate")
    print(f"wrote {out} and {out.with_suffix('.png')}")
    targets = Targets()
    for name, res in results.items():
        check_latency_targets(targets, name, res)
        one, two = (r["events_per_s"] for r in res["dgs_ingestion"])
        targets.check(f"{name}_ingestion_2_over_1_sampling_workers", two / one, 1.6)
        bulk = res["bulk_ingestion"][0]["events_per_s"]
        targets.check(f"{name}_arrow_ingestion_events_per_s", bulk, 2e6)
    targets.print()


if __name__ == "__main__":
    main()
