"""`gnnserve serve --deploy dgs` over HTTP: the same answers as `local` with pre-sampling.

A DGS sample equals the pre-sampler's for the same seed and update sequence, and the features
and model are the same, so every answer must equal the local server's exactly, before and
after graph updates (which the DGS workers read from the server's update log).
"""

from __future__ import annotations

from pathlib import Path

import httpx
import numpy as np
import psutil
import pytest

from tests.dashboard import assert_dashboard_metrics_exported
from tests.deploy.servers import metric, predict, served_together, update

# the servers join the session's Ray instance (tests/deploy/servers.py)
pytestmark = [pytest.mark.slow, pytest.mark.distributed, pytest.mark.usefixtures("ray_instance")]

FANOUTS = ["--fanouts", "5,3"]
NODES = [0, 7, 7, 123, 1999, 42, 500]


def _probs(base: str, nodes: list[int], **extra: object) -> np.ndarray:
    body = predict(base, {"nodes": nodes, "output": "probs", **extra})
    return np.asarray(body["predictions"], dtype=np.float64)


def test_dgs_answers_equal_local_presample_before_and_after_updates(
    small_store: Path, small_ckpt: Path, tmp_path: Path
) -> None:
    local_log, dgs_log = str(tmp_path / "local.log"), str(tmp_path / "dgs.log")
    local_flags = [*FANOUTS, "--presample", "--update-log", local_log]
    dgs_flags = [*FANOUTS, "--deploy", "dgs", "--deploy-workers", "2", "--update-log", dgs_log]
    flag_sets = (tuple(local_flags), tuple(dgs_flags))
    with served_together(small_store, small_ckpt, *flag_sets, join_ray=True) as (
        local,
        dgs,
    ):
        np.testing.assert_array_equal(_probs(dgs, NODES), _probs(local, NODES))
        assert metric(dgs, "gnnserve_deploy_dgs_batches") >= 1  # sampled by the DGS workers
        seeded = _probs(local, NODES, seed=3)  # a request's own seed: the same draws on both
        np.testing.assert_allclose(_probs(dgs, NODES, seed=3), seeded, rtol=0, atol=1e-6)
        # edges into the requested nodes change their reservoirs on both sides
        ops: list[dict[str, object]] = [{"op": "add_edge", "src": s, "dst": 7} for s in (1, 2, 3)]
        ops += [{"op": "add_edge", "src": 9, "dst": 123}]
        for base in (local, dgs):
            update(base, ops)
        np.testing.assert_array_equal(_probs(dgs, NODES), _probs(local, NODES))
        _kill_a_serving_worker(dgs)
        r = httpx.post(f"{dgs}/v1/predict", json={"nodes": NODES}, timeout=60)
        assert r.status_code == 503 and r.headers["retry-after"] == "1", r.text
        err = r.json()["error"]
        assert err["kind"] == "worker_failed" and "retry" in err["message"]
        for detail in ("actor", "pid", "namespace", "ip:", "192.", "127.0.0.1"):
            assert detail not in err["message"].lower(), err["message"]
        assert metric(dgs, "gnnserve_deploy_replaced_workers") == 1
        assert_dashboard_metrics_exported(dgs, "dgs")
        np.testing.assert_array_equal(_probs(dgs, NODES), _probs(local, NODES))  # DGS again
        for base in (local, dgs):
            update(base, [{"op": "add_edge", "src": 11, "dst": 42}])
        before = metric(dgs, "gnnserve_deploy_dgs_batches")
        np.testing.assert_array_equal(_probs(dgs, NODES), _probs(local, NODES))
        assert metric(dgs, "gnnserve_deploy_dgs_batches") == before + 1
        # other fanouts sample locally: a valid answer of the right shape
        before = metric(dgs, "gnnserve_deploy_dgs_batches")
        got = _probs(dgs, NODES, fanouts=[2, 2])
        assert metric(dgs, "gnnserve_deploy_dgs_batches") == before
        assert got.shape == (len(NODES), 4) and np.allclose(got.sum(axis=1), 1.0, atol=1e-5)
        # an added node joins the workers' key ranges: DGS goes on sampling, the new node too,
        # and the answers equal the local pre-sampler's
        node = {"op": "add_node", "features": [0.5] * 16}
        for base in (local, dgs):
            update(base, [node, {"op": "add_edge", "src": 2000, "dst": 7}])
            update(base, [{"op": "add_edge", "src": 5, "dst": 2000}])
        before = metric(dgs, "gnnserve_deploy_dgs_batches")
        np.testing.assert_array_equal(_probs(dgs, [*NODES, 2000]), _probs(local, [*NODES, 2000]))
        assert metric(dgs, "gnnserve_deploy_dgs_batches") == before + 1


def _kill_a_serving_worker(base: str) -> None:
    """kill -9 one DGS serving worker (a Ray actor process of the deployment at ``base``)."""
    del base  # the server joined the session's Ray: its workers are the raylet's children
    workers = []
    for p in psutil.process_iter(["cmdline"]):
        if "ServingWorker" in " ".join(p.info["cmdline"] or []):
            workers.append(p)  # this deployment's: every other one has stopped its actors
    assert workers, "no DGS serving worker process found"
    workers[0].kill()
    workers[0].wait(30)


def test_dgs_refuses_bad_worker_count(small_store: Path, small_ckpt: Path) -> None:
    from gnnserve.cli import main

    code = main(
        ["serve", "--store", str(small_store), "--model", str(small_ckpt), "--deploy-workers", "0"]
    )
    assert code == 2
