"""CGP (OMEGA §6): traffic and latency of SRPE with computation graph parallelism vs one process.

Workload of OMEGA §8.1 (bench/srpe_protocol.py): 25% of the test nodes of fb100_cornell5 are held
out; the first 500 are served as new-node requests of 64 queries with their edges to the
remaining graph and among themselves, SRPE gamma 0.1 (query-edges-ratio policy), for GCN-2,
SAGE-3 and GAT-3 (hidden 128, GAT 4 heads; the trained checkpoint of bench/srpe.py when cached,
else a seeded random init: traffic does not depend on the weights, accuracy is not measured
here). For P = 2 and 4 workers (Ray actors, gloo all-to-all) it reports per model and batch:

- ``bytes_sent``: bytes the workers send each other (CGP), measured from the tensors handed to
  ``all_to_all_single``, by step (``bytes_by``: candidates, each layer's partials and GAT
  attention terms), vs ``plain_bytes``: what one worker would fetch from the others to build
  the same SRPE graph itself (remote feature rows, dense or CSR whichever is smaller, PE rows
  and adjacency entries at 8 bytes per edge id; ``plain_by``, with the dense-float32 feature
  size for comparison). fb100's 4,735-column one-hot features have 6 non-zeros per row: sent
  sparse they cost 56 bytes a row instead of 18,940;
- latency (ms, median of ``--repeats`` runs) of ``CGPService.run`` vs the single-process
  ``NewNodeInference.run(mode="srpe")``; every worker runs one torch thread, all on this machine
  (``slowest_worker_ms``: compute + collectives of the slowest worker, Ray call overhead aside).
  The workers aggregate rows in place with sparse matmuls while the single process gathers
  feature rows and runs PyG layers, so part of the gap is the local kernel, not parallelism;
- the largest |logit difference| to the single-process answer (must be <= 1e-4).

Run: ``.venv/bin/python bench/cgp.py`` (``--quick``: cora, 3 batches, ``cgp_quick.json``;
``--models gat``: a subset, written to ``cgp_gat.json``). Results are saved after each model.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

import gnnserve  # noqa: F401  (first: sets the OpenMP wait policy)
from common import DATASETS, RESULTS, Targets, save_figure, write_results
from gnnserve.deploy.cgp import CGPService
from gnnserve.graph import open_graph_store
from gnnserve.models.checkpoint import save_checkpoint
from gnnserve.models.zoo import GNN, ModelConfig
from gnnserve.newnodes.inference import NewNodeInference
from gnnserve.types import NewNodes
from srpe_protocol import (
    EPOCHS,
    MODELS,
    TRAINING,
    Workload,
    cache_dir,
    cached,
    checkpoint_dir,
    embeddings_for,
    first_queries,
    query_batches,
    record,
    split,
)

GAMMA = 0.1
BATCH = 64
QUERIES = 500
WORKERS = (2, 4)
TOL = 1e-4


def parse() -> argparse.Namespace:
    """``--quick``, ``--workdir`` (shared with bench/srpe.py) and ``--repeats``."""
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--quick", action="store_true", help="cora, 3 batches")
    p.add_argument("--workdir", type=Path, default=Path("work/srpe"), help="store/model/PE cache")
    p.add_argument("--repeats", type=int, default=5, help="timed runs per batch")
    p.add_argument("--models", nargs="+", choices=list(MODELS), help="subset (own file)")
    return p.parse_args()


def checkpoint(work: Workload, arch: str, workdir: Path, dataset: str) -> Path:
    """bench/srpe.py's trained checkpoint when cached, else a seeded random init (cached)."""
    trained = checkpoint_dir(work, arch, workdir, EPOCHS[dataset])
    if (trained / "params.json").exists():
        return trained
    params = {"store": work.store.name, "arch": arch, "init_seed": 0, **TRAINING}
    out = cache_dir(workdir, f"{work.store.name}-{arch}-random", params)
    if not cached(out, params, "config.json"):
        meta = open_graph_store(work.store).meta
        hidden = TRAINING["hidden_dim"]
        config = ModelConfig(arch, meta.feature_dim, hidden, work.num_classes, MODELS[arch][0])
        torch.manual_seed(0)
        save_checkpoint(out, GNN(config).eval(), config, {"note": "random init (bench/cgp.py)"})
        record(out, params)
    return out


def median_ms(fn: Any, repeats: int) -> float:
    """Median wall time of ``fn()`` over ``repeats`` calls after one warm-up, milliseconds."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return float(np.median(times))


def run_workers(
    parts: int, setup: tuple, batches: list[NewNodes], single: NewNodeInference, repeats: int
) -> list[dict[str, Any]]:
    """Per batch on a P-worker service: traffic, latency and the difference to one process."""
    ckpt, graph, features, pes = setup
    start = time.perf_counter()
    rows = []
    with CGPService(ckpt.model, graph, features, pes, num_workers=parts) as svc:
        print(f"  P={parts}: service up in {time.perf_counter() - start:.1f} s", flush=True)
        for i, new in enumerate(batches):
            got = svc.run(new, GAMMA)
            want = single.run(new, mode="srpe", gamma=GAMMA)
            assert np.array_equal(got.recomputed, want.recomputed), f"batch {i}: S differs"
            diff = float((got.logits - want.logits).abs().max())
            ms = median_ms(lambda new=new: svc.run(new, GAMMA), repeats)
            traffic = got.traffic
            assert traffic is not None
            rows.append(
                {
                    "batch": i,
                    "queries": new.count,
                    "new_edges": int(new.new_edges.shape[0]),
                    "recomputed": int(got.recomputed.size),
                    "candidates": got.num_candidates,
                    "bytes_sent": traffic.bytes_sent,
                    "bytes_by": traffic.bytes_by,
                    "plain_bytes": traffic.plain_bytes,
                    "plain_by": traffic.plain_by,
                    "request_bytes": traffic.request_bytes,
                    "ratio": traffic.plain_bytes / max(traffic.bytes_sent, 1),
                    "cgp_ms": ms,
                    "slowest_worker_ms": max(traffic.worker_ms),
                    "max_abs_diff": diff,
                }
            )
            r = rows[-1]
            print(
                f"  P={parts} batch {i}: CGP {r['bytes_sent'] / 1e3:8.1f} kB  plain "
                f"{r['plain_bytes'] / 1e3:8.1f} kB  ratio {r['ratio']:6.2f}  {ms:7.1f} ms  "
                f"diff {diff:.1e}",
                flush=True,
            )
    return rows


def totals(dicts: list[dict[str, int]]) -> dict[str, int]:
    """Per key, the sum over the batches."""
    out: dict[str, int] = {}
    for d in dicts:
        for key, value in d.items():
            out[key] = out.get(key, 0) + value
    return out


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Totals and means over the batches of one P."""
    sent = sum(r["bytes_sent"] for r in rows)
    plain = sum(r["plain_bytes"] for r in rows)
    plain_by = totals([r["plain_by"] for r in rows])
    dense = plain - plain_by["feature rows"] + plain_by["feature rows if dense"]
    return {
        "bytes_sent": sent,
        "bytes_by": totals([r["bytes_by"] for r in rows]),
        "plain_bytes": plain,
        "plain_by": plain_by,
        "ratio": plain / max(sent, 1),
        "ratio_if_features_dense": dense / max(sent, 1),
        "min_batch_ratio": min(r["ratio"] for r in rows),
        "request_bytes": sum(r["request_bytes"] for r in rows),
        "cgp_ms": float(np.mean([r["cgp_ms"] for r in rows])),
        "slowest_worker_ms": float(np.mean([r["slowest_worker_ms"] for r in rows])),
        "max_abs_diff": max(r["max_abs_diff"] for r in rows),
    }


def plot(result: dict[str, Any], path: Path) -> None:
    """Per model: total bytes (CGP vs plain, log scale) per P, and mean latency per P."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_b, ax_l) = plt.subplots(1, 2, figsize=(12, 4.5))
    models = list(result["models"])
    x = np.arange(len(models))
    width = 0.8 / (2 * len(WORKERS))
    for j, parts in enumerate(map(str, WORKERS)):
        for k, key in enumerate(("bytes_sent", "plain_bytes")):
            label = f"{'CGP' if k == 0 else 'plain'} P={parts}"
            vals = [result["models"][m]["summary"][parts][key] / 1e6 for m in models]
            ax_b.bar(x + (2 * j + k) * width, vals, width, label=label)
    ax_b.set_yscale("log")
    ax_b.set_xticks(x + 0.4 - width / 2, models)
    ax_b.set_ylabel(f"MB moved between workers, {result['queries']} queries")
    ax_b.set_title(f"{result['dataset']}, gamma {GAMMA}: traffic (features sent sparse)")
    ax_b.legend(fontsize=8, ncols=2)
    width = 0.8 / (len(WORKERS) + 1)
    single = [result["models"][m]["srpe_mean_ms"] for m in models]
    ax_l.bar(x, single, width, label="SRPE, one process")
    for j, parts in enumerate(map(str, WORKERS), start=1):
        vals = [result["models"][m]["summary"][parts]["cgp_ms"] for m in models]
        ax_l.bar(x + j * width, vals, width, label=f"CGP P={parts}")
    ax_l.set_xticks(x + width, models)
    ax_l.set_ylabel(f"ms per request of {BATCH} queries (mean of medians)")
    ax_l.set_title("latency (all workers on this machine)")
    ax_l.legend(fontsize=8)
    save_figure(fig, path)


def run_model(
    arch: str, name: str, work: Workload, batches: list[NewNodes], args: argparse.Namespace
) -> dict[str, Any]:
    """Single-process SRPE and CGP at every P for one model."""
    ckpt_dir = checkpoint(work, arch, args.workdir, name)
    setup = embeddings_for(work.store, ckpt_dir)
    ckpt, graph, features, pes = setup
    print(f"{arch}-{MODELS[arch][0]} ({ckpt_dir.name})", flush=True)
    single = NewNodeInference(ckpt.model, graph, features, pes, max_new_nodes=BATCH)
    srpe_ms = [
        median_ms(lambda b=b: single.run(b, mode="srpe", gamma=GAMMA), args.repeats)
        for b in batches
    ]
    print(f"  single-process SRPE: {np.mean(srpe_ms):.1f} ms per batch", flush=True)
    runs = {str(p): run_workers(p, setup, batches, single, args.repeats) for p in WORKERS}
    summaries = {p: summary(rows) for p, rows in runs.items()}
    for p, s in summaries.items():
        print(
            f"  P={p}: CGP {s['bytes_sent'] / 1e6:.2f} MB vs plain {s['plain_bytes'] / 1e6:.2f} MB"
            f" (x{s['ratio']:.2f}; x{s['ratio_if_features_dense']:.1f} were features dense); "
            f"{s['cgp_ms']:.1f} ms vs single-process {np.mean(srpe_ms):.1f} ms",
            flush=True,
        )
    return {
        "layers": MODELS[arch][0],
        "checkpoint": ckpt_dir.name,
        "srpe_ms": srpe_ms,
        "srpe_mean_ms": float(np.mean(srpe_ms)),
        "summary": summaries,
        "runs": runs,
    }


def main() -> None:
    """Run the workload for every model at every P; write bench/results/cgp(_quick).json/.png."""
    args = parse()
    args.workdir.mkdir(parents=True, exist_ok=True)
    name = "cora" if args.quick else "fb100_cornell5"
    start = time.perf_counter()
    work = first_queries(split(DATASETS / f"{name}.npz", args.workdir), QUERIES)
    batches = [new for _, new in query_batches(work, BATCH)]
    batches = batches[:3] if args.quick else batches
    print(f"{name}: {len(batches)} batches, prepared in {time.perf_counter() - start:.0f} s")
    suffix = "_quick" if args.quick else ""
    suffix += "".join(f"_{arch}" for arch in args.models or [])
    result: dict[str, Any] = {
        "dataset": name,
        "gamma": GAMMA,
        "batch": BATCH,
        "queries": int(work.y.size),
        "new_edges": int(work.new_edges.shape[0]),
        "torch_threads_single_process": torch.get_num_threads(),
        "torch_threads_per_worker": 1,
        "repeats": args.repeats,
        "models": {},
    }
    models = result["models"]
    for arch in args.models or list(MODELS):
        models[arch] = run_model(arch, name, work, batches, args)
        write_results("cgp" + suffix, {"complete": False, **result})  # survives a crash
    targets = Targets()
    if not args.quick and "sage" in models:  # fb100: mean degree 85, 4,735 sparse features
        ratio = models["sage"]["summary"]["4"]["ratio"]
        targets.check("sage-3 plain / CGP bytes at P = 4 (features sent sparse)", ratio, 5.0)
    for arch, res in models.items():
        worst = max(s["max_abs_diff"] for s in res["summary"].values())
        targets.check(f"{arch} max |CGP - SRPE| logit, x1e-6", worst * 1e6, TOL * 1e6, False)
    path = write_results("cgp" + suffix, {"complete": True, **result, "targets": targets.rows})
    plot(result, RESULTS / f"cgp{suffix}.png")
    for arch, res in models.items():
        for p, s in res["summary"].items():
            print(
                f"{arch} P={p}: plain/CGP bytes x{s['ratio']:.2f} "
                f"(x{s['ratio_if_features_dense']:.1f} with dense features); "
                f"CGP {s['cgp_ms']:.1f} ms vs single-process {res['srpe_mean_ms']:.1f} ms"
            )
    print(f"wrote {path}")
    targets.print()


if __name__ == "__main__":
    main()
