"""`gnnserve serve --deploy fog` over HTTP: each batch is a round on the fog nodes; answers equal
full-neighbourhood inference on the local path; /metrics shows the rounds; bad set-ups refused."""

from __future__ import annotations

from pathlib import Path

import httpx
import numpy as np
import pytest

from gnnserve.cli import main
from gnnserve.deploy.fog.nodes import load_nodes
from gnnserve.deploy.fog.service import NodeSpec
from gnnserve.errors import InvalidInputError
from tests.dashboard import assert_dashboard_metrics_exported
from tests.deploy.servers import metric, predict, served_together

# the servers join the session's Ray instance (tests/deploy/servers.py)
pytestmark = pytest.mark.usefixtures("ray_instance")

NODES = (
    "nodes:\n  - {name: weak, cores: 0.3, link: wifi}\n"
    "  - {name: strong, link: 5g, fog_link: wifi}\n"
)


def _probs(base: str, nodes: list[int], **extra: object) -> np.ndarray:
    body = {"nodes": nodes, "output": "probs", **extra}
    return np.asarray(predict(base, body)["predictions"], np.float64)


@pytest.mark.slow
@pytest.mark.distributed
def test_fog_answers_equal_full_neighbourhood_inference(
    small_store: Path, small_ckpt: Path, tmp_path: Path
) -> None:
    nodes = tmp_path / "nodes.yaml"
    nodes.write_text(NODES)
    fog_flags = ["--deploy", "fog", "--nodes", str(nodes), "--fog-codec", "lossless"]
    full = "--fanouts=-1,-1"
    with served_together(small_store, small_ckpt, (full,), (*fog_flags, full), join_ray=True) as (
        local,
        fog,
    ):
        asked = [5, 6, 7, 1999, 5]
        np.testing.assert_allclose(_probs(fog, asked), _probs(local, asked), rtol=0, atol=1e-5)
        embedding = predict(fog, {"nodes": [3], "output": "embedding"})["predictions"]
        assert len(embedding[0]) > 0
        r = httpx.post(f"{fog}/v1/predict", json={"nodes": [1], "fanouts": [2, 2]}, timeout=30)
        assert r.status_code == 400 and r.json()["error"]["field"] == "fanouts"
        assert "full-graph inference" in r.json()["error"]["message"]
        every = {"fanouts": [-1, -1]}  # exactly what a round computes: accepted
        np.testing.assert_allclose(_probs(fog, asked, **every), _probs(local, asked), atol=1e-5)
        assert metric(fog, "gnnserve_deploy_fog_rounds") == 3  # the refused batch ran none
        assert metric(fog, "gnnserve_deploy_fog_slow_rounds") >= 0
        assert metric(fog, "gnnserve_deploy_fog_plan_version") >= 1
        assert metric(fog, "gnnserve_deploy_fog_node_weak_mu") > 0
        assert_dashboard_metrics_exported(fog, "fog")


def test_bad_fog_set_ups_are_refused_before_loading(
    small_ckpt: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Refused before the store is opened: the store given does not even exist."""
    absent = str(tmp_path / "no-store")
    argv = ["serve", "--store", absent, "--model", str(small_ckpt), "--deploy", "fog"]
    assert main(argv) == 2  # the server's default fanouts (25,10): fog cannot honour them
    assert "--fanouts=-1,-1" in capsys.readouterr().err
    argv.append("--fanouts=-1,-1")
    assert main(argv) == 2
    assert "--nodes" in capsys.readouterr().err
    nodes = tmp_path / "nodes.yaml"
    nodes.write_text(NODES)
    assert main([*argv, "--nodes", str(nodes), "--update-log", str(tmp_path / "u.log")]) == 2
    assert "fixed sensor graph" in capsys.readouterr().err


def test_nodes_file_errors_name_what_is_wrong(tmp_path: Path) -> None:
    path = tmp_path / "n.yaml"
    path.write_text(NODES)
    assert load_nodes(path) == [
        NodeSpec("weak", 0.3, "wifi"),
        NodeSpec("strong", None, "5g", "wifi"),
    ]
    cases = {
        "nodes:\n  - {name: a, link: 3g}\n": "a: link must be one of",
        "nodes:\n  - {name: a, fog_link: 3g}\n": "a: fog_link must be one of",
        "nodes:\n  - {name: a}\n  - {name: a}\n": "repeat",
        "nodes:\n  - {name: a, cores: 0}\n": "nodes.0.cores",
        "nodes: []\n": "nodes",
        "nodes:\n  - {name: a, speed: 2}\n": "speed",
        "[: bad": "cannot read",
    }
    for text, message in cases.items():
        path.write_text(text)
        with pytest.raises(InvalidInputError, match=message) as info:
            load_nodes(path)
        assert info.value.field == "deploy.nodes"
    with pytest.raises(InvalidInputError, match="cannot read"):
        load_nodes(tmp_path / "missing.yaml")


def test_auto_codec_is_lossless_for_integer_readings_only() -> None:
    from gnnserve.deploy.fog.executor import upload_codec

    counts = np.array([[0.0, 1.0, 2.0], [3.0, -4.0, 0.0]], np.float32)
    assert upload_codec("auto", counts) == "lossless"
    assert upload_codec("auto", counts + np.float32(0.5)) == "column"
    assert upload_codec("daq", counts) == "daq"  # asked for: kept
    assert upload_codec("lossless", counts + np.float32(0.5)) == "lossless"
