"""`gnnserve serve --deploy cgp` over HTTP: new-node SRPE on CGP workers, same answers as local.

CGP computes the single-process SRPE answer up to float summation order; existing-node
requests and the other new-node modes run on the local pipeline and must be identical.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from gnnserve.cli import main
from tests.dashboard import assert_dashboard_metrics_exported
from tests.deploy.servers import metric, predict, served_together

# the servers join the session's Ray instance (tests/deploy/servers.py)
pytestmark = [pytest.mark.slow, pytest.mark.distributed, pytest.mark.usefixtures("ray_instance")]

RNG = np.random.default_rng(3)
NEW_NODES = {
    "features": RNG.standard_normal((3, 16)).round(3).tolist(),
    "edges": [[0, 3], [0, 17], [1, 4], [1, 3], [2, 1500]],
    "new_edges": [[0, 1]],
}


def _logits_like(base: str, body: dict[str, object]) -> np.ndarray:
    return np.asarray(predict(base, {**body, "output": "probs"})["predictions"], np.float64)


def test_cgp_answers_equal_local(pe_store: Path, small_ckpt: Path) -> None:
    common = ["--fanouts", "5,3", "--new-node-mode", "srpe", "--gamma", "0.5"]
    cgp_flags = (*common, "--deploy", "cgp", "--deploy-workers", "2")
    with served_together(pe_store, small_ckpt, tuple(common), cgp_flags, join_ray=True) as (
        local,
        cgp,
    ):
        srpe = {"new_nodes": NEW_NODES}
        assert metric(cgp, "gnnserve_deploy_cgp_requests") == 0
        want, got = _logits_like(local, srpe), _logits_like(cgp, srpe)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
        assert metric(cgp, "gnnserve_deploy_cgp_requests") == 1  # the workers answered it
        assert metric(cgp, "gnnserve_deploy_cgp_bytes_sent") > 0
        assert_dashboard_metrics_exported(cgp, "cgp")
        body = predict(cgp, {**srpe, "output": "probs"})
        assert body["mode"] == "srpe" and body["num_candidates"] > 0
        assert body["recomputed"] == predict(local, srpe)["recomputed"]
        # modes CGP does not run, and existing nodes: the local path, identical answers
        full = {"new_nodes": NEW_NODES, "mode": "full"}
        np.testing.assert_array_equal(_logits_like(cgp, full), _logits_like(local, full))
        nodes = {"nodes": [5, 6, 7], "fanouts": [-1, -1]}
        np.testing.assert_array_equal(_logits_like(cgp, nodes), _logits_like(local, nodes))
        assert metric(cgp, "gnnserve_deploy_cgp_requests") == 2  # the srpe requests only


def test_cgp_refuses_a_changing_graph_before_loading(
    small_ckpt: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Refused before the store is opened: the store given does not even exist."""
    absent = str(tmp_path / "no-store")
    argv = ["serve", "--store", absent, "--model", str(small_ckpt), "--deploy", "cgp"]
    assert main([*argv, "--update-log", str(tmp_path / "u.log")]) == 2
    assert "static graph" in capsys.readouterr().err


def test_unknown_deploy_mode_is_refused_before_loading(
    small_ckpt: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    absent = str(tmp_path / "no-store")
    argv = ["serve", "--store", absent, "--model", str(small_ckpt), "--deploy", "fog2"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "fog2" in err and "cgp" in err and "dgs" in err
