"""The device sampler: its int64 splitmix64 equals the numba kernels' uint64 one, and it draws
exactly the sample the numba sampler draws (on the CPU here, on CUDA where a GPU is present)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from gnnserve.dynamic.store import DynamicStore
from gnnserve.errors import InvalidInputError
from gnnserve.features import open_feature_store
from gnnserve.graph import open_graph_store
from gnnserve.sampling import kernels
from gnnserve.sampling.device import DeviceSampler, mix, row_keys, unsigned_mod
from gnnserve.sampling.sampler import NeighborSampler
from tests.sampling.checks import check_sample, edge_set

MASK = (1 << 64) - 1


def _py_mix(z: int) -> int:
    """splitmix64's finaliser in Python integers (the reference)."""
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


def _signed(v: int) -> int:
    return v - (1 << 64) if v >= 1 << 63 else v


def test_int64_mix_and_keys_equal_the_uint64_reference() -> None:
    rng = np.random.default_rng(0)
    values = [int(v) for v in rng.integers(0, 2**63, 500, dtype=np.uint64)] + [0, MASK, 1 << 63]
    got = mix(torch.tensor([_signed(v) for v in values], dtype=torch.int64)).tolist()
    assert [g & MASK for g in got] == [_py_mix(v) for v in values]
    nodes = rng.integers(0, 2**40, 200)
    seed = 0xDEADBEEFCAFEF00D
    keys = row_keys(seed, 1, torch.from_numpy(nodes)).tolist()
    want = [int(kernels.row_key(np.uint64(seed), 1, int(v))) for v in nodes]
    assert [k & MASK for k in keys] == want


def test_unsigned_mod_equals_python_modulo() -> None:
    rng = np.random.default_rng(1)
    x = [int(v) for v in rng.integers(0, 2**64 - 1, 2000, dtype=np.uint64, endpoint=True)]
    m = rng.integers(1, 2**31 - 1, 2000)
    got = unsigned_mod(torch.tensor([_signed(v) for v in x]), torch.from_numpy(m)).tolist()
    assert got == [v % int(k) for v, k in zip(x, m, strict=True)]


def _equal(a, b) -> None:  # type: ignore[no-untyped-def]
    np.testing.assert_array_equal(a.nodes, b.nodes)
    np.testing.assert_array_equal(a.seed_rows, b.seed_rows)
    assert a.num_seeds == b.num_seeds and len(a.blocks) == len(b.blocks)
    for x, y in zip(a.blocks, b.blocks, strict=True):
        assert (x.n_src, x.n_dst) == (y.n_src, y.n_dst)
        assert torch.equal(x.edge_index, y.edge_index.cpu())


def _same_samples(store: Path, device: str) -> None:
    graph = open_graph_store(store)
    deg = np.diff(graph.csr()[0])
    edges = edge_set(graph)
    rng = np.random.default_rng(2)
    for fanouts in ([10, 5], [25, 10], [-1, 3], [3, -1, 2]):
        numba_sampler = NeighborSampler(graph, fanouts)
        device_sampler = DeviceSampler(graph, fanouts, device=device)
        for n_seeds in (1, 7, 300):
            seeds = rng.integers(0, graph.num_nodes, n_seeds)  # duplicates included
            key = int(rng.integers(0, 2**62))
            want = numba_sampler.sample(seeds, rng_seed=key)
            got = device_sampler.sample(seeds, rng_seed=key)
            _equal(want, got)
            check_sample(got, seeds, fanouts, edges, deg)


def test_device_sampler_draws_the_numba_sample_on_the_cpu(small_store: Path) -> None:
    _same_samples(small_store, "cpu")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_device_sampler_draws_the_numba_sample_on_cuda(small_store: Path) -> None:
    _same_samples(small_store, "cuda")


def test_calls_draw_anew_and_leave_the_id_map_clean(small_store: Path) -> None:
    graph = open_graph_store(small_store)
    sampler = DeviceSampler(graph, [5, 5], seed=3)
    seeds = np.arange(50, dtype=np.int64)
    first, second = sampler.sample(seeds), sampler.sample(seeds)
    assert not np.array_equal(first.nodes, second.nodes)  # a new key per call
    reference = NeighborSampler(graph, [5, 5], seed=3)  # the same key stream
    _equal(reference.sample(seeds), first)
    _equal(reference.sample(seeds), second)
    local_id = sampler._maps.get_nowait()
    assert bool((local_id == -1).all()), "the id map keeps entries of a finished sample"


def test_bad_seeds_and_a_changing_graph_are_refused(small_store: Path, tmp_path: Path) -> None:
    sampler = DeviceSampler(open_graph_store(small_store), [5])
    with pytest.raises(InvalidInputError, match="seeds"):
        sampler.sample(np.array([0, 2000]))
    with pytest.raises(InvalidInputError, match="seeds must not be empty"):
        sampler.sample(np.array([], dtype=np.int64))
    graph, features = open_graph_store(small_store), open_feature_store(small_store)
    dynamic = DynamicStore(graph, features, tmp_path / "log", fsync="never")
    with pytest.raises(InvalidInputError, match="does not change") as info:
        DeviceSampler(dynamic.graph, [5])
    assert info.value.field == "graph"
