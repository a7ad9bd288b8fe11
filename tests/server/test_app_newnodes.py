"""New-node requests over HTTP (/v1/predict and OIP v2) against real servers on loopback."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch

from gnnserve.embeddings.stores import default_embeddings_dir
from gnnserve.engine.loader import build_engine
from tests.deploy.servers import metric
from tests.engine.test_engine_newnodes import EDGES, FEATURES, NEW_EDGES, config, direct
from tests.server.conftest import serving
from tests.server.errors import error_of

MAX_NEW = 8
NEW_NODES = {"features": FEATURES, "edges": EDGES, "new_edges": NEW_EDGES}


@pytest.fixture(scope="module")
def pe_server(pe_store: Path, small_ckpt: Path) -> Iterator[str]:
    """A server whose PEs are found in the store's default embeddings directory."""
    engine = build_engine(config(pe_store, small_ckpt, **{"embeddings.max_new_nodes": MAX_NEW}))
    with serving(engine, "sage") as url:
        yield url


def _predict(url: str, **body: object) -> httpx.Response:
    return httpx.post(f"{url}/v1/predict", json=body, timeout=30)


@pytest.mark.parametrize(
    ("options", "mode", "gamma", "policy"),
    [
        ({}, "srpe", 0.1, "query_edges_ratio"),
        ({"gamma": 1, "policy": "importance"}, "srpe", 1.0, "importance"),
        ({"mode": "full"}, "full", None, None),
    ],
)
def test_new_node_probs_equal_the_direct_computation(
    pe_server, pe_store, small_ckpt, options, mode, gamma, policy
) -> None:
    r = _predict(pe_server, new_nodes=NEW_NODES, output="probs", **options)
    assert r.status_code == 200, r.text
    body = r.json()
    pes = default_embeddings_dir(pe_store, small_ckpt)
    want = direct(pe_store, small_ckpt, pes, mode, gamma or 0.1, policy or "query_edges_ratio")
    got = torch.tensor(body["predictions"], dtype=torch.float32)
    torch.testing.assert_close(got, torch.softmax(want.logits, 1), atol=1e-6, rtol=0)
    assert body["nodes"] == [0, 1, 2] and body["new_nodes"] == 3 and body["model"] == "sage"
    assert (body["mode"], body["gamma"], body["policy"]) == (mode, gamma, policy)
    assert body["num_candidates"] == want.num_candidates == 5
    assert body["recomputed"] == want.recomputed.size
    assert body["model_version"].count("@") == 1 and len(body["graph_version"]) == 32
    assert body["timings"]["batch_size"] == 3
    assert set(body["timings"]) >= {"queue_ms", "sample_ms", "fetch_ms", "compute_ms", "total_ms"}


def test_labels_embeddings_and_isolated_nodes(pe_server) -> None:
    probs = _predict(pe_server, new_nodes=NEW_NODES, output="probs").json()["predictions"]
    labels = _predict(pe_server, new_nodes=NEW_NODES).json()
    assert labels["output"] == "label" and labels["predictions"] == np.argmax(probs, 1).tolist()
    emb = _predict(pe_server, new_nodes=NEW_NODES, output="embedding").json()["predictions"]
    assert np.array(emb).shape == (3, 32)
    alone = _predict(pe_server, new_nodes={"features": [[0.5] * 16]}, mode="ns", seed=3)
    assert alone.status_code == 200 and alone.json()["num_candidates"] == 0


def test_existing_node_requests_are_unchanged(pe_server) -> None:
    body = _predict(pe_server, nodes=[3, 1], output="probs").json()
    assert body["nodes"] == [3, 1] and "new_nodes" not in body and "mode" not in body


def _with(**change: object) -> dict[str, object]:
    return {"new_nodes": {**NEW_NODES, **change}}


BAD = [
    (_with(features=[[0.0] * 15]), 400, "new_nodes.features"),
    (_with(features=[]), 400, "new_nodes.features"),
    (_with(features=[[0.0] * 16, [0.0] * 15]), 400, "new_nodes.features"),
    (_with(features=[[1e39] * 16]), 400, "new_nodes.features"),
    (_with(features=[["a"] * 16]), 400, "new_nodes.features.0.0"),
    (_with(features=[[0.0] * 16] * (MAX_NEW + 1)), 413, "new_nodes.features"),
    (_with(edges=[[0, 2000]]), 400, "new_nodes.edges"),
    (_with(edges=[[0, -1]]), 400, "new_nodes.edges"),
    (_with(edges=[[3, 1]]), 400, "new_nodes.edges"),
    (_with(edges=[[0, 1, 2]]), 400, "new_nodes.edges"),
    (_with(edges=[[0, 2**70]]), 400, "new_nodes.edges"),
    (_with(edges=[[0, 1.5]]), 400, "new_nodes.edges.0.1"),
    (_with(new_edges=[[1, 1]]), 400, "new_nodes.new_edges"),
    (_with(new_edges=[[0, 9]]), 400, "new_nodes.new_edges"),
    (_with(extra=1), 400, "new_nodes.extra"),
    ({**_with(), "mode": "exact"}, 400, "mode"),
    ({**_with(), "policy": "best"}, 400, "policy"),
    ({**_with(), "gamma": 1.5}, 400, "gamma"),
    ({**_with(), "gamma": -0.1}, 400, "gamma"),
    ({**_with(), "mode": "ns", "fanouts": [5]}, 400, "fanouts"),
    ({**_with(), "output": "logits"}, 400, "output"),
    ({**_with(), "nodes": [1]}, 400, "new_nodes"),
    ({"nodes": [1], "mode": "srpe"}, 400, "mode"),
    ({"nodes": [1], "gamma": 0.5}, 400, "gamma"),
    ({"new_nodes": None}, 400, "nodes"),
]


@pytest.mark.parametrize(("body", "status", "field"), BAD)
def test_bad_new_node_bodies_get_4xx_naming_the_field(pe_server, body, status, field) -> None:
    r = httpx.post(f"{pe_server}/v1/predict", json=body)
    assert r.status_code == status, r.text
    err = error_of(r)
    assert err["field"] == field and err["message"]
    assert _predict(pe_server, new_nodes=NEW_NODES).status_code == 200


def test_negative_seeds_draw_as_their_twos_complement(pe_server) -> None:
    # gamma 0.4 recomputes 2 of the 5 candidates: the random policy's draw decides which
    body = {"new_nodes": NEW_NODES, "output": "probs", "policy": "random", "gamma": 0.4}
    answers = {}
    for seed in (-1, 2**64 - 1, -(2**63), 2**63, 0):
        r = _predict(pe_server, **body, seed=seed)
        assert r.status_code == 200, (seed, r.text)
        assert 0 < r.json()["recomputed"] < r.json()["num_candidates"]
        answers[seed] = r.json()["predictions"]
    assert answers[-1] == answers[2**64 - 1] and answers[-(2**63)] == answers[2**63]
    oip = {
        "inputs": _oip_inputs(),
        "outputs": [{"name": "probs"}],
        "parameters": {"policy": "random", "gamma": 0.4, "seed": -1},
    }
    r = httpx.post(f"{pe_server}/v2/models/sage/infer", json=oip)
    assert r.status_code == 200, r.text
    assert r.json()["outputs"][0]["data"] == [v for row in answers[-1] for v in row]
    ns = {"new_nodes": NEW_NODES, "output": "probs", "mode": "ns", "fanouts": [2, 2]}
    r1, r2 = (_predict(pe_server, **ns, seed=s) for s in (-5, 2**64 - 5))
    assert r1.status_code == r2.status_code == 200, r1.text
    assert r1.json()["predictions"] == r2.json()["predictions"]


@pytest.mark.parametrize("seed", [2**64, -(2**63) - 1, 10**30])
def test_seeds_beyond_64_bits_are_400(pe_server, seed: int) -> None:
    r = _predict(pe_server, new_nodes=NEW_NODES, policy="random", seed=seed)
    assert r.status_code == 400, r.text
    assert error_of(r)["field"] == "seed" and "64-bit" in error_of(r)["message"]


def test_non_finite_features_are_400(pe_server) -> None:
    body = json.dumps(_with(features=[[float("nan")] * 16]))  # Python's json writes NaN
    r = httpx.post(
        f"{pe_server}/v1/predict", content=body, headers={"content-type": "application/json"}
    )
    assert r.status_code == 400, r.text
    assert error_of(r)["field"] == "new_nodes.features"
    assert "NaN" in error_of(r)["message"]


@pytest.mark.parametrize("output", ["label", "probs", "embedding"])
def test_non_finite_new_node_outputs_are_json_500(pe_server, output: str) -> None:
    # row 2 is finite in float32 but the model overflows on it; mode pe recomputes no
    # existing node, so rows 0 and 1 stay finite
    features = [FEATURES[0], FEATURES[1], [3e38] * 16]
    new_nodes = _with(features=features)["new_nodes"]
    r = _predict(pe_server, new_nodes=new_nodes, output=output, mode="pe")
    assert r.status_code == 500 and r.headers["content-type"] == "application/json", r.text
    err = error_of(r)
    assert err["kind"] == "non_finite_output" and "node(s) [2]" in err["message"], err
    body = {
        "inputs": _oip_inputs(features),
        "outputs": [{"name": output}],
        "parameters": {"mode": "pe"},
    }
    r = httpx.post(f"{pe_server}/v2/models/sage/infer", json=body)
    assert r.status_code == 500 and error_of(r)["kind"] == "non_finite_output", r.text
    assert _predict(pe_server, new_nodes=NEW_NODES, output=output, mode="pe").status_code == 200


def test_without_embeddings_new_nodes_get_409(live_server: str) -> None:
    r = _predict(live_server, new_nodes=NEW_NODES)
    assert r.status_code == 409, r.text
    assert error_of(r)["kind"] == "no_embeddings"
    assert "gnnserve precompute" in error_of(r)["message"]
    assert _predict(live_server, nodes=[1]).status_code == 200


def test_graph_update_makes_new_node_requests_409_with_fixed_pes(
    pe_store, small_ckpt, tmp_path
) -> None:
    pes = default_embeddings_dir(pe_store, small_ckpt)
    overrides = {"store.update_log": str(tmp_path / "log"), "embeddings.path": str(pes)}
    overrides["embeddings.refresh"] = False  # type: ignore[assignment]
    with serving(build_engine(config(pe_store, small_ckpt, **overrides))) as url:
        assert _predict(url, new_nodes=NEW_NODES).status_code == 200
        ops = [{"op": "add_edge", "src": 1, "dst": 2}]
        r = httpx.post(f"{url}/v1/graph/updates", json={"ops": ops})
        assert r.status_code == 200, r.text
        stale = _predict(url, new_nodes=NEW_NODES)
        assert stale.status_code == 409, stale.text
        err = error_of(stale)
        assert err["kind"] == "stale_embeddings" and "gnnserve precompute" in err["message"]
        assert _predict(url, nodes=[2]).json()["graph_version"] == r.json()["graph_version"]


def test_refreshed_pes_answer_after_an_update_and_report_their_version(
    pe_store, small_ckpt, tmp_path
) -> None:
    pes = default_embeddings_dir(pe_store, small_ckpt)
    overrides = {"store.update_log": str(tmp_path / "log"), "embeddings.path": str(pes)}
    overrides["compute.result_cache_mb"] = 1  # type: ignore[assignment]
    with serving(build_engine(config(pe_store, small_ckpt, **overrides))) as url:
        first = _predict(url, new_nodes=NEW_NODES).json()
        assert first["pe_version"] == first["graph_version"] and first["pe_lag"] == 0
        ops = [{"op": "add_edge", "src": 1, "dst": 2}]
        r = httpx.post(f"{url}/v1/graph/updates", json={"ops": ops})
        assert r.status_code == 200, r.text
        after = _predict(url, new_nodes=NEW_NODES)
        assert after.status_code == 200, after.text  # no 409: the PEs followed the update
        body = after.json()
        assert body["graph_version"] == body["pe_version"] == r.json()["graph_version"]
        assert body["pe_lag"] == 0
        assert metric(url, "gnnserve_pe_refresh_batches") == 1
        assert metric(url, "gnnserve_pe_refresh_lag_batches") == 0
        for _ in range(2):  # full-neighbourhood answers: the second one from the cache
            assert _predict(url, nodes=[7, 9]).status_code == 200
        assert metric(url, "gnnserve_result_cache_hits") == 1
        assert metric(url, "gnnserve_result_cache_entries") == 2
    with serving(build_engine(config(pe_store, small_ckpt))) as fixed:  # no update log
        body = _predict(fixed, new_nodes=NEW_NODES).json()
        assert body["pe_version"] is None and body["pe_lag"] is None


def _tensor(name: str, shape: list[int], datatype: str, data: list[object]) -> dict[str, object]:
    return {"name": name, "shape": shape, "datatype": datatype, "data": data}


def _oip_inputs(features: list[list[float]] = FEATURES) -> list[dict[str, object]]:
    flat = [v for row in features for v in row]
    return [
        _tensor("new_node_features", [len(features), 16], "FP32", flat),
        _tensor("new_node_edges", [len(EDGES), 2], "INT64", [v for e in EDGES for v in e]),
        _tensor("new_node_new_edges", [1, 2], "INT64", NEW_EDGES[0]),
    ]


def test_oip_new_node_inputs(pe_server) -> None:
    meta = httpx.get(f"{pe_server}/v2/models/sage").json()
    inputs = {i["name"]: i for i in meta["inputs"]}
    assert inputs["new_node_features"] == {
        "name": "new_node_features",
        "datatype": "FP32",
        "shape": [-1, 16],
    }
    assert inputs["new_node_edges"]["shape"] == inputs["new_node_new_edges"]["shape"] == [-1, 2]
    body = {
        "id": "n1",
        "inputs": _oip_inputs(),
        "outputs": [{"name": "probs"}, {"name": "label"}],
        "parameters": {"mode": "srpe", "gamma": 0.5},
    }
    r = httpx.post(f"{pe_server}/v2/models/sage/infer", json=body)
    assert r.status_code == 200, r.text
    out = {o["name"]: o for o in r.json()["outputs"]}
    assert out["probs"]["shape"] == [3, 4] and out["label"]["datatype"] == "INT64"
    probs = torch.tensor(out["probs"]["data"]).view(3, 4)
    assert probs.argmax(1).tolist() == out["label"]["data"]
    v1 = _predict(pe_server, new_nodes=NEW_NODES, output="probs", gamma=0.5).json()
    torch.testing.assert_close(probs, torch.tensor(v1["predictions"]), atol=0, rtol=0)
    params = r.json()["parameters"]
    assert params["mode"] == "srpe" and params["gamma"] == 0.5 and params["new_nodes"] == 3
    assert params["recomputed"] == v1["recomputed"] and r.json()["id"] == "n1"


def _oip_bad(index: int, **change: object) -> dict[str, object]:
    inputs = _oip_inputs()
    inputs[index] = {**inputs[index], **change}
    return {"inputs": inputs}


OIP_BAD = [
    (_oip_bad(1, data=[0.5] + [v for e in EDGES for v in e][1:]), "inputs.1"),
    (_oip_bad(1, datatype="FP32"), "new_node_edges"),
    (_oip_bad(0, datatype="INT64", data=[1] * 48), "new_node_features"),
    (_oip_bad(0, shape=[4, 16]), "new_node_features"),
    (_oip_bad(0, data=[0.0] * 47 + [1e39]), "new_node_features"),  # inf in float32
    (_oip_bad(0, shape=[3, 15]), "new_node_features"),
    (_oip_bad(1, shape=[7, 2], data=[0, 2000] * 7), "new_node_edges"),
    (_oip_bad(2, data=[1, 1]), "new_node_new_edges"),
    ({"inputs": _oip_inputs()[:1]}, "inputs"),
    ({"inputs": [*_oip_inputs(), _tensor("node_ids", [1], "INT64", [1])]}, "inputs"),
    ({"inputs": _oip_inputs(), "parameters": {"gamma": 2}}, "gamma"),
    ({"inputs": _oip_inputs(), "parameters": {"mode": "exact"}}, "mode"),
    ({"inputs": _oip_inputs(), "parameters": {"gama": 0.2}}, "parameters"),
    ({"inputs": [_tensor("node_ids", [1], "INT64", [1.5])]}, "inputs.0"),
]


@pytest.mark.parametrize(("body", "field"), OIP_BAD)
def test_bad_oip_new_node_requests_are_400(pe_server, body, field) -> None:
    r = httpx.post(f"{pe_server}/v2/models/sage/infer", json=body)
    assert r.status_code == 400, r.text
    assert error_of(r)["field"] == field


def test_openapi_documents_new_nodes(pe_server) -> None:
    schema = httpx.get(f"{pe_server}/openapi.json").json()["components"]["schemas"]
    request = schema["PredictRequest"]
    assert "new_nodes" in request["properties"] and "nodes" not in request.get("required", [])
    assert {"new_nodes", "mode", "recomputed"} <= set(schema["PredictResponse"]["properties"])
    assert set(schema["NewNodesBody"]["properties"]) == {"features", "edges", "new_edges"}
