"""SRPE on OMEGA's serving workload: accuracy per recomputation policy and latency per mode.

Protocol of OMEGA §8.1 / Table 3 (bench/srpe_protocol.py): 25% of the test nodes and their edges
are removed, a model is trained on the rest and its precomputed embeddings (PEs) are stored; the
removed nodes are served as new-node requests of up to 1,024 queries with their edges to the
remaining graph and the edges among the request's own queries (``new_edges``). For GCN (2
layers), GraphSAGE (3) and GAT (3) on cora, citeseer, facebook_pagepage and fb100_cornell5 it
reports the accuracy with the full computation graph, the drop with PEs only, and for each
policy the smallest gamma whose drop stays under 1 point (Table 3), the drop at every gamma
(Fig. 6 right), and the latency per batch of FULL, NS, PE-only
(``pe``: SRPE at gamma 0, nothing recomputed), SRPE at the server's default gamma 0.1
(``srpe_default``) and SRPE at the Table-3 gamma of the default policy (``srpe_min``; absent when
that gamma is 0, where it is PE-only).

Run: ``.venv/bin/python bench/srpe.py`` (stores, trained models and PEs are cached in
``work/srpe``, keyed by every parameter that made them); ``--quick`` writes ``srpe_quick.json``.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from common import DATASETS, RESULTS, Targets, require_baseline, save_figure, write_results
from gnnserve.newnodes.inference import NewNodeInference
from gnnserve.newnodes.result import DEFAULT_GAMMA
from gnnserve.types import NewNodes
from srpe_protocol import EPOCHS, MODELS, Workload, embeddings_for, query_batches, split, trained

GAMMAS = (0.0, 0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0)
POLICIES = ("query_edges_ratio", "importance", "random", "oracle")
LABELS = {"query_edges_ratio": "OMEGA (query-edges ratio)", "importance": "IS", "oracle": "AE"}
BATCH = 1024  # queries per request, as in Table 3
SMALL_BATCH = 64  # the smallest request size of OMEGA's latency evaluation
MAX_DROP = 1.0  # accuracy points


def parse() -> argparse.Namespace:
    """``--quick`` (cora and citeseer, coarse gamma grid) and ``--workdir``."""
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--quick", action="store_true", help="cora + citeseer, coarse gamma grid")
    p.add_argument("--workdir", type=Path, default=Path("work/srpe"), help="model/PE cache")
    p.add_argument("--repeats", type=int, default=5, help="timed runs per latency cell")
    p.add_argument("--datasets", nargs="+", choices=list(EPOCHS), help="subset (own file)")
    p.add_argument("--models", nargs="+", choices=list(MODELS), help="subset (own file)")
    args = p.parse_args()
    require_baseline()
    return args


def accuracy(
    inf: NewNodeInference,
    batches: list[tuple[np.ndarray, NewNodes]],
    y: np.ndarray,
    mode: str,
    gamma: float = 0.0,
    policy: str = "query_edges_ratio",
) -> float:
    """Accuracy (percent) of ``mode`` over every held-out query, request by request."""
    correct = 0
    for idx, new in batches:
        result = inf.run(new, mode=mode, gamma=gamma, policy=policy)
        correct += int((result.logits.argmax(1).numpy() == y[idx]).sum())
    return 100.0 * correct / y.size


def drop_curves(
    inf: NewNodeInference,
    batches: list[tuple[np.ndarray, NewNodes]],
    y: np.ndarray,
    full_acc: float,
    gammas: tuple[float, ...],
) -> dict[str, dict[str, Any]]:
    """Per policy: the accuracy drop (points) at every gamma and the smallest gamma < 1 point."""
    out: dict[str, dict[str, Any]] = {}
    for policy in POLICIES:
        drops = [full_acc - accuracy(inf, batches, y, "srpe", g, policy) for g in gammas]
        ok = [g for g, d in zip(gammas, drops, strict=True) if d < MAX_DROP]
        out[policy] = {"drops": [round(d, 3) for d in drops], "gamma": ok[0] if ok else None}
    return out


def latency_ms(
    inf: NewNodeInference, batches: list[NewNodes], mode: str, gamma: float, repeats: int
) -> float:
    """Mean over requests of the median of ``repeats`` timed runs, milliseconds per request."""
    per_request = []
    for new in batches:
        inf.run(new, mode=mode, gamma=gamma)  # warm-up: numba, allocator, page cache
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            inf.run(new, mode=mode, gamma=gamma)
            times.append((time.perf_counter() - start) * 1e3)
        per_request.append(float(np.median(times)))
    return float(np.mean(per_request))


def latencies(
    inf: NewNodeInference, work: Workload, min_gamma: float, repeats: int
) -> dict[str, dict[str, float]]:
    """Per batch size: ms per request of FULL, NS, PE-only (SRPE at gamma 0), SRPE at the
    server default gamma (``srpe_default``) and, when it is > 0, at ``min_gamma``
    (``srpe_min``); SRPE uses the default policy."""
    out = {}
    for size, count in ((SMALL_BATCH, 8), (BATCH, 1)):
        batches = [new for _, new in query_batches(work, size)[:count]]
        cell = {mode: latency_ms(inf, batches, mode, 0.0, repeats) for mode in ("full", "ns")}
        cell["pe"] = latency_ms(inf, batches, "pe", 0.0, repeats)
        cell["srpe_default"] = latency_ms(inf, batches, "srpe", DEFAULT_GAMMA, repeats)
        if min_gamma > 0:
            cell["srpe_min"] = latency_ms(inf, batches, "srpe", min_gamma, repeats)
        out[str(size)] = {k: round(v, 3) for k, v in cell.items()}
    return out


def evaluate(name: str, arch: str, args: argparse.Namespace, gammas: tuple[float, ...]) -> dict:
    """One Table-3 row: accuracies, drop curves, smallest gammas and latencies."""
    start = time.perf_counter()
    work = split(DATASETS / f"{name}.npz", args.workdir)
    ckpt_dir = trained(work, arch, args.workdir, EPOCHS[name])
    ckpt, graph, features, pes = embeddings_for(work.store, ckpt_dir)
    inf = NewNodeInference(ckpt.model, graph, features, pes, max_new_nodes=BATCH)
    batches = query_batches(work, BATCH)
    full = accuracy(inf, batches, work.y, "full")
    pe = accuracy(inf, batches, work.y, "pe")
    curves = drop_curves(inf, batches, work.y, full, gammas)
    gamma = curves["query_edges_ratio"]["gamma"]
    min_gamma = 1.0 if gamma is None else gamma
    lat = latencies(inf, work, min_gamma, args.repeats)
    row = {
        "dataset": name,
        "arch": arch,
        "layers": MODELS[arch][0],
        "ns_fanouts": MODELS[arch][1],
        "queries": int(work.y.size),
        "query_edges": int(work.edges.shape[0]),
        "new_edges": int(work.new_edges.shape[0]),
        "new_edges_sent": sum(int(new.new_edges.shape[0]) for _, new in batches),
        "default_gamma": DEFAULT_GAMMA,
        "min_gamma": min_gamma,
        "full_acc": round(full, 3),
        "pe_drop": round(full - pe, 3),
        "gammas": list(gammas),
        "policies": curves,
        "latency_ms": lat,
        "seconds": round(time.perf_counter() - start, 1),
    }
    summary = " ".join(f"{p}={c['gamma']}" for p, c in curves.items())
    print(
        f"{name:18s} {arch:4s} full {full:5.1f} pe drop {full - pe:5.2f}  gamma: {summary}  "
        f"new edges {row['new_edges_sent']}/{row['new_edges']}  latency@{BATCH}: {lat[str(BATCH)]}",
        flush=True,
    )
    return row


def policy_wins(rows: list[dict]) -> tuple[int, int]:
    """(pairs where query_edges_ratio's gamma is below both random's and importance's, pairs
    where any policy had to recompute at all)."""
    wins = contested = 0
    for r in rows:
        g = {p: c["gamma"] if c["gamma"] is not None else 2.0 for p, c in r["policies"].items()}
        if max(g["query_edges_ratio"], g["random"], g["importance"]) == 0.0:
            continue  # PEs alone are within 1 point: no policy is needed
        contested += 1
        wins += g["query_edges_ratio"] < min(g["random"], g["importance"])
    return wins, contested


def plot(rows: list[dict], path: Path) -> None:
    """Fig. 6 (right) per model x dataset: accuracy drop vs gamma per policy; latency bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = sorted({r["dataset"] for r in rows}, key=list(EPOCHS).index)
    archs = list(MODELS)
    fig, axes = plt.subplots(
        len(archs) + 1, len(names), figsize=(4 * len(names), 13), squeeze=False
    )
    for r in rows:
        ax = axes[archs.index(r["arch"]), names.index(r["dataset"])]
        for policy, curve in r["policies"].items():
            ax.plot(r["gammas"], curve["drops"], marker="o", ms=3, label=LABELS.get(policy, policy))
        ax.axhline(MAX_DROP, color="grey", ls="--", lw=0.8)
        ax.set_title(f"{r['dataset']} {r['arch'].upper()} (full {r['full_acc']:.1f}%)", fontsize=9)
        ax.set_xlabel("recomputation budget gamma")
        ax.set_ylabel("accuracy drop (points)")
    axes[0, 0].legend(fontsize=7)
    for j, name in enumerate(names):
        ax = axes[-1, j]
        mine = [r for r in rows if r["dataset"] == name]
        modes = {"full": "FULL", "ns": "NS", "pe": "PE only", "srpe_default": "SRPE g=0.1"}
        width = 0.8 / len(modes)
        for k, (mode, label) in enumerate(modes.items()):
            vals = [r["latency_ms"][str(BATCH)][mode] for r in mine]
            ax.bar(np.arange(len(mine)) + k * width, vals, width, label=label)
        ax.set_xticks(np.arange(len(mine)) + 0.3, [r["arch"] for r in mine])
        ax.set_yscale("log")
        ax.set_title(f"{name}: ms per request of {BATCH} queries", fontsize=9)
    axes[-1, 0].legend(fontsize=7)
    save_figure(fig, path)


def result_name(args: argparse.Namespace) -> str:
    """``srpe`` for the full run; ``srpe_quick`` and ``srpe_<subset>`` never overwrite it."""
    subset = [*(args.datasets or []), *(args.models or [])]
    return "srpe" + ("_quick" if args.quick else "") + "".join(f"_{x}" for x in subset)


def main() -> None:
    """Run every model x dataset pair, write bench/results/srpe.json and srpe.png."""
    args = parse()
    args.workdir.mkdir(parents=True, exist_ok=True)
    names = args.datasets or (["cora", "citeseer"] if args.quick else list(EPOCHS))
    archs = args.models or list(MODELS)
    gammas = (0.0, 0.05, 0.2, 1.0) if args.quick else GAMMAS
    out = result_name(args)
    rows = []
    for name in names:
        for arch in archs:
            rows.append(evaluate(name, arch, args, gammas))
            write_results(out, {"complete": False, "rows": rows})  # survives a crash
    targets = Targets()
    for r in rows:
        if r["dataset"] == "fb100_cornell5" and r["arch"] == "sage":
            for size in (str(SMALL_BATCH), str(BATCH)):
                lat = r["latency_ms"][size]
                srpe = lat["srpe_default"]
                name = f"fb100 sage-3 {{}}/srpe(gamma {DEFAULT_GAMMA}) ms (batch {size})"
                targets.check(name.format("full"), lat["full"] / srpe, 10.0)
                targets.check(name.format("ns"), lat["ns"] / srpe, 2.0)
    wins, contested = policy_wins(rows)
    targets.check(
        f"pairs where ratio policy needs the smallest gamma ({wins}/{contested} contested)",
        wins / max(contested, 1),
        0.5,
    )
    payload = {
        "complete": True,
        "protocol": "OMEGA 8.1: 25% of test nodes held out (seed 0), requests of up to "
        f"{BATCH} queries with their edges to the remaining graph and among themselves "
        "(new_edges); drop = full - mode, points; latency keys: pe = SRPE at gamma 0 (PE-only), "
        f"srpe_default = SRPE at gamma {DEFAULT_GAMMA}, srpe_min = SRPE at min_gamma when > 0",
        "epochs": EPOCHS,
        "torch_threads": torch.get_num_threads(),
        "rows": rows,
        "targets": targets.rows,
    }
    path = write_results(out, payload)
    plot(rows, RESULTS / f"{out}.png")
    print(f"wrote {path}")
    targets.print()


if __name__ == "__main__":
    main()
