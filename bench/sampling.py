"""Sampling + feature gather per batch: gnnserve's numba sampler vs PyG's NeighborLoader.

Graphs: fb100_cornell5 (real, 18.7K nodes, 1.58M edges) and a 1M-node / 20M-edge R-MAT graph;
fanouts [25, 10]; 128-dim float32 random features on both (fb100's own are 4.7K-dim one-hot);
batch sizes 1, 64, 1024. Each timed call produces the sampled blocks *and* the gathered input
features. Both systems run in this process with the same torch and numba thread counts
(``--threads``, default 2), the same seed batches in the same order and the same warm-up
(``WARMUP`` untimed batches per block). Timing is interleaved: each round runs, per batch size,
a gnnserve block and a PyG block next to each other (order reversed every other round); a block
gives its median ms per batch. Published: the median over rounds with the range (min-max), and
the speedup as the median of the per-round ratios PyG / gnnserve with its range.

    python bench/sampling.py            # full run: 7 rounds (< 10 min), results/sampling.json
    python bench/sampling.py --quick    # smoke run: small R-MAT, 3 rounds, sampling_quick.json
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

import gnnserve  # noqa: F401  (first: sets the OpenMP wait policy before torch loads it)

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (  # noqa: E402
    DATASETS,
    Targets,
    fmt_range,
    interleaved_rounds,
    median_range,
    ratios,
    require_baseline,
    result_name,
    save_figure,
    set_threads,
    time_calls,
    write_results,
)
from gnnserve.data.generators import rmat  # noqa: E402
from gnnserve.data.writer import GraphData, write_store  # noqa: E402
from gnnserve.features import open_feature_store  # noqa: E402
from gnnserve.graph import open_graph_store  # noqa: E402
from gnnserve.sampling import NeighborSampler  # noqa: E402

FANOUTS = [25, 10]
FEATURE_DIM = 128
BATCHES = {1: 300, 64: 100, 1024: 20}  # timed batches per block (quick: a fifth, at least 5)
WARMUP = 3  # untimed batches at the start of every block, both systems


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


def pyg_graph(data: GraphData):  # type: ignore[no-untyped-def]
    """PyG ``Data`` and its NeighborSampler (CSC built once, outside every timed block)."""
    from torch_geometric.data import Data
    from torch_geometric.sampler import NeighborSampler as PyGSampler

    pyg = Data(
        x=torch.from_numpy(data.x),
        edge_index=torch.from_numpy(data.edge_index),
        num_nodes=data.num_nodes,
    )
    return pyg, PyGSampler(pyg, num_neighbors=FANOUTS)


def timed(batch_size: int, quick: bool) -> int:
    """Timed batches per block at this batch size."""
    n = BATCHES[batch_size]
    return max(5, n // 5) if quick else n


def block_ms(step, batches: list[np.ndarray]) -> float:  # type: ignore[no-untyped-def]
    """Median ms of ``step(b)`` over ``batches[WARMUP:]`` after untimed ``batches[:WARMUP]``."""
    it = iter(batches)
    return float(np.median(time_calls(lambda _i: step(next(it)), len(batches) - WARMUP, WARMUP)))


def pyg_loader(pyg, sampler, batches: list[np.ndarray]):  # type: ignore[no-untyped-def]
    """A NeighborLoader yielding ``batches`` in order (same seeds as gnnserve's blocks)."""
    from torch_geometric.loader import NeighborLoader

    return NeighborLoader(
        pyg,
        num_neighbors=FANOUTS,
        batch_size=len(batches[0]),
        input_nodes=torch.from_numpy(np.concatenate(batches)),
        shuffle=False,
        neighbor_sampler=sampler,
    )


def pyg_block(pyg, sampler, batches: list[np.ndarray]) -> float:  # type: ignore[no-untyped-def]
    """``block_ms`` for PyG over the same seed batches in the same order."""
    it = iter(pyg_loader(pyg, sampler, batches))
    return block_ms(lambda _b: next(it), batches)


def check_same_seeds(pyg, sampler, batches: list[np.ndarray]) -> None:  # type: ignore[no-untyped-def]
    """Untimed: PyG's first two batches hold the seeds gnnserve gets (guards the pairing)."""
    it = iter(pyg_loader(pyg, sampler, batches[:2]))
    for want in batches[:2]:
        got = next(it)
        if not np.array_equal(got.n_id[: got.batch_size].numpy(), want):
            raise AssertionError("PyG's loader does not yield the seed batches gnnserve gets")


def bench_graph(name: str, quick: bool, rounds: int, workdir: Path) -> list[dict[str, Any]]:
    """Per batch size: both systems' median ms per round, interleaved; medians and ranges."""
    print(f"[{name}]")
    data = load_graph(name, quick)
    store = workdir / name
    write_store(data, store)
    ours = gnnserve_step(store)
    pyg, sampler = pyg_graph(data)
    rng = np.random.default_rng(1)
    arms = {}
    for bs in BATCHES:
        batches = [rng.integers(0, data.num_nodes, bs) for _ in range(WARMUP + timed(bs, quick))]
        check_same_seeds(pyg, sampler, batches)
        arms[f"{bs}/gnnserve"] = lambda b=batches: block_ms(ours, b)
        arms[f"{bs}/pyg"] = lambda b=batches: pyg_block(pyg, sampler, b)

    def show(r: int, v: dict[str, float]) -> None:
        cells = [f"{bs}: {v[f'{bs}/pyg'] / v[f'{bs}/gnnserve']:5.1f}x" for bs in BATCHES]
        print(f"  round {r + 1}/{rounds}  speedup per batch size  " + "  ".join(cells))

    times = interleaved_rounds(arms, rounds, show)
    rows: list[dict[str, Any]] = []
    for bs in BATCHES:
        ours_ms, pyg_ms = times[f"{bs}/gnnserve"], times[f"{bs}/pyg"]
        row: dict[str, Any] = {
            "batch_size": bs,
            "timed_batches_per_block": timed(bs, quick),
            "gnnserve_ms": median_range(ours_ms),
            "pyg_ms": median_range(pyg_ms),
            "speedup": median_range(ratios(pyg_ms, ours_ms)),
        }
        print(
            f"  batch {bs:5d}: gnnserve {fmt_range(row['gnnserve_ms'], '.3f')} ms  "
            f"PyG {fmt_range(row['pyg_ms'], '.3f')} ms  "
            f"speedup {fmt_range(row['speedup'], '.1f', 'x')}"
        )
        rows.append(row)
    return rows


def _median_err(stats: list[dict[str, float]]) -> tuple[list[float], np.ndarray]:
    """Medians and the [below, above] distances to min and max, for ``errorbar``."""
    med = [s["median"] for s in stats]
    err = np.array(
        [[s["median"] - s["min"] for s in stats], [s["max"] - s["median"] for s in stats]]
    )
    return med, err


def plot(results: dict[str, list[dict[str, Any]]], rounds: int, path: Path) -> None:
    """Top: ms per batch vs batch size; bottom: speedup. Median over rounds, bars = min-max."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, len(results), figsize=(5 * len(results), 7), squeeze=False)
    for col, (name, rows) in enumerate(results.items()):
        top, bottom = axes[0][col], axes[1][col]
        bs = [r["batch_size"] for r in rows]
        for key, fmt, label in (("gnnserve_ms", "o-", "gnnserve"), ("pyg_ms", "s--", "PyG")):
            med, err = _median_err([r[key] for r in rows])
            top.errorbar(bs, med, yerr=err, fmt=fmt, capsize=3, label=label)
        top.set(
            xscale="log",
            yscale="log",
            xlim=(0.4, 2600),
            title=f"{name}: sample + gather, fanouts {FANOUTS}",
            ylabel="ms per batch",
        )
        top.legend()
        med, err = _median_err([r["speedup"] for r in rows])
        bottom.errorbar(bs, med, yerr=err, fmt="o-", capsize=3, color="black")
        for x, r in zip(bs, rows, strict=True):
            s = r["speedup"]
            label = f"{s['median']:.1f}x ({s['min']:.1f}-{s['max']:.1f})"
            bottom.annotate(
                label,
                (x, s["max"]),
                textcoords="offset points",
                xytext=(0, 6),
                ha="center",
                fontsize=8,
            )
        bottom.set(
            xscale="log",
            xlim=(0.4, 2600),
            ylim=(0, 1.25 * max(r["speedup"]["max"] for r in rows)),
            xlabel="batch size (seeds)",
            ylabel="speedup, PyG ms / gnnserve ms",
        )
    fig.suptitle(f"median of {rounds} interleaved rounds; bars: min-max over rounds", fontsize=9)
    save_figure(fig, path)


def parse() -> argparse.Namespace:
    """``--quick``, ``--rounds``, ``--threads``; then a check that the PyG baseline runs."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: small R-MAT, 3 rounds")
    parser.add_argument("--rounds", type=int, default=None, help="rounds (default 7; quick 3)")
    parser.add_argument("--threads", type=int, default=2, help="torch and numba threads (both)")
    args = parser.parse_args()
    require_baseline()
    return args


def main() -> None:
    args = parse()
    rounds = args.rounds or (3 if args.quick else 7)
    threads = set_threads(args.threads)
    print(f"threads (both systems, one process): {threads}; {rounds} interleaved rounds")
    start = time.perf_counter()
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in ("fb100_cornell5", "rmat"):
            results[name] = bench_graph(name, args.quick, rounds, Path(tmp))
    out = write_results(
        result_name("sampling", args.quick),
        {
            "fanouts": FANOUTS,
            "feature_dim": FEATURE_DIM,
            "quick": args.quick,
            "rounds": rounds,
            "warmup_batches_per_block": WARMUP,
            "threads": {"gnnserve": threads, "pyg": threads},
            "statistic": "per round: median ms per batch over a block; published: median over "
            "rounds with min-max; speedup = median over rounds of PyG ms / gnnserve ms",
            "wall_s": round(time.perf_counter() - start, 1),
            "results": results,
        },
    )
    plot(results, rounds, out.with_suffix(".png"))
    print(f"wrote {out} and {out.with_suffix('.png')} ({time.perf_counter() - start:.0f} s)")
    targets = Targets()
    for name, rows in results.items():
        by_bs = {r["batch_size"]: r["speedup"]["median"] for r in rows}
        targets.check(f"{name}_speedup_batch1_median", by_bs[1], 5.0)
        targets.check(f"{name}_speedup_batch1024_median", by_bs[1024], 10.0)
    targets.print()


if __name__ == "__main__":
    main()
