"""Sampling + feature gather per batch: gnnserve's numba sampler vs PyG's NeighborLoader.

Graphs: fb100_cornell5 (real, 18.7K nodes, 1.58M edges) and a 1M-node / 20M-edge R-MAT graph;
fanouts [25, 10]; 128-dim float32 random features on both (fb100's own are 4.7K-dim one-hot);
batch sizes 1, 64, 1024. Both sides get the same seeds; each timed call produces the sampled
blocks *and* the gathered input features. Median per-batch time, speedup = PyG / gnnserve.

    python bench/sampling.py            # full run (< 10 min)
    python bench/sampling.py --quick    # smoke run (< 1 min, smaller R-MAT)
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

import gnnserve  # noqa: F401  (first: sets the OpenMP wait policy before torch loads it)

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import DATASETS, Targets, parse_args, save_figure, time_calls, write_results  # noqa: E402
from gnnserve.data.generators import rmat  # noqa: E402
from gnnserve.data.writer import GraphData, write_store  # noqa: E402
from gnnserve.features import open_feature_store  # noqa: E402
from gnnserve.graph import open_graph_store  # noqa: E402
from gnnserve.sampling import NeighborSampler  # noqa: E402

FANOUTS = [25, 10]
FEATURE_DIM = 128
BATCHES = {1: 300, 64: 100, 1024: 20}


def load_graph(name: str, quick: bool) -> GraphData:
    """The benchmark graph with fresh 128-dim features (seeded)."""
    rng = np.random.default_rng(0)
    if name == "fb100_cornell5":
        with np.load(DATASETS / "fb100_cornell5.npz") as z:
            edge_index, n = z["edge_index"], int(z["num_nodes"])
        x = rng.standard_normal((n, FEATURE_DIM), dtype=np.float32)
        return GraphData(name, n, edge_index, x)
    nodes, edges = (2**17, 2_000_000) if quick else (2**20, 20_000_000)
    t = time.perf_counter()
    data = rmat(num_nodes=nodes, num_edges=edges, feature_dim=FEATURE_DIM, seed=0)
    print(f"  generated R-MAT {nodes} nodes / {edges} edges in {time.perf_counter() - t:.1f} s")
    data.name = "rmat"
    return data


def gnnserve_step(store: Path):  # type: ignore[no-untyped-def]
    """A callable doing one batch on gnnserve's sampler + in-memory feature store."""
    sampler = NeighborSampler(open_graph_store(store), FANOUTS, seed=0)
    features = open_feature_store(store)

    def step(seeds: np.ndarray) -> tuple[object, torch.Tensor]:
        sg = sampler.sample(seeds)
        return sg, features.get(sg.input_nodes)

    return step


def pyg_step(data: GraphData, seed_batches: list[np.ndarray], batch_size: int):  # type: ignore[no-untyped-def]
    """A callable returning the next batch of a NeighborLoader over the same seed sequence."""
    from torch_geometric.data import Data
    from torch_geometric.loader import NeighborLoader

    pyg = Data(
        x=torch.from_numpy(data.x),
        edge_index=torch.from_numpy(data.edge_index),
        num_nodes=data.num_nodes,
    )
    seeds = torch.from_numpy(np.concatenate(seed_batches))
    loader = NeighborLoader(
        pyg, num_neighbors=FANOUTS, batch_size=batch_size, input_nodes=seeds, shuffle=False
    )
    it = iter(loader)
    return lambda _i: next(it)


def bench_graph(name: str, quick: bool, workdir: Path) -> list[dict[str, float]]:
    """Median per-batch ms for both systems at every batch size on one graph."""
    print(f"[{name}]")
    data = load_graph(name, quick)
    store = workdir / name
    write_store(data, store)
    ours = gnnserve_step(store)
    rng = np.random.default_rng(1)
    rows = []
    for bs, n in BATCHES.items():
        n = max(5, n // 5) if quick else n
        batches = [rng.integers(0, data.num_nodes, bs) for _ in range(n + 3)]
        t_ours = time_calls(lambda i, b=batches: ours(b[i]), n)
        baseline = pyg_step(data, batches, bs)
        t_pyg = time_calls(baseline, n)
        row = {
            "batch_size": bs,
            "gnnserve_ms": float(np.median(t_ours)),
            "pyg_ms": float(np.median(t_pyg)),
            "batches": n,
        }
        row["speedup"] = row["pyg_ms"] / row["gnnserve_ms"]
        print(
            f"  batch {bs:5d}: gnnserve {row['gnnserve_ms']:8.3f} ms  "
            f"PyG {row['pyg_ms']:8.3f} ms  speedup {row['speedup']:6.1f}x"
        )
        rows.append(row)
    return rows


def plot(results: dict[str, list[dict[str, float]]], path: Path) -> None:
    """Per-batch time vs batch size, both systems, one panel per graph."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(5 * len(results), 4), squeeze=False)
    for ax, (name, rows) in zip(axes[0], results.items(), strict=True):
        bs = [r["batch_size"] for r in rows]
        ax.loglog(bs, [r["gnnserve_ms"] for r in rows], "o-", label="gnnserve")
        ax.loglog(bs, [r["pyg_ms"] for r in rows], "s--", label="PyG NeighborLoader")
        for r in rows:
            ax.annotate(
                f"{r['speedup']:.1f}x",
                (r["batch_size"], r["gnnserve_ms"]),
                textcoords="offset points",
                xytext=(0, -14),
                ha="center",
                fontsize=8,
            )
        ax.set(
            title=f"{name}: sample + gather, fanouts {FANOUTS}",
            xlabel="batch size (seeds)",
            ylabel="median ms per batch",
        )
        ax.legend()
    save_figure(fig, path)


def main() -> None:
    args = parse_args(__doc__, "smoke run: small R-MAT, few batches")
    torch.set_num_threads(2)
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in ("fb100_cornell5", "rmat"):
            results[name] = bench_graph(name, args.quick, Path(tmp))
    out = write_results(
        "sampling",
        {"fanouts": FANOUTS, "feature_dim": FEATURE_DIM, "quick": args.quick, "results": results},
    )
    plot(results, out.with_suffix(".png"))
    print(f"wrote {out} and {out.with_suffix('.png')}")
    targets = Targets()
    for name, rows in results.items():
        by_bs = {r["batch_size"]: r["speedup"] for r in rows}
        targets.check(f"{name}_speedup_batch1", by_bs[1], 5.0)
        targets.check(f"{name}_speedup_batch1024", by_bs[1024], 10.0)
    targets.print()


if __name__ == "__main__":
    main()
