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

from common import fmt_range, interleaved_rounds, median_range, pyg_backend, ratios, time_calls
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


def run_devices(store: Path, fanouts: list[int], rounds: int, quick: bool) -> dict[str, Any]:
    """Per batch size: median ms per batch of every path and of PyG, interleaved over
    ``rounds``; each path's speedup over PyG (same device) as the median of per-round ratios."""
    paths = available_paths()
    num_nodes = open_graph_store(store).num_nodes
    rng = np.random.default_rng(7)
    out: dict[str, Any] = {"paths": paths, "batch_sizes": {}}
    for size, timed in BATCH_SIZES.items():
        timed = max(5, timed // 5) if quick else timed
        batches = [rng.choice(num_nodes, size, replace=False) for _ in range(WARMUP + timed)]
        arms: dict[str, Callable[[], float]] = {}
        for name in paths:
            step = path_step(name, store, fanouts)
            arms[name] = lambda s=step, b=batches: block_ms(s, b)
        for device in ["cpu"] + (["cuda"] if "cuda" in paths else []):
            arms[f"pyg_{device}"] = lambda d=device, b=batches: block_ms(
                pyg_step(store, fanouts, b, d, "pyg-lib"), b
            )
        arms["pyg_cpu_torch_sparse"] = lambda b=batches: block_ms(
            pyg_step(store, fanouts, b, "cpu", "torch-sparse"), b
        )

        def show(r: int, v: dict[str, float], size: int = size) -> None:
            cells = "  ".join(f"{k} {ms:.2f}" for k, ms in v.items())
            print(f"[quiver] devices {size} seeds round {r + 1}: ms {cells}", flush=True)

        times = interleaved_rounds(arms, rounds, show)
        row: dict[str, Any] = {k: median_range(v) for k, v in times.items()}
        for name in paths:
            base = times["pyg_cuda" if name == "cuda" else "pyg_cpu"]
            row[f"{name}_speedup_over_pyg"] = median_range(ratios(base, times[name]))
            if name != "cuda":
                fallback = times["pyg_cpu_torch_sparse"]
                row[f"{name}_speedup_over_pyg_torch_sparse"] = median_range(
                    ratios(fallback, times[name])
                )
            shown = fmt_range(row[f"{name}_speedup_over_pyg"], ".1f", "x")
            print(f"[quiver]   {size} seeds: {name} over PyG {shown}", flush=True)
        out["batch_sizes"][str(size)] = row
    return out
