"""Values that overflow float32 are refused at the door; non-finite outputs are JSON errors.

A real server on loopback over a mutable copy of the small store (update log in tmp_path).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch

from gnnserve.config import ServeConfig
from gnnserve.engine.loader import build_engine
from gnnserve.features import open_feature_store
from gnnserve.graph import open_graph_store
from gnnserve.models.checkpoint import load_checkpoint
from gnnserve.models.runner import ModelRunner
from tests.server.conftest import serving
from tests.server.errors import error_of

DIM = 16
OUTPUTS = ["label", "probs", "embedding"]


@pytest.fixture(scope="module")
def mutable(small_store: Path, small_ckpt: Path, tmp_path_factory) -> Iterator[tuple[str, Path]]:
    """(base URL, update log path) of a server on the small store with an update log."""
    log = tmp_path_factory.mktemp("nonfinite") / "updates.log"
    config = ServeConfig.load(
        None,
        **{
            "store.path": str(small_store),
            "model_path": str(small_ckpt),
            "sampler.fanouts": [-1, -1],
            "store.update_log": str(log),
            "store.fsync": "never",
        },
    )
    with serving(build_engine(config)) as url:
        yield url, log


def _post(url: str, path: str, body: object) -> httpx.Response:
    return httpx.post(f"{url}{path}", json=body, timeout=30)


def _assert_json_error(r: httpx.Response, status: int, kind: str) -> dict:
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/json", r.text
    err = error_of(r)
    assert err["kind"] == kind and err["message"]
    return err


@pytest.mark.parametrize(
    ("ops", "field"),
    [
        ([{"op": "add_node", "features": [0.0] * 15 + [1e39]}], "ops[0].features"),
        (
            [
                {"op": "add_edge", "src": 1, "dst": 2},
                {"op": "upsert_features", "node": 9, "features": [-1e39] + [0.0] * 15},
            ],
            "ops[1].features",
        ),
        ([{"op": "upsert_features", "node": 9, "features": [10**400] * 16}], "ops[0].features"),
    ],
)
def test_values_overflowing_float32_are_400_and_not_applied_or_logged(
    mutable: tuple[str, Path], ops: list[dict], field: str
) -> None:
    url, log = mutable
    before = _post(url, "/v1/predict", {"nodes": [9], "output": "probs"}).json()
    size = log.stat().st_size
    r = _post(url, "/v1/graph/updates", {"ops": ops})
    err = _assert_json_error(r, 400, "update_rejected")
    assert err["field"] == field and "float32" in err["message"]
    assert log.stat().st_size == size
    after = _post(url, "/v1/predict", {"nodes": [9], "output": "probs"}).json()
    assert after["graph_version"] == before["graph_version"]
    assert after["predictions"] == before["predictions"]


def _plain_forward(store: Path, ckpt: Path, node: int, values: float) -> tuple:
    """Full-graph logits and layer-1 embeddings (plain PyG) with ``node``'s features set."""
    graph = open_graph_store(store)
    indptr, indices = graph.csr()
    dst = np.repeat(np.arange(graph.num_nodes), np.diff(indptr))
    edge_index = torch.from_numpy(np.stack([np.asarray(indices, np.int64), dst]))
    x = open_feature_store(store).get(np.arange(graph.num_nodes)).clone()
    x[node] = values
    model = load_checkpoint(ckpt).model
    with torch.inference_mode():
        return model(x, edge_index), torch.relu(model.convs[0](x, edge_index))


def test_non_finite_outputs_are_json_500_naming_the_nodes(
    mutable: tuple[str, Path], small_store: Path, small_ckpt: Path
) -> None:
    url, _ = mutable
    node, big = 7, 3e38  # finite in float32, so accepted; the model's sums overflow on it
    logits, hidden = _plain_forward(small_store, small_ckpt, node, big)
    broken = {  # which nodes' outputs the plain forward cannot give as numbers
        "label": ~torch.isfinite(logits).all(1),
        "probs": ~torch.isfinite(logits).all(1),
        "embedding": ~torch.isfinite(hidden).all(1),
    }
    assert broken["label"][node] and broken["embedding"][node]
    clean = int(torch.nonzero(~broken["label"] & ~broken["embedding"])[0])
    hit = next(v for v in torch.nonzero(broken["label"]).flatten().tolist() if v != node)
    op = {"op": "upsert_features", "node": node, "features": [big] * DIM}
    assert _post(url, "/v1/graph/updates", {"ops": [op]}).status_code == 200
    for output in OUTPUTS:
        asked = [clean, node, hit]
        r = _post(url, "/v1/predict", {"nodes": asked, "output": output})
        err = _assert_json_error(r, 500, "non_finite_output")
        want = [v for v in asked if broken[output][v]]  # in request order
        assert f"node(s) {want}" in err["message"], err
        ok = _post(url, "/v1/predict", {"nodes": [clean], "output": output})
        assert ok.status_code == 200, ok.text
        if output == "label":  # the plain forward's answer
            assert ok.json()["predictions"] == [int(logits[clean].argmax())]
        infer = {
            "inputs": [{"name": "node_ids", "shape": [1], "datatype": "INT64", "data": [node]}],
            "outputs": [{"name": output}],
        }
        err = _assert_json_error(
            _post(url, "/v2/models/sage/infer", infer), 500, "non_finite_output"
        )
        assert f"node(s) [{node}]" in err["message"], err


class _ComplexRunner(ModelRunner):
    """A runner with a bug: its outputs are complex numbers, which JSON cannot hold."""

    @staticmethod
    def shape_output(kind, logits, embedding, rows, nodes=None):  # type: ignore[no-untyped-def]
        return ModelRunner.shape_output(kind, logits, embedding, rows).to(torch.complex64)


def test_an_unexpected_exception_is_a_json_500_without_internals(
    small_store: Path, small_ckpt: Path
) -> None:
    config = ServeConfig.load(
        None, **{"store.path": str(small_store), "model_path": str(small_ckpt)}
    )
    engine = build_engine(config)
    engine.runner = _ComplexRunner(engine.runner.model, engine.runner.version)
    infer = {"inputs": [{"name": "node_ids", "shape": [1], "datatype": "INT64", "data": [3]}]}
    with serving(engine) as url:
        for path, body in [("/v1/predict", {"nodes": [3]}), ("/v2/models/sage/infer", infer)]:
            err = _assert_json_error(_post(url, path, body), 500, "internal")
            assert err["field"] is None
            message = err["message"]
            assert "Traceback" not in message and str(Path.cwd()) not in message
            assert "/" not in message and "complex" not in message, message
        assert httpx.get(f"{url}/v2/health/ready").status_code == 200
        metrics = httpx.get(f"{url}/metrics").text
        assert 'kind="internal"' in metrics
