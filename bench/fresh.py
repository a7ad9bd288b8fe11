"""Fresh embeddings under updates (issue 29), first part: the cost of refreshing the PEs after a
batch of edge insertions against a full precompute on the new graph.

For each graph and batch size: ``batches`` batches of random new edges, each applied to the
graph (a new store written, not timed); timed: the affected sets (``embeddings.affected``, on
an out-adjacency built once per batch outside the timing: a refresher would keep it current),
the refresh of those rows (``embeddings.refresh``) and a full precompute of the new graph. The
refreshed PEs must equal the full ones (max abs difference recorded). Medians over batches.

Then (``bench/fresh_stream.py``) the refresher behind a live stream: isolated batches (refresh
vs full precompute through the real refresher on a DynamicStore), paced streams of 100 / 1,000 /
10,000 edges/s (freshness lag p50/p99, refreshed PEs and new-node answers against a full
precompute at the same version), and the answer cache on a Zipf request stream with updates.

    python bench/fresh.py [--quick]     # fb100_cornell5 and R-MAT 2^20 (--quick: fb100 only)
    python bench/fresh.py --sections stream,cache
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

import fresh_stream
from common import DATASETS, RESULTS, environment, median_range, save_figure, strict
from gnnserve.data import generators
from gnnserve.data.writer import GraphData, write_store
from gnnserve.embeddings.affected import AffectedSets, BatchChanges, out_adjacency
from gnnserve.embeddings.precompute import precompute_embeddings
from gnnserve.embeddings.refresh import refresh_layers
from gnnserve.features import open_feature_store
from gnnserve.graph import open_graph_store
from gnnserve.models.zoo import GNN, ModelConfig

BATCH_EDGES = (100, 1000)


def _graph(name: str) -> tuple[np.ndarray, np.ndarray, int]:
    """(edge_index [2, E], features, N) of ``name``."""
    if name == "fb100_cornell5":
        with np.load(DATASETS / "fb100_cornell5.npz") as z:
            edges, n = z["edge_index"], int(z["num_nodes"])
        return edges, np.random.default_rng(0).standard_normal((n, 64), np.float32), n
    data = generators.rmat(num_nodes=2**20, num_edges=10_000_000, feature_dim=64, seed=0)
    return data.edge_index, data.x, data.num_nodes


def _precompute(model: GNN, store: Path) -> tuple[list[np.ndarray], float]:
    graph, features = open_graph_store(store), open_feature_store(store)
    start = time.perf_counter()
    pes = precompute_embeddings(model, graph, features, model_version="m", progress=False)
    took = time.perf_counter() - start
    return [np.array(pes.layer(i + 1)) for i in range(pes.num_layers)], took


def run_graph(name: str, batches: int, work: Path) -> dict[str, Any]:
    """Refresh vs full precompute per batch size on graph ``name``."""
    edges, x, n = _graph(name)
    torch.manual_seed(0)
    model = GNN(ModelConfig("sage", in_dim=64, hidden_dim=64, out_dim=4, num_layers=2)).eval()
    write_store(GraphData(name, n, edges, x), work / "base")
    base, _ = _precompute(model, work / "base")
    rng = np.random.default_rng(1)
    out: dict[str, Any] = {"num_nodes": n, "num_edges": int(edges.shape[1])}
    for size in BATCH_EDGES:
        rows: dict[str, list[float]] = {"affected_ms": [], "refresh_ms": [], "full_ms": []}
        rows |= {"affected_rows": [], "max_abs_diff": []}
        for b in range(batches):
            new = rng.integers(0, n, (2, size))
            store = work / f"b{size}_{b}"
            write_store(GraphData(name, n, np.concatenate([edges, new], axis=1), x), store)
            graph, features = open_graph_store(store), open_feature_store(store)
            out_csr = out_adjacency(*graph.csr())  # a refresher keeps this current; not timed
            start = time.perf_counter()
            sets = AffectedSets(2, model.needs_degree).compute(*out_csr, BatchChanges(new[1]))
            mid = time.perf_counter()
            got = refresh_layers(model, graph, features, [a.copy() for a in base], sets)
            done = time.perf_counter()
            want, full_s = _precompute(model, store)
            rows["affected_ms"].append((mid - start) * 1e3)
            rows["refresh_ms"].append((done - mid) * 1e3)
            rows["full_ms"].append(full_s * 1e3)
            rows["affected_rows"].append(float(sum(s.size for s in sets)))
            rows["max_abs_diff"].append(
                max(float(np.abs(g - w).max()) for g, w in zip(got, want, strict=True))
            )
            print(
                f"[fresh] {name} {size} edges batch {b + 1}: affected {sets[0].size}/"
                f"{sets[1].size} rows, {rows['affected_ms'][-1]:.1f} + "
                f"{rows['refresh_ms'][-1]:.0f} ms vs full {full_s * 1e3:.0f} ms",
                flush=True,
            )
        speedup = [
            f / (a + r)
            for f, a, r in zip(
                rows["full_ms"], rows["affected_ms"], rows["refresh_ms"], strict=True
            )
        ]
        out[str(size)] = {k: median_range(v) for k, v in rows.items()}
        out[str(size)]["full_over_refresh"] = median_range(speedup)
    return out


def run_stream(
    name: str, sections: str, seconds: float, work: Path, layers: int = 2
) -> dict[str, Any]:
    """The stream sections on graph ``name`` (SAGE, 64 hidden; the store written once)."""
    edges, x, n = _graph(name)
    store = work / "base"
    write_store(GraphData(name, n, edges, x), store)
    torch.manual_seed(0)
    config = ModelConfig("sage", in_dim=64, hidden_dim=64, out_dim=4, num_layers=layers)
    model = GNN(config).eval()
    out: dict[str, Any] = {}
    if "isolated" in sections:
        out["isolated"] = fresh_stream.isolated(model, store, work, BATCH_EDGES, 5)
    if "stream" in sections:
        out["stream"] = [
            fresh_stream.stream(model, store, work, rate, 100, seconds)
            for rate in (100.0, 1_000.0, 10_000.0)
        ]
    if "cache" in sections and name == "fb100_cornell5":
        out["cache"] = fresh_stream.cache(store, work, 2_000, 50, 100, 64.0)
    return out


def main() -> None:
    """Both graphs (fb100 only with --quick); results/fresh.json."""
    p = argparse.ArgumentParser(description=(main.__doc__ or "").splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--batches", type=int, default=3)
    p.add_argument("--sections", default="batch,isolated,stream,cache")
    p.add_argument("--seconds", type=float, default=10.0, help="length of each paced stream")
    p.add_argument("--layers", type=int, default=2, help="SAGE layers (rows: <graph>_sage<L>)")
    p.add_argument("--plot-only", action="store_true", help="redraw the PNG from the JSON")
    args = p.parse_args()
    names = ["fb100_cornell5"] + ([] if args.quick else ["rmat"])
    name = "fresh_quick" if args.quick else "fresh"
    path = RESULTS / f"{name}.json"
    results: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
    if args.plot_only:
        plot(results, RESULTS / f"{name}.png")
        return
    results["model"] = "sage 2 layers, 64 hidden, 64-dim features"
    results["environment"] = environment()
    with tempfile.TemporaryDirectory() as tmp:
        for graph in names:
            key = graph if args.layers == 2 else f"{graph}_sage{args.layers}"
            row = results.get(key, {})
            if "batch" in args.sections and args.layers == 2:
                row |= run_graph(graph, args.batches, Path(tmp) / graph)
            work = Path(tmp) / f"{graph}_s"
            row |= run_stream(graph, args.sections, args.seconds, work, args.layers)
            results[key] = row
            path.write_text(json.dumps(strict(results), indent=2, allow_nan=False, default=float))
    plot(results, RESULTS / f"{name}.png")
    print(f"wrote {path} and its PNG")


def plot(results: dict[str, Any], path: Path) -> None:
    """Three panels from the JSON: full precompute / refresh per batch size (log; the 20x
    target dashed), freshness lag p50 and p99 per stream rate, answer latency with and without
    the answer cache. Rows a run did not produce are left out."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = {k: v for k, v in results.items() if isinstance(v, dict) and k != "environment"}
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.2))
    ax, labels, i = axes[0], [], 0
    for key, row in rows.items():
        for size, iso in row.get("isolated", {}).items():
            ax.bar(i, iso["full_over_refresh"], color="C0" if "sage3" not in key else "C1")
            labels.append(
                f"{key.replace('_cornell5', '').replace('_sage', ' SAGE-')}\n{size} edges"
            )
            i += 1
    ax.axhline(20, color="k", ls="--", lw=1)
    ax.set_xticks(range(len(labels)), labels, fontsize=6)
    ax.set_yscale("log")
    ax.set_ylabel("full precompute / refresh (x)")
    ax = axes[1]
    for j, (key, row) in enumerate(rows.items()):
        stream = row.get("stream", [])
        if not stream:
            continue
        rates = [s["edges_per_s"] for s in stream]
        for q, style in (("p50", "o-"), ("p99", "s--")):
            ax.plot(
                rates, [s[f"lag_ms_{q}"] for s in stream], style, color=f"C{j}", label=f"{key} {q}"
            )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("update stream (edges/s, 100-edge batches)")
    ax.set_ylabel("freshness lag (ms)")
    ax.legend(fontsize=7)
    ax = axes[2]
    cached = next(((key, row["cache"]) for key, row in rows.items() if "cache" in row), None)
    if cached is not None:
        key, cache = cached
        for k, arm in enumerate(("plain", "cached")):
            values = [cache[f"{arm}_ms_p50"], cache[f"{arm}_ms_p99"]]
            ax.bar(np.arange(2) + 0.4 * k, values, 0.4, label=arm)
        ax.set_title(f"{key}: answer cache hit rate {cache['hit_rate']:.2f}", fontsize=8)
    ax.set_xticks([0.2, 1.2], ["p50", "p99"])
    ax.set_ylabel("answer latency (ms)")
    ax.legend(fontsize=7)
    save_figure(fig, path)


if __name__ == "__main__":
    main()
