"""`gnnserve serve --deploy faas` over HTTP: the same answers as `local`, served by function
instances reading the store by byte ranges; FaaS metrics on /metrics; clear refusals."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from gnnserve.cli import main
from tests.dashboard import assert_dashboard_metrics_exported
from tests.deploy.servers import metric, predict, served

# the servers join the session's Ray instance (tests/deploy/servers.py)
pytestmark = [pytest.mark.slow, pytest.mark.distributed, pytest.mark.usefixtures("ray_instance")]

# full neighbourhoods: the sample is deterministic, so both servers must agree exactly
FANOUTS = ["--fanouts=-1,-1"]
NODES = [0, 7, 7, 123, 1999, 42, 500]
SAMPLED = ["--fanouts", "2,2"]


@pytest.fixture(scope="module")
def local(small_store: Path, small_ckpt: Path) -> Iterator[str]:
    """The reference: `serve` with the local deployment (default fanouts 2,2; a request may
    ask for full neighbourhoods), one server for the module."""
    with served(small_store, small_ckpt, *SAMPLED, join_ray=True) as base:
        yield base


def _probs(base: str, nodes: list[int], **extra: object) -> np.ndarray:
    body = predict(base, {"nodes": nodes, "output": "probs", **extra})
    return np.asarray(body["predictions"], dtype=np.float64)


@pytest.mark.parametrize("launch", ["process", "fork"])
def test_faas_answers_equal_local_and_report_metrics(
    small_store: Path, small_ckpt: Path, local: str, launch: str
) -> None:
    faas_flags = [*FANOUTS, "--deploy", "faas", "--remote", small_store.as_uri()]
    faas_flags += ["--launch", launch, "--memory-mb", "1500", "--sample-memory-mb", "1500"]
    with served(
        small_store, small_ckpt, *faas_flags, "--keep-alive-s", "120", join_ray=True
    ) as faas:
        want = _probs(local, NODES, fanouts=[-1, -1])
        np.testing.assert_allclose(_probs(faas, NODES), want, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(_probs(faas, NODES), want, rtol=1e-5, atol=1e-6)  # warm
        assert metric(faas, "gnnserve_deploy_faas_infer_cold_starts") == 1
        assert metric(faas, "gnnserve_deploy_faas_sample_cold_starts") == 1
        assert metric(faas, "gnnserve_deploy_faas_cache_hit_rate") > 0  # the repeat hit
        assert metric(faas, "gnnserve_deploy_faas_topology_bytes") > 0
        assert metric(faas, "gnnserve_deploy_faas_infer_instances_idle") == 1
        assert metric(faas, "gnnserve_deploy_faas_infer_retries") == 0
        assert_dashboard_metrics_exported(faas, "faas")
        r = httpx.post(f"{faas}/v1/predict", json={"nodes": [1], "fanouts": [2, 2]}, timeout=30)
        assert r.status_code == 400 and "fanouts" in r.json()["error"]["message"]
        r = httpx.post(f"{faas}/v1/predict", json={"nodes": [2000]}, timeout=30)
        assert r.status_code == 400  # out of range, refused at the gateway


def test_min_instances_are_warm_and_a_seed_draws_as_local(
    small_store: Path, small_ckpt: Path, local: str
) -> None:
    """--min-instances 1: one instance of each function is warm before /v2/health/ready
    answers, so the first request pays no cold start. Sampled fanouts with a request's own
    seed: the instances draw what the local sampler draws (the on-demand sampler keys draws as
    it does), so the answers agree."""
    flags = [*SAMPLED, "--deploy", "faas", "--remote", small_store.as_uri(), "--launch", "fork"]
    flags += ["--min-instances", "1", "--memory-mb", "1500", "--sample-memory-mb", "1500"]
    with served(small_store, small_ckpt, *flags, join_ray=True) as faas:
        for function in ("sample", "infer"):
            assert metric(faas, f"gnnserve_deploy_faas_{function}_instances_idle") == 1
            assert metric(faas, f"gnnserve_deploy_faas_{function}_cold_starts") == 1
        for seed in (3, 4):
            want = _probs(local, NODES, seed=seed)
            np.testing.assert_allclose(_probs(faas, NODES, seed=seed), want, atol=1e-6)
        assert not np.allclose(_probs(faas, NODES, seed=3), _probs(faas, NODES, seed=4))
        for function in ("sample", "infer"):
            assert metric(faas, f"gnnserve_deploy_faas_{function}_cold_starts") == 1


def test_faas_refuses_a_missing_remote_store(
    small_ckpt: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["serve", "--deploy", "faas", "--remote", str(tmp_path / "none"), "--model"]
    assert main([*argv, str(small_ckpt), "--port", "0"]) == 2
    assert "meta.json" in capsys.readouterr().err
