"""HTTP API against a real server on loopback: answers, OIP v2, metrics, and every bad input."""

from __future__ import annotations

import httpx
import numpy as np
import pytest
import torch

from gnnserve.engine.loader import build_engine  # noqa: F401  (import check of the server path)
from tests.server.conftest import MAX_NODES
from tests.server.errors import error_of


def test_predict_answers_with_versions_and_timings(live_server: str) -> None:
    r = httpx.post(f"{live_server}/v1/predict", json={"nodes": [3, 1, 3], "output": "probs"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["nodes"] == [3, 1, 3] and body["model"] == "sage"
    probs = np.array(body["predictions"])
    assert probs.shape == (3, 4)
    np.testing.assert_allclose(probs.sum(1), 1.0, atol=1e-5)
    np.testing.assert_array_equal(probs[0], probs[2])
    assert body["model_version"].count("@") == 1 and len(body["graph_version"]) == 32
    assert set(body["timings"]) >= {"queue_ms", "sample_ms", "fetch_ms", "compute_ms", "total_ms"}
    assert isinstance(body["timings"]["batch_size"], int) and body["timings"]["batch_size"] >= 2


def test_labels_and_embeddings_agree_with_probs(live_server: str) -> None:
    nodes = list(range(0, 40, 3))
    probs = httpx.post(f"{live_server}/v1/predict", json={"nodes": nodes, "output": "probs"}).json()
    labels = httpx.post(f"{live_server}/v1/predict", json={"nodes": nodes}).json()
    emb = httpx.post(f"{live_server}/v1/predict", json={"nodes": nodes, "output": "embedding"})
    assert labels["predictions"] == np.argmax(probs["predictions"], 1).tolist()
    assert np.array(emb.json()["predictions"]).shape == (len(nodes), 32)


def test_oip_v2_health_metadata_and_infer(live_server: str) -> None:
    assert httpx.get(f"{live_server}/v2/health/live").json() == {"live": True}
    assert httpx.get(f"{live_server}/v2/health/ready").status_code == 200
    meta = httpx.get(f"{live_server}/v2/models/sage").json()
    assert meta["inputs"][0] == {"name": "node_ids", "datatype": "INT64", "shape": [-1]}
    body = {
        "id": "r1",
        "inputs": [{"name": "node_ids", "shape": [3], "datatype": "INT64", "data": [4, 5, 6]}],
        "outputs": [{"name": "label"}, {"name": "probs"}],
    }
    r = httpx.post(f"{live_server}/v2/models/sage/infer", json=body)
    assert r.status_code == 200, r.text
    out = {o["name"]: o for o in r.json()["outputs"]}
    assert r.json()["id"] == "r1"
    assert out["label"]["shape"] == [3] and out["label"]["datatype"] == "INT64"
    assert out["probs"]["shape"] == [3, 4] and len(out["probs"]["data"]) == 12
    probs = torch.tensor(out["probs"]["data"]).view(3, 4)
    assert probs.argmax(1).tolist() == out["label"]["data"]


def test_metrics_exposes_latency_batches_queue_and_errors(live_server: str) -> None:
    httpx.post(f"{live_server}/v1/predict", json={"nodes": [1]})
    httpx.post(f"{live_server}/v1/predict", json={"nodes": [-5]})
    text = httpx.get(f"{live_server}/metrics").text
    for name in (
        "gnnserve_request_latency_seconds_bucket",
        "gnnserve_stage_latency_seconds_bucket",
        "gnnserve_batch_size_bucket",
        "gnnserve_queue_depth",
        'gnnserve_errors_total{kind="invalid_input"}',
    ):
        assert name in text, name


BAD_PREDICT = [
    ({"nodes": ["a"]}, 400, "nodes.0"),
    ({"nodes": [1.5]}, 400, "nodes.0"),
    ({"nodes": [True]}, 400, "nodes.0"),
    ({"nodes": "1,2"}, 400, "nodes"),
    ({"nodes": [-1]}, 400, "nodes"),
    ({"nodes": [2000]}, 400, "nodes"),
    ({"nodes": [2**63 + 5]}, 400, "nodes"),
    ({"nodes": []}, 400, "nodes"),
    ({}, 400, "nodes"),
    ({"nodes": list(range(MAX_NODES + 1))}, 413, "nodes"),
    ({"nodes": [1], "output": "logits"}, 400, "output"),
    ({"nodes": [1], "model": "nope"}, 404, "model"),
    ({"nodes": [1], "extra": 1}, 400, "extra"),
    ({"nodes": [1], "fanouts": [5]}, 400, "fanouts"),
    ({"nodes": [1], "fanouts": [5, 0]}, 400, "fanouts"),
    ({"nodes": [1], "fanouts": ["5", 5]}, 400, "fanouts.0"),
]


@pytest.mark.parametrize(("body", "status", "field"), BAD_PREDICT)
def test_bad_predict_bodies_get_4xx_naming_the_field(live_server, body, status, field) -> None:
    r = httpx.post(f"{live_server}/v1/predict", json=body)
    assert r.status_code == status, r.text
    err = error_of(r)
    assert err["field"] == field and err["message"]
    assert httpx.post(f"{live_server}/v1/predict", json={"nodes": [1]}).status_code == 200


@pytest.mark.parametrize("raw", [b"{not json", b"", b"[1, 2]", b"null", b'{"nodes": [1,]}'])
def test_malformed_json_is_400(live_server: str, raw: bytes) -> None:
    r = httpx.post(
        f"{live_server}/v1/predict", content=raw, headers={"content-type": "application/json"}
    )
    assert r.status_code == 400, r.text
    assert error_of(r)["kind"] == "invalid_input"
    assert httpx.post(f"{live_server}/v1/predict", json={"nodes": [1]}).status_code == 200


def _infer(
    data: list[int],
    shape: list[int],
    datatype: str = "INT64",
    name: str = "node_ids",
    outputs: list[str] | None = None,
) -> dict[str, object]:
    body: dict[str, object] = {
        "inputs": [{"name": name, "shape": shape, "datatype": datatype, "data": data}]
    }
    if outputs is not None:
        body["outputs"] = [{"name": o} for o in outputs]
    return body


@pytest.mark.parametrize(
    ("model", "body", "status", "field"),
    [
        ("sage", _infer([1, 2], [3]), 400, "node_ids"),  # 2 values, shape [3]
        ("sage", _infer([1], [1], "FP32"), 400, "inputs"),
        ("sage", _infer([1], [1], name="x"), 400, "inputs"),
        ("sage", _infer([5000], [1]), 400, "node_ids"),
        ("sage", _infer([1], [1], outputs=["logits"]), 400, "outputs"),
        ("sage", _infer([1], [1], outputs=["label", "label"]), 400, "outputs"),
        ("sage", {"inputs": []}, 400, "inputs"),
        ("other", _infer([1], [1]), 404, "model_name"),
    ],
)
def test_bad_infer_requests_get_4xx(live_server, model, body, status, field) -> None:
    r = httpx.post(f"{live_server}/v2/models/{model}/infer", json=body)
    assert r.status_code == status, r.text
    assert error_of(r)["field"] == field
    ok = httpx.post(f"{live_server}/v2/models/sage/infer", json=_infer([1], [1]))
    assert ok.status_code == 200


def test_unknown_model_metadata_and_route(live_server: str) -> None:
    assert httpx.get(f"{live_server}/v2/models/other").status_code == 404
    r = httpx.get(f"{live_server}/v1/nothing")
    assert r.status_code == 404 and error_of(r)["kind"] == "not_found"
