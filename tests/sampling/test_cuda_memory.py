"""numba-cuda's allocations through torch's caching allocator (the EMM plug-in): in force in a
fresh process on a GPU, with the same draws as the CPU sampler; never under the simulator."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from gnnserve.sampling.cuda_memory import use_torch_allocator

_CHECK = """
import sys, numpy as np, torch
from gnnserve.graph import open_graph_store
from gnnserve.sampling.cuda_memory import use_torch_allocator
from gnnserve.sampling.cuda_sampler import CudaSampler
from gnnserve.sampling.sampler import NeighborSampler
assert use_torch_allocator(), "the plug-in is not in force"
graph = open_graph_store(sys.argv[1])
before = torch.cuda.memory_allocated()
sampler = CudaSampler(graph, [5, 3])  # the adjacency: numba device arrays
assert torch.cuda.memory_allocated() > before, "numba's arrays are not torch's"
seeds = np.arange(0, graph.num_nodes, 7)
for key in (1, 2):
    got, want = sampler.sample_valid(seeds, key), NeighborSampler(graph, [5, 3]).sample(seeds, key)
    assert np.array_equal(got.input_nodes, want.input_nodes)
    assert all(torch.equal(a.edge_index, b.edge_index) for a, b in zip(got.blocks, want.blocks))
print("ok")
"""


def test_not_in_force_without_a_gpu() -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    assert use_torch_allocator() is False


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_samples_through_torchs_allocator_equal_the_cpu(small_store: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", _CHECK, str(small_store)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-3000:]
