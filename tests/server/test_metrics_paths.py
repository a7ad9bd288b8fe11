"""/metrics shows which sampling path each batch took, its summed PSGS, and the active points."""

from __future__ import annotations

from pathlib import Path

import httpx
import numpy as np
import pytest

from gnnserve.config import ServeConfig
from gnnserve.engine.loader import build_engine
from gnnserve.graph import open_graph_store
from gnnserve.sampling.metrics import psgs
from tests.deploy.servers import metric
from tests.server.conftest import serving

FANOUTS = [5, 3]
SMALL, LARGE = [3], list(range(100, 140))


@pytest.mark.parametrize(
    ("device", "routed", "large"),
    [("cpu", "parallel", LARGE), ("cuda", "cuda", LARGE[:4])],  # the simulator is slow
)
def test_batches_seeds_and_psgs_by_sampling_path(
    small_store: Path, small_ckpt: Path, device: str, routed: str, large: list[int]
) -> None:
    """The routed batch counts under its path: ``parallel``, or ``cuda`` on the device path
    (numba's CUDA simulator here); the inline one stays ``inline`` either way."""
    cost = psgs(open_graph_store(small_store), FANOUTS)
    threshold = int(cost[large].sum()) - 1  # the large request routes, the small one does not
    assert cost[SMALL].sum() < threshold
    config = ServeConfig.load(
        None,
        **{
            "store.path": str(small_store),
            "model_path": str(small_ckpt),
            "sampler.fanouts": FANOUTS,
            "sampler.parallel_threshold": threshold,
            "compute.device": device,
        },
    )
    with serving(build_engine(config)) as base:
        before = {p: _count(base, "batches", p) for p in ("inline", routed)}
        timed = _value(base, f'gnnserve_sampling_path_batch_seconds_count{{path="{routed}"}}')
        psgs_before = _value(base, "gnnserve_batch_psgs_sum")
        for nodes in (SMALL, large):
            r = httpx.post(f"{base}/v1/predict", json={"nodes": nodes}, timeout=30)
            assert r.status_code == 200, r.text
        assert _count(base, "batches", "inline") == before["inline"] + 1
        assert _count(base, "batches", routed) == before[routed] + 1
        assert _count(base, "seeds", routed) >= len(large)
        count = f'gnnserve_sampling_path_batch_seconds_count{{path="{routed}"}}'
        assert _value(base, count) == timed + 1
        summed = _value(base, "gnnserve_batch_psgs_sum") - psgs_before
        np.testing.assert_allclose(summed, cost[SMALL].sum() + cost[large].sum(), rtol=1e-9)
        assert metric(base, 'gnnserve_routing_psgs{point="route"}') == threshold


def _count(base: str, what: str, path: str) -> float:
    return _value(base, f'gnnserve_sampling_path_{what}_total{{path="{path}"}}')


def _value(base: str, name: str) -> float:
    """A sample's value, 0 when it is not exposed yet (a counter never incremented)."""
    try:
        return metric(base, name)
    except AssertionError:
        return 0.0
