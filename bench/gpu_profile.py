"""Where a GPU batch's time goes: per stage, per Python call and per CUDA kernel (issue 46).

For the ``cuda`` arm of ``gpu_pipeline.py`` (DevicePipeline: numba-cuda sampler, every feature
row on the GPU, the model there) on R-MAT 2^20 / 10M edges, 64-dim features, GraphSAGE 2x256,
fanouts [25, 10], batches of 64 and 1,024 seeds, prints:

- the median ms of each stage (sample, gather, model, answers to the host), each synchronised;
- the launch cost of an empty numba-cuda kernel with the sampler's argument count, and the cost
  of one small ``cuda.device_array`` (numba's allocator or torch's caching allocator);
- cProfile's top calls of ``sample_on_device`` and torch.profiler's top ops of a whole batch.

``python bench/gpu_profile.py [--allocator numba|torch]`` (one allocator per process: numba takes
its memory manager when its CUDA context starts). Needs a GPU.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from numba import cuda

from gnnserve.engine.device_pipeline import DeviceFeatures, DevicePipeline
from gnnserve.features import open_feature_store
from gnnserve.graph import open_graph_store
from gnnserve.graph.base import GraphStore
from gnnserve.models.checkpoint import load_checkpoint
from gnnserve.sampling.cuda_memory import use_torch_allocator
from gnnserve.sampling.sampler import NeighborSampler
from gpu_pipeline import FANOUTS, _rmat_sage


def _median_ms(call: Callable[[], object], reps: int = 20, warmup: int = 3) -> float:
    times = []
    for i in range(warmup + reps):
        start = time.perf_counter()
        call()
        torch.cuda.synchronize()
        if i >= warmup:
            times.append((time.perf_counter() - start) * 1e3)
    return float(np.median(times))


@cuda.jit
def _empty(a, b, c, d, e, f, g, h, i):  # type: ignore[no-untyped-def]
    pass


def launch_and_alloc_us() -> None:
    """Microseconds per empty launch (9 device-array args) and per small device array."""
    arrays = [cuda.device_array(1024, dtype=np.int64) for _ in range(8)]
    key = np.uint64(1)
    _empty[4, 256](*arrays, key)
    torch.cuda.synchronize()
    n = 2000
    start = time.perf_counter()
    for _ in range(n):
        _empty[4, 256](*arrays, key)
    cuda.synchronize()
    launch = (time.perf_counter() - start) / n * 1e6
    start = time.perf_counter()
    for k in range(n):
        cuda.device_array(1000 + k % 7, dtype=np.int64)
    cuda.synchronize()
    alloc = (time.perf_counter() - start) / n * 1e6
    print(f"[profile] empty launch {launch:.1f} us, device_array {alloc:.1f} us", flush=True)


def stages(pipeline: DevicePipeline, seeds: np.ndarray) -> None:
    """Median synchronised ms of each stage of one batch."""
    sample = pipeline.sampler.sample_on_device(seeds)
    ids = sample.nodes[: sample.blocks[0].n_src]
    x, degree = pipeline.gather(sample)

    @torch.inference_mode()
    def model() -> object:
        return pipeline.model.forward_blocks(x, sample.blocks, degree)

    logits, _ = model()
    cells = {
        "sample": _median_ms(lambda: pipeline.sampler.sample_on_device(seeds)),
        "gather": _median_ms(lambda: pipeline.features.gather(ids)),
        "model": _median_ms(model),
        "to_host": _median_ms(lambda: logits[: len(seeds)].cpu()),
        "whole": _median_ms(lambda: pipeline.predict(seeds)),
    }
    text = "  ".join(f"{k} {v:.2f}" for k, v in cells.items())
    edges = sum(int(b.edge_index.shape[1]) for b in sample.blocks)
    print(f"[profile] {len(seeds)} seeds ({edges} edges) ms: {text}", flush=True)


def python_calls(pipeline: DevicePipeline, seeds: np.ndarray) -> None:
    """cProfile's top 18 calls (own time) over 10 samples."""
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(10):
        pipeline.sampler.sample_on_device(seeds)
    torch.cuda.synchronize()
    profile.disable()
    out = io.StringIO()
    pstats.Stats(profile, stream=out).sort_stats("tottime").print_stats(18)
    print(out.getvalue()[-4000:], flush=True)


def torch_ops(pipeline: DevicePipeline, seeds: np.ndarray) -> None:
    """torch.profiler's top 15 ops (CUDA time) over 5 whole batches."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            pipeline.predict(seeds)
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=15), flush=True)


def same_draws(pipeline: DevicePipeline, graph: GraphStore, seeds: np.ndarray) -> None:
    """Whether the device sample (under this allocator) equals the numba CPU sampler's."""
    got = pipeline.sampler.sample_valid(seeds, 5)
    want = NeighborSampler(graph, FANOUTS).sample(seeds, 5)
    same = np.array_equal(got.input_nodes, want.input_nodes) and all(
        torch.equal(a.edge_index, b.edge_index)
        for a, b in zip(got.blocks, want.blocks, strict=True)
    )
    print(f"[profile] device sample equals the CPU sampler's: {same}", flush=True)


def main() -> None:
    """Every profile of the module doc for one allocator."""
    parser = argparse.ArgumentParser(description=(main.__doc__ or "").splitlines()[0])
    parser.add_argument("--allocator", choices=["numba", "torch"], default="numba")
    args = parser.parse_args()
    if args.allocator == "torch":
        print(f"[profile] torch allocator in force: {use_torch_allocator()}", flush=True)
    launch_and_alloc_us()
    with tempfile.TemporaryDirectory() as tmp:
        store, ckpt = _rmat_sage(Path(tmp))
        graph, features = open_graph_store(store), open_feature_store(store)
        rows = DeviceFeatures(features, np.arange(graph.num_nodes), torch.device("cuda"))
        pipeline = DevicePipeline(load_checkpoint(ckpt).model, graph, rows, FANOUTS)
        rng = np.random.default_rng(3)
        same_draws(pipeline, graph, rng.choice(graph.num_nodes, 1024, replace=False))
        for size in (64, 1024):
            seeds = rng.choice(graph.num_nodes, size, replace=False)
            stages(pipeline, seeds)
        python_calls(pipeline, seeds)
        torch_ops(pipeline, seeds)


if __name__ == "__main__":
    main()
