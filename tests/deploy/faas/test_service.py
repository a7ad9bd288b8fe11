"""FaaSService on real Ray actors: answers equal single-process inference, instances cold-start,
scale to zero, and read an S3 store (memory limits and launch paths: test_launch.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from gnnserve.data.writer import GraphData, write_store
from gnnserve.deploy.faas.function import FunctionSpec
from gnnserve.deploy.faas.service import FaaSService
from gnnserve.features import open_feature_store
from gnnserve.graph import open_graph_store
from gnnserve.models.checkpoint import load_checkpoint
from gnnserve.models.runner import ModelRunner
from gnnserve.sampling.sampler import NeighborSampler
from gnnserve.types import MiniBatch
from tests.conftest import make_checkpoint

pytestmark = [pytest.mark.slow, pytest.mark.distributed]


def local_logits(
    store: Path, ckpt: Path, seeds: np.ndarray, fanouts: list[int], key: int
) -> torch.Tensor:
    """The reference: the same sample and model in this process."""
    graph = open_graph_store(store)
    sub = NeighborSampler(graph, fanouts).sample(seeds, rng_seed=key)
    x = open_feature_store(store).get(sub.input_nodes)
    loaded = load_checkpoint(ckpt)
    batch = MiniBatch(sub, x, torch.from_numpy(graph.gcn_degree(sub.input_nodes)))
    return ModelRunner(loaded.model, loaded.version).forward(batch)[0]


@pytest.mark.parametrize("arch", ["gcn"])  # GCN: its degree rows travel too (SAGE reads none)
def test_answers_equal_local_inference_and_scale_to_zero(
    ray_instance: None, small_store: Path, tmp_path: Path, arch: str
) -> None:
    ckpt = make_checkpoint(small_store, tmp_path / arch, arch=arch)
    spec = FunctionSpec(small_store.as_uri(), str(ckpt), (5, 3), memory_mb=0)
    queries = [np.array(s, dtype=np.int64) for s in ([3], [7, 7, 100], [1999, 0])]
    wants = [local_logits(small_store, ckpt, ids, [5, 3], key) for key, ids in enumerate(queries)]
    service = FaaSService(spec, keep_alive_s=8.0)  # above a cold start on 2 busy cores
    try:
        for key, (ids, want) in enumerate(zip(queries, wants, strict=True)):
            got = service.predict(ids, rng_seed=key)
            torch.testing.assert_close(got.output.logits, want, rtol=1e-5, atol=1e-5)
            assert got.sample.bytes_read > 0 and got.output.misses + got.output.hits > 0
        assert service.summary()["cold_starts"] == 2  # one sample + one inference instance
        assert service.wait_scaled_to_zero(timeout_s=30.0)
        service.predict(np.array([5]), rng_seed=9)  # after scale to zero: cold again
        assert service.summary()["cold_starts"] == 4
    finally:
        service.shutdown()


def star_store(out: Path, n: int = 25_000, dim: int = 1024) -> Path:
    """Vertex 0 has every other vertex as in-neighbour; 100 MB of features."""
    src = np.arange(1, n, dtype=np.int64)
    ei = np.stack(
        [
            np.concatenate([src, np.zeros(1, np.int64)]),
            np.concatenate([np.zeros(n - 1, np.int64), [1]]),
        ]
    )
    x = np.random.default_rng(0).standard_normal((n, dim), dtype=np.float32)
    write_store(GraphData("star", n, ei, x), out)
    return out


def test_instances_read_an_s3_store(
    ray_instance: None, object_store: Any, small_store: Path, tmp_path: Path
) -> None:
    from gnnserve.data.publish import publish

    url = f"s3://{object_store.bucket}/faas-service"
    publish(small_store, url, object_store.options(), progress=False)
    ckpt = make_checkpoint(small_store, tmp_path / "gcn", arch="gcn")
    want = local_logits(small_store, ckpt, np.array([9, 10]), [4, 4], 3)
    spec = FunctionSpec(url, str(ckpt), (4, 4), options=object_store.options())
    service = FaaSService(spec, keep_alive_s=60.0)
    try:
        got = service.predict(np.array([9, 10]), rng_seed=3)
        torch.testing.assert_close(got.output.logits, want, rtol=1e-5, atol=1e-5)
    finally:
        service.shutdown()
