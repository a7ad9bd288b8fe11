"""CGP (OMEGA §6): traffic and latency of SRPE with computation graph parallelism vs one process.

Workload of OMEGA §8.1 (bench/srpe_protocol.py): 25% of the test nodes of fb100_cornell5 are held
out; the first 500 are served as new-node requests of 64 queries with their edges to the
remaining graph, SRPE gamma 0.1 (query-edges-ratio policy), a 3-layer GraphSAGE (hidden 128; the
trained checkpoint of bench/srpe.py when cached, else a seeded random init: accuracy is not
measured here). For P = 2 and 4 workers (Ray actors, gloo all-to-all) it reports per batch:

- bytes the workers send each other (CGP) vs ``plain_bytes``, what one worker would fetch from
  the others to build the same SRPE graph itself (remote feature rows, PE rows and adjacency
  entries at 8 bytes per edge id); the target is plain / CGP >= 5 at P = 4;
- latency (ms, median of ``--repeats`` runs) of ``CGPService.run`` vs the single-process
  ``NewNodeInference.run(mode="srpe")``; every worker runs one torch thread, all on this machine
  (``slowest_worker_ms``: compute + collectives of the slowest worker, Ray call overhead aside).
  The workers aggregate rows in place with sparse matmuls while the single process gathers
  feature rows and runs PyG layers, so part of the gap is the local kernel, not parallelism;
- the largest |logit difference| to the single-process answer (must be <= 1e-4).

Run: ``.venv/bin/python bench/cgp.py`` (``--quick``: cora, 3 batches).
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

import gnnserve  # noqa: F401  (first: sets the OpenMP wait policy)
from common import DATASETS, RESULTS, Targets, save_figure, write_results
from gnnserve.deploy.cgp import CGPService
from gnnserve.embeddings.srpe import NewNodeInference
from gnnserve.graph import open_graph_store
from gnnserve.models.checkpoint import save_checkpoint
from gnnserve.models.zoo import GNN, ModelConfig
from gnnserve.types import NewNodes
from srpe_protocol import MODELS, Workload, embeddings_for, query_batches, split

GAMMA = 0.1
BATCH = 64
QUERIES = 500
WORKERS = (2, 4)
TOL = 1e-4
ARCH = "sage"


def parse() -> argparse.Namespace:
    """``--quick``, ``--workdir`` (shared with bench/srpe.py) and ``--repeats``."""
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--quick", action="store_true", help="cora, 3 batches")
    p.add_argument("--workdir", type=Path, default=Path("work/srpe"), help="store/model/PE cache")
    p.add_argument("--repeats", type=int, default=5, help="timed runs per batch")
    return p.parse_args()


def checkpoint(work: Workload, workdir: Path) -> Path:
    """bench/srpe.py's trained checkpoint when cached, else a seeded random init (cached)."""
    trained = workdir / f"{work.store.name}-{ARCH}"
    if (trained / "config.json").exists():
        return trained
    out = workdir / f"{work.store.name}-{ARCH}-random"
    if not (out / "config.json").exists():
        meta = open_graph_store(work.store).meta
        config = ModelConfig(ARCH, meta.feature_dim, 128, work.num_classes, MODELS[ARCH][0])
        torch.manual_seed(0)
        save_checkpoint(out, GNN(config).eval(), config, {"note": "random init (bench/cgp.py)"})
    return out


def first_queries(work: Workload, count: int) -> Workload:
    """The workload restricted to its first ``count`` held-out nodes."""
    keep = work.edges[:, 0] < count
    return replace(work, x=work.x[:count], y=work.y[:count], edges=work.edges[keep])


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
            rows.append(
                {
                    "batch": i,
                    "queries": new.count,
                    "recomputed": int(got.recomputed.size),
                    "candidates": got.num_candidates,
                    "bytes_sent": got.bytes_sent,
                    "plain_bytes": got.plain_bytes,
                    "request_bytes": got.request_bytes,
                    "ratio": got.plain_bytes / max(got.bytes_sent, 1),
                    "cgp_ms": ms,
                    "slowest_worker_ms": max(got.worker_ms),
                    "max_abs_diff": diff,
                }
            )
            r = rows[-1]
            print(
                f"  P={parts} batch {i}: CGP {r['bytes_sent'] / 1e3:8.1f} kB  plain "
                f"{r['plain_bytes'] / 1e6:8.2f} MB  ratio {r['ratio']:7.1f}  {ms:7.1f} ms  "
                f"diff {diff:.1e}",
                flush=True,
            )
    return rows


def summary(rows: list[dict[str, Any]]) -> dict[str, float]:
    """Totals and means over the batches of one P."""
    sent = sum(r["bytes_sent"] for r in rows)
    plain = sum(r["plain_bytes"] for r in rows)
    return {
        "bytes_sent": sent,
        "plain_bytes": plain,
        "ratio": plain / max(sent, 1),
        "min_batch_ratio": min(r["ratio"] for r in rows),
        "cgp_ms": float(np.mean([r["cgp_ms"] for r in rows])),
        "slowest_worker_ms": float(np.mean([r["slowest_worker_ms"] for r in rows])),
        "max_abs_diff": max(r["max_abs_diff"] for r in rows),
    }


def plot(result: dict[str, Any], path: Path) -> None:
    """Bytes per batch (CGP vs plain, log scale) and latency per batch, per P."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_b, ax_l) = plt.subplots(1, 2, figsize=(12, 4.5))
    runs = result["runs"]
    n = len(result["srpe_ms"])
    x = np.arange(n)
    width = 0.8 / (2 * len(runs))
    for j, (parts, rows) in enumerate(runs.items()):
        for k, key in enumerate(("bytes_sent", "plain_bytes")):
            label = f"{'CGP' if k == 0 else 'plain'} P={parts}"
            vals = [r[key] / 1e6 for r in rows]
            ax_b.bar(x + (2 * j + k) * width, vals, width, label=label)
    ax_b.set_yscale("log")
    top = max(r["plain_bytes"] for rows in runs.values() for r in rows) / 1e6
    ax_b.set_ylim(top=top * 30)  # room for the legend above the bars
    ax_b.set_xlabel("batch (64 queries)")
    ax_b.set_ylabel("MB moved between workers per batch")
    ax_b.set_title(f"{result['dataset']} SAGE-3, gamma {GAMMA}: traffic")
    ax_b.legend(fontsize=8, ncols=2)
    width = 0.8 / (len(runs) + 1)
    ax_l.bar(x, result["srpe_ms"], width, label="SRPE, one process")
    for j, (parts, rows) in enumerate(runs.items(), start=1):
        ax_l.bar(x + j * width, [r["cgp_ms"] for r in rows], width, label=f"CGP P={parts}")
    ax_l.set_xlabel("batch (64 queries)")
    ax_l.set_ylabel("ms per request (median)")
    ax_l.set_title("latency (all workers on this machine)")
    ax_l.legend(fontsize=8)
    save_figure(fig, path)


def main() -> None:
    """Run the workload at every P; write bench/results/cgp(.quick).json and .png."""
    args = parse()
    args.workdir.mkdir(parents=True, exist_ok=True)
    name = "cora" if args.quick else "fb100_cornell5"
    start = time.perf_counter()
    work = split(DATASETS / f"{name}.npz", args.workdir)
    ckpt_dir = checkpoint(work, args.workdir)
    setup = embeddings_for(work.store, ckpt_dir)
    work = first_queries(work, QUERIES)
    batches = [new for _, new in query_batches(work, BATCH)]
    batches = batches[:3] if args.quick else batches
    print(f"{name}: {len(batches)} batches, prepared in {time.perf_counter() - start:.0f} s")
    ckpt, graph, features, pes = setup
    single = NewNodeInference(ckpt.model, graph, features, pes, max_new_nodes=BATCH)
    srpe_ms = [
        median_ms(lambda b=b: single.run(b, mode="srpe", gamma=GAMMA), args.repeats)
        for b in batches
    ]
    print(f"  single-process SRPE: {np.mean(srpe_ms):.1f} ms per batch", flush=True)
    runs = {str(p): run_workers(p, setup, batches, single, args.repeats) for p in WORKERS}
    summaries = {p: summary(rows) for p, rows in runs.items()}
    targets = Targets()
    if not args.quick:  # the traffic goal is for fb100 (mean degree 85, 4,735 features)
        targets.check("plain / CGP bytes at P = 4", summaries["4"]["ratio"], 5.0)
    worst = max(s["max_abs_diff"] for s in summaries.values())
    targets.check("max |CGP - SRPE| logit, x1e-6", worst * 1e6, TOL * 1e6, higher_is_better=False)
    result = {
        "dataset": name,
        "arch": ARCH,
        "layers": MODELS[ARCH][0],
        "checkpoint": ckpt_dir.name,
        "gamma": GAMMA,
        "batch": BATCH,
        "queries": int(work.y.size),
        "torch_threads_single_process": torch.get_num_threads(),
        "torch_threads_per_worker": 1,
        "srpe_ms": srpe_ms,
        "srpe_mean_ms": float(np.mean(srpe_ms)),
        "summary": summaries,
        "runs": runs,
        "targets": targets.rows,
    }
    suffix = "_quick" if args.quick else ""
    path = write_results("cgp" + suffix, result)
    plot(result, RESULTS / f"cgp{suffix}.png")
    for p, s in summaries.items():
        print(
            f"P={p}: CGP {s['bytes_sent'] / 1e6:.2f} MB vs plain {s['plain_bytes'] / 1e6:.1f} MB "
            f"(x{s['ratio']:.1f}, worst batch x{s['min_batch_ratio']:.1f}); "
            f"{s['cgp_ms']:.1f} ms vs single-process {np.mean(srpe_ms):.1f} ms"
        )
    print(f"wrote {path}")
    targets.print()


if __name__ == "__main__":
    main()
