"""The inference function's memory rules (FaaS-GNN §4.3), in process: the cache fills free
memory, a prediction that leaves no room evicts, a misprediction that would overflow the
capacity clears the cache and runs the request again (with the same answer)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from gnnserve.data.writer import GraphData, write_store
from gnnserve.deploy.faas.function import FunctionSpec, InferenceFunction, SampleFunction
from gnnserve.models.memory import MemoryPredictor
from tests.conftest import make_checkpoint, random_simple_graph

MB = 1 << 20


def _setup(tmp_path: Path) -> tuple[Path, Path]:
    n = 6000
    x = np.random.default_rng(0).standard_normal((n, 256), dtype=np.float32)
    store = tmp_path / "store"
    write_store(GraphData("g", n, random_simple_graph(n, 120_000, 0), x), store)
    return store, make_checkpoint(store, tmp_path / "ckpt", arch="gcn")


def _predictor(ckpt: Path, bytes_: float) -> None:
    """A predictor that answers about ``bytes_`` for every request (trained on a constant)."""
    X = np.random.default_rng(0).uniform(1, 5000, (64, 6))
    MemoryPredictor(2).fit(X, np.full(64, bytes_), epochs=300).save(ckpt)


def _usage(base: int, cache: list[InferenceFunction]) -> int:
    """Instance memory as a capacity counts it: a fixed runtime plus what the cache holds."""
    return base + (cache[0].cache.nbytes if cache and cache[0].cache is not None else 0)


def test_cache_fills_then_a_misprediction_clears_it_and_reruns(tmp_path: Path) -> None:
    store, ckpt = _setup(tmp_path)
    _predictor(ckpt, 1.0)  # predicts ~nothing: every request is a misprediction
    spec = FunctionSpec(store.as_uri(), str(ckpt), (-1, 10), memory_mb=64)
    sampler = SampleFunction(spec)
    holder: list[InferenceFunction] = []
    fn = InferenceFunction(spec, usage=lambda: _usage(44 * MB, holder))
    holder.append(fn)
    assert fn.cache is not None
    small = fn.infer(sampler.sample(np.array([1]), rng_seed=0))  # a few hundred KB
    assert not small.reran and len(fn.cache) > 0
    # a request whose measured peak (tens of MB) would, with the cache kept, pass 64 MB
    big_request = sampler.sample(np.arange(0, 6000, 3), rng_seed=1)
    big = fn.infer(big_request)
    assert big.reran and fn.cache.stats.clears == 1
    assert big.measured_bytes > big.predicted_bytes
    # the rerun answers exactly what a fresh instance without a cache answers
    plain = InferenceFunction(FunctionSpec(store.as_uri(), str(ckpt), (-1, 10), cache=False))
    torch.testing.assert_close(big.logits, plain.infer(big_request).logits)


def test_a_large_prediction_evicts_and_an_exact_one_does_not_rerun(tmp_path: Path) -> None:
    store, ckpt = _setup(tmp_path)
    _predictor(ckpt, 24 * MB)
    spec = FunctionSpec(store.as_uri(), str(ckpt), (-1, 10), memory_mb=64)
    sampler = SampleFunction(spec)
    holder: list[InferenceFunction] = []
    fn = InferenceFunction(spec, usage=lambda: _usage(30 * MB, holder))
    holder.append(fn)
    assert fn.cache is not None
    for i in range(6):
        out = fn.infer(sampler.sample(np.arange(i * 500, i * 500 + 12), rng_seed=i))
        assert out.misses * fn.cache.entry_bytes < 4 * MB  # its own rows fit the budget
        assert not out.reran  # predicted 24 MB >= measured: no misprediction
        # budget: 90% of 64 MB - 30 MB runtime - the prediction (about 24 MB) for the cache
        assert fn.cache.nbytes <= int(64 * MB * 0.9) - 30 * MB - out.predicted_bytes
    assert fn.cache.stats.evictions > 0


_FIRST_REQUEST = """
import sys
import numpy as np
from gnnserve.deploy.faas.function import FunctionSpec, InferenceFunction, SampleFunction
spec = FunctionSpec(sys.argv[1], sys.argv[2], (10, 10), cache=sys.argv[3] == "cache")
sampler, fn = SampleFunction(spec), InferenceFunction(spec)
peaks = [fn.infer(sampler.sample(np.array([5 + i]), rng_seed=0)).measured_bytes for i in range(4)]
print(*peaks)
"""


def test_the_cold_start_warms_up_so_the_first_request_peaks_like_the_next(tmp_path: Path) -> None:
    """In a fresh process the first forward costs several MB of one-time set-up; the warm-up in
    the cold start takes it, so the first request's measured peak is not a misprediction."""
    import subprocess
    import sys

    store, _ = _setup(tmp_path)
    for arch, cache in (("gcn", "cache"), ("gat", "none"), ("sage", "none")):
        ckpt = make_checkpoint(store, tmp_path / f"ckpt_{arch}", arch=arch)
        run = subprocess.run(
            [sys.executable, "-c", _FIRST_REQUEST, store.as_uri(), str(ckpt), cache],
            capture_output=True,
            text=True,
            check=True,
        )
        first, *later = (int(v) for v in run.stdout.split())
        assert first <= max(later) + MB, (arch, cache, first, later)


def test_synthetic_subgraph_has_the_fanout_shape() -> None:
    from gnnserve.deploy.faas.function import synthetic_subgraph

    sub = synthetic_subgraph((10, 5))
    assert [(b.n_src, b.n_dst) for b in sub.blocks] == [(61, 11), (11, 1)]
    for block in sub.blocks:
        src, dst = block.edge_index
        assert int(src.min()) >= block.n_dst and int(src.max()) < block.n_src
        assert int(dst.max()) < block.n_dst
    assert sub.input_nodes.size == 61 and sub.num_seeds == 1
