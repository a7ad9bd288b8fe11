"""The ``devices`` section of bench/quiver.py: sample + feature gather per batch on every sampling
path this machine has (inline, parallel, torch; cuda with a GPU) against PyG's NeighborLoader on
pyg-lib (the sampler PyG users get; its torch-sparse fallback runs beside it, labelled).

Each arm does what a batch needs before the model: the sampled blocks and the gathered input
features. gnnserve's CPU paths gather from the in-memory store; the cuda path gathers on the GPU
from features held in GPU memory (the tiered store's ``gpu`` tier), and PyG's batch is moved to
the GPU there as a PyG user would (``batch.to("cuda")``). Every arm gets the same seed batches in
the same order and ``WARMUP`` untimed batches; arms are interleaved per round (A B B A).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from common import (
    PYG_BACKENDS,
    fmt_range,
    interleaved_rounds,
    median_range,
    pyg_backend,
    ratios,
    time_calls,
)
from gnnserve.features import open_feature_store
from gnnserve.graph import open_graph_store
from gnnserve.sampling.metrics import psgs
from gnnserve.sampling.paths import available_paths, build_path

WARMUP = 3
BATCH_SIZES = {64: 60, 1024: 15}  # seeds per batch: timed batches per block


def path_step(name: str, store: Path, fanouts: list[int]) -> Callable[[np.ndarray], object]:
    """One batch on path ``name``: sample, then gather the input features (on the GPU for cuda)."""
    graph = open_graph_store(store)
    sampler = build_path(name, graph, fanouts, cost=psgs(graph, fanouts))
    features = open_feature_store(store)
    if name == "cuda":
        on_gpu = features.get_valid(np.arange(graph.num_nodes)).to("cuda")

        def gpu_step(seeds: np.ndarray) -> object:
            sg = sampler.sample_valid(seeds)
            x = on_gpu[torch.from_numpy(sg.input_nodes).to("cuda")]
            torch.cuda.synchronize()
            return sg, x

        return gpu_step

    def step(seeds: np.ndarray) -> object:
        sg = sampler.sample_valid(seeds)
        return sg, features.get_valid(sg.input_nodes)

    return step


def pyg_step(
    store: Path, fanouts: list[int], batches: list[np.ndarray], device: str, backend: str
) -> Callable:
    """Next batch of a NeighborLoader over ``batches`` (features gathered), moved to ``device``,
    sampled by PyG's ``backend`` (pyg-lib or torch-sparse)."""
    from torch_geometric.data import Data
    from torch_geometric.loader import NeighborLoader

    graph, features = open_graph_store(store), open_feature_store(store)
    indptr, indices = graph.csr()
    dst = np.repeat(np.arange(graph.num_nodes), np.diff(indptr))
    edge_index = torch.from_numpy(np.stack([np.asarray(indices, np.int64), dst]))
    x = features.get_valid(np.arange(graph.num_nodes))
    data = Data(x=x, edge_index=edge_index, num_nodes=graph.num_nodes)
    loader = NeighborLoader(
        data,
        num_neighbors=fanouts,
        batch_size=len(batches[0]),
        input_nodes=torch.from_numpy(np.concatenate(batches)),
        shuffle=False,
    )
    it = iter(loader)

    def step(_seeds: np.ndarray) -> object:
        with pyg_backend(backend):
            batch = next(it)
        if device == "cuda":
            batch = batch.to("cuda")
            torch.cuda.synchronize()
        return batch

    return step


def block_ms(step: Callable[[np.ndarray], object], batches: list[np.ndarray]) -> float:
    """Median ms per batch over ``batches[WARMUP:]`` after untimed ``batches[:WARMUP]``."""
    it = iter(batches)
    return float(np.median(time_calls(lambda _i: step(next(it)), len(batches) - WARMUP, WARMUP)))


def _importable(module: str) -> bool:
    try:
        __import__(module)
    except ImportError:
        return False
    return True


def run_devices(store: Path, fanouts: list[int], rounds: int, quick: bool) -> dict[str, Any]:
    """Per batch size: median ms per batch of every path and of PyG, interleaved over
    ``rounds``; each path's speedup over PyG (same device) as the median of per-round ratios."""
    paths = available_paths()
    num_nodes = open_graph_store(store).num_nodes
    rng = np.random.default_rng(7)
    backends = [b for b in PYG_BACKENDS if _importable(b.replace("-", "_"))]
    out: dict[str, Any] = {"paths": paths, "pyg_backends": backends, "batch_sizes": {}}
    if not backends:
        print("[quiver] no PyG sampler here (pyg-lib, torch-sparse): gnnserve's paths only")
    for size, timed in BATCH_SIZES.items():
        timed = max(5, timed // 5) if quick else timed
        batches = [rng.choice(num_nodes, size, replace=False) for _ in range(WARMUP + timed)]
        arms: dict[str, Callable[[], float]] = {}
        for name in paths:
            step = path_step(name, store, fanouts)
            arms[name] = lambda s=step, b=batches: block_ms(s, b)
        for device in ["cpu"] + (["cuda"] if "cuda" in paths else []):
            if "pyg-lib" in backends:
                arms[f"pyg_{device}"] = lambda d=device, b=batches: block_ms(
                    pyg_step(store, fanouts, b, d, "pyg-lib"), b
                )
        if "torch-sparse" in backends:
            arms["pyg_cpu_torch_sparse"] = lambda b=batches: block_ms(
                pyg_step(store, fanouts, b, "cpu", "torch-sparse"), b
            )

        def show(r: int, v: dict[str, float], size: int = size) -> None:
            cells = "  ".join(f"{k} {ms:.2f}" for k, ms in v.items())
            print(f"[quiver] devices {size} seeds round {r + 1}: ms {cells}", flush=True)

        times = interleaved_rounds(arms, rounds, show)
        row: dict[str, Any] = {k: median_range(v) for k, v in times.items()}
        for name in paths:
            base = times.get("pyg_cuda" if name == "cuda" else "pyg_cpu")
            if base is None:
                continue
            row[f"{name}_speedup_over_pyg"] = median_range(ratios(base, times[name]))
            if name != "cuda" and "pyg_cpu_torch_sparse" in times:
                fallback = times["pyg_cpu_torch_sparse"]
                row[f"{name}_speedup_over_pyg_torch_sparse"] = median_range(
                    ratios(fallback, times[name])
                )
            shown = fmt_range(row[f"{name}_speedup_over_pyg"], ".1f", "x")
            print(f"[quiver]   {size} seeds: {name} over PyG {shown}", flush=True)
        out["batch_sizes"][str(size)] = row
    return out


def main() -> None:
    """``python bench/quiver_devices.py [--quick] [--rounds N]``: the devices section alone,
    without the rest of bench/quiver.py (which needs Ray), for a machine lent with a GPU:
    fb100 and R-MAT 2^20 / 10M edges; writes ``results/quiver_devices_<gpu or cpu>.json``."""
    import argparse
    import tempfile

    from common import fb100_sage, strict, write_results
    from gnnserve.data import generators
    from gnnserve.data.writer import write_store

    parser = argparse.ArgumentParser(description=(main.__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    out: dict[str, Any] = {"gpu": gpu, "cpu_threads": torch.get_num_threads()}
    with tempfile.TemporaryDirectory() as tmp:
        stores = {"fb100_cornell5": fb100_sage(Path(tmp) / "fb", "devices")[0]}
        rmat = generators.rmat(num_nodes=2**20, num_edges=10_000_000, feature_dim=64)
        write_store(rmat, Path(tmp) / "rmat")
        stores["rmat"] = Path(tmp) / "rmat"
        for name, store in stores.items():
            print(f"[quiver] devices {name} ...", flush=True)
            out[name] = run_devices(store, [25, 10], args.rounds, args.quick)
    tag = "gpu" if gpu else "cpu"
    path = write_results(f"quiver_devices_{tag}{'_quick' if args.quick else ''}", strict(out))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
