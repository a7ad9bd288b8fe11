"""Sample + gather + model per batch, end to end to the answers on the host (issue 27 part 6):
the GPU pipeline that stays on the GPU against our own CPU path and PyG.

Arms (each where this machine has it; the same seed batches for every arm, interleaved rounds):
- ``cpu``: the served CPU throughput path: ``parallel`` sampler, features from the in-memory
  store, the model on the CPU (torch's threads).
- ``cuda``: :class:`gnnserve.engine.device_pipeline.DevicePipeline`: the numba-cuda sampler,
  every feature row in GPU memory, the model on the GPU, one copy of the logits to the host.
- ``cuda-torch``: the previous GPU sampler (``DeviceSampler``, torch ops) with its sample copied
  to the host per hop, features gathered on the GPU and the model on the GPU.
- ``pyg_<device>``: PyG's NeighborLoader (pyg-lib, the sampler PyG users get) and PyG's own
  GraphSAGE of the same sizes, the batch moved to the device as a PyG user would.
Kernel launches per batch of the ``cuda`` arm are recorded beside the times.

``python bench/gpu_pipeline.py [--quick] [--rounds N]``: fb100_cornell5 (128-dim features) and
R-MAT 2^20 / 10M edges (64-dim), GraphSAGE 2x256, fanouts 25,10, batches of 64 and 1,024 seeds;
writes ``results/gpu_pipeline_<gpu|cpu>.json``. On a lent GPU machine run ``bench/gpu_device.sh``.
"""

from __future__ import annotations

import argparse
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from common import (
    fb100_sage,
    interleaved_rounds,
    median_range,
    ratios,
    strict,
    time_calls,
    write_results,
)
from gnnserve.engine.device_pipeline import DeviceFeatures, DevicePipeline
from gnnserve.features import open_feature_store
from gnnserve.graph import open_graph_store
from gnnserve.models.checkpoint import load_checkpoint, save_checkpoint
from gnnserve.models.zoo import GNN, ModelConfig
from gnnserve.sampling.device import DeviceSampler
from gnnserve.sampling.paths import build_path

WARMUP = 3
BATCH_SIZES = {1: 40, 64: 40, 1024: 12}  # seeds per batch: timed batches per round
FANOUTS = [25, 10]


def cpu_step(store: Path, ckpt: Path) -> Callable[[np.ndarray], object]:
    """The served CPU path: parallel sampler, in-memory gather, model on the CPU."""
    graph, features = open_graph_store(store), open_feature_store(store)
    sampler = build_path("parallel", graph, FANOUTS)
    model = load_checkpoint(ckpt).model.eval()

    @torch.inference_mode()
    def step(seeds: np.ndarray) -> object:
        sample = sampler.sample_valid(seeds)
        ids = sample.input_nodes
        x, degree = features.get_valid(ids), torch.from_numpy(graph.gcn_degree(ids))
        logits, _ = model.forward_blocks(x, sample.blocks, degree)
        return logits[torch.from_numpy(sample.seed_rows)]

    return step


def cuda_step(store: Path, ckpt: Path, launches: list[int]) -> Callable[[np.ndarray], object]:
    """DevicePipeline with every row in GPU memory; records each batch's kernel launches."""
    graph, features = open_graph_store(store), open_feature_store(store)
    rows = DeviceFeatures(features, np.arange(graph.num_nodes), torch.device("cuda"))
    pipeline = DevicePipeline(load_checkpoint(ckpt).model, graph, rows, FANOUTS)
    sample_on_device = pipeline.sampler.sample_on_device

    def counted(seeds: np.ndarray, key: int | None = None):  # type: ignore[no-untyped-def]
        sample = sample_on_device(seeds, key)
        launches.append(sample.launches)
        return sample

    pipeline.sampler.sample_on_device = counted  # type: ignore[method-assign]
    return lambda seeds: pipeline.predict(seeds)


def cuda_torch_step(store: Path, ckpt: Path) -> Callable[[np.ndarray], object]:
    """The torch device sampler on the GPU, GPU-held features, the model on the GPU."""
    graph, features = open_graph_store(store), open_feature_store(store)
    sampler = DeviceSampler(graph, FANOUTS, device="cuda")
    table = features.get_valid(np.arange(graph.num_nodes)).cuda()
    degree = torch.from_numpy(graph.gcn_degree(np.arange(graph.num_nodes))).cuda()
    model = load_checkpoint(ckpt).model.cuda().eval()

    @torch.inference_mode()
    def step(seeds: np.ndarray) -> object:
        sample = sampler.sample_valid(seeds)
        ids = torch.from_numpy(sample.input_nodes).cuda()
        blocks = [type(b)(b.edge_index.cuda(), b.n_src, b.n_dst) for b in sample.blocks]
        logits, _ = model.forward_blocks(table[ids], blocks, degree[ids])
        return logits[torch.from_numpy(sample.seed_rows).cuda()].cpu()

    return step


def pyg_step(store: Path, device: str, batches: list[np.ndarray]) -> Callable[[np.ndarray], object]:
    """NeighborLoader (pyg-lib) over ``batches`` and PyG's GraphSAGE 2x256 on ``device``."""
    from torch_geometric.data import Data
    from torch_geometric.loader import NeighborLoader
    from torch_geometric.nn.models import GraphSAGE

    graph, features = open_graph_store(store), open_feature_store(store)
    indptr, indices = graph.csr()
    dst = np.repeat(np.arange(graph.num_nodes), np.diff(indptr))
    edge_index = torch.from_numpy(np.stack([np.asarray(indices, np.int64), dst]))
    data = Data(x=features.get_valid(np.arange(graph.num_nodes)), edge_index=edge_index)
    loader = NeighborLoader(
        data, num_neighbors=FANOUTS, batch_size=len(batches[0]),
        input_nodes=torch.from_numpy(np.concatenate(batches)), shuffle=False,
    )  # fmt: skip
    model = GraphSAGE(features.dim, 256, num_layers=2, out_channels=2).to(device).eval()
    batches_iter = iter(loader)

    @torch.inference_mode()
    def step(_seeds: np.ndarray) -> object:
        batch = next(batches_iter).to(device)
        return model(batch.x, batch.edge_index)[: batch.batch_size].cpu()

    return step


def _pyg_sampler_present() -> bool:
    try:
        import pyg_lib  # noqa: F401
    except ImportError:
        return False
    return True


def block_ms(step: Callable[[np.ndarray], object], batches: list[np.ndarray]) -> float:
    """Median ms per batch over ``batches[WARMUP:]`` after the first WARMUP untimed."""
    it = iter(batches)

    def call(_i: int) -> object:
        out = step(next(it))
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        return out

    return float(np.median(time_calls(call, len(batches) - WARMUP, WARMUP)))


def run_graph(store: Path, ckpt: Path, rounds: int, quick: bool) -> dict[str, Any]:
    """Per batch size: median ms per batch of every arm over ``rounds`` and the ratios the
    issue's targets name (PyG / cuda and cpu / cuda, same rounds)."""
    num_nodes = open_graph_store(store).num_nodes
    rng = np.random.default_rng(7)
    gpu, pyg = torch.cuda.is_available(), _pyg_sampler_present()
    out: dict[str, Any] = {"pyg_sampler": "pyg-lib" if pyg else None}
    for size, timed in BATCH_SIZES.items():
        timed = max(4, timed // 4) if quick else timed
        batches = [rng.choice(num_nodes, size, replace=False) for _ in range(WARMUP + timed)]
        launches: list[int] = []
        makers: dict[str, Callable[[], Callable[[np.ndarray], object]]] = {
            "cpu": lambda: cpu_step(store, ckpt)
        }
        if gpu:
            makers["cuda"] = lambda counts=launches: cuda_step(store, ckpt, counts)
            makers["cuda-torch"] = lambda: cuda_torch_step(store, ckpt)
        for device in (["cpu", "cuda"] if gpu else ["cpu"]) if pyg else []:
            makers[f"pyg_{device}"] = lambda d=device, b=batches: pyg_step(store, d, b)
        arms = {name: lambda m=make, b=batches: block_ms(m(), b) for name, make in makers.items()}

        def show(r: int, v: dict[str, float], size: int = size) -> None:
            cells = "  ".join(f"{k} {ms:.2f}" for k, ms in v.items())
            print(f"[gpu] {size} seeds round {r + 1}: ms {cells}", flush=True)

        times = interleaved_rounds(arms, rounds, show)
        row: dict[str, Any] = {k: median_range(v) for k, v in times.items()}
        if "cuda" in times:
            row["cuda_launches_per_batch"] = median_range(launches)
            row["cpu_over_cuda"] = median_range(ratios(times["cpu"], times["cuda"]))
            if "pyg_cuda" in times:
                row["pyg_cuda_over_cuda"] = median_range(ratios(times["pyg_cuda"], times["cuda"]))
        if "pyg_cpu" in times:
            row["pyg_cpu_over_cpu"] = median_range(ratios(times["pyg_cpu"], times["cpu"]))
        out[str(size)] = row
    return out


def _rmat_sage(workdir: Path) -> tuple[Path, Path]:
    from gnnserve.data import generators
    from gnnserve.data.writer import write_store

    write_store(generators.rmat(num_nodes=2**20, num_edges=10_000_000, feature_dim=64), workdir)
    torch.manual_seed(0)
    config = ModelConfig(arch="sage", in_dim=64, hidden_dim=256, out_dim=2, num_layers=2)
    save_checkpoint(workdir / "sage", GNN(config), config, {"note": "gpu pipeline"})
    return workdir, workdir / "sage"


def main() -> None:
    """Both graphs, every arm this machine has; the JSON under results/."""
    parser = argparse.ArgumentParser(description=(main.__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fb100 only, fewer batches")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    out: dict[str, Any] = {"gpu": gpu, "cpu_threads": torch.get_num_threads(), "fanouts": FANOUTS}
    with tempfile.TemporaryDirectory() as tmp:
        store, ckpt, _ = fb100_sage(Path(tmp) / "fb", "gpu pipeline")
        graphs = {"fb100_cornell5": (store, ckpt)}
        if not args.quick:
            graphs["rmat"] = _rmat_sage(Path(tmp) / "rmat")
        for name, (store, ckpt) in graphs.items():
            print(f"[gpu] {name} ...", flush=True)
            out[name] = run_graph(store, ckpt, args.rounds, args.quick)
    tag = ("gpu" if gpu else "cpu") + ("_quick" if args.quick else "")
    print(f"wrote {write_results(f'gpu_pipeline_{tag}', strict(out))}")


if __name__ == "__main__":
    main()
