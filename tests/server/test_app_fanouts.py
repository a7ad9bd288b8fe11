"""Fanouts on every HTTP path (/v1/predict, new-node mode ns, OIP parameters) on a real server."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from gnnserve.engine.loader import build_engine
from gnnserve.fanouts import MAX_FANOUT
from tests.engine.test_engine_newnodes import EDGES, FEATURES, NEW_EDGES, config
from tests.server.conftest import serving
from tests.server.errors import error_of

NEW_NODES = {"features": FEATURES, "edges": EDGES, "new_edges": NEW_EDGES}
NODES = [5, 17, 42, 100, 1999]


@pytest.fixture(scope="module")
def sampled_server(pe_store: Path, small_ckpt: Path) -> Iterator[str]:
    """Serves with PEs and a sampled default (fanouts [2, 2]): a request's fanouts matter."""
    engine = build_engine(config(pe_store, small_ckpt, **{"sampler.fanouts": [2, 2]}))
    with serving(engine, "sage") as url:
        yield url


def _oip(node_ids: list[int], parameters: object = None, output: str = "probs") -> dict:
    body: dict[str, object] = {
        "inputs": [
            {"name": "node_ids", "shape": [len(node_ids)], "datatype": "INT64", "data": node_ids}
        ],
        "outputs": [{"name": output}],
    }
    if parameters is not None:
        body["parameters"] = parameters
    return body


def _oip_new_nodes(parameters: dict[str, object]) -> dict:
    flat = [v for row in FEATURES for v in row]
    return {
        "inputs": [
            {"name": "new_node_features", "shape": [3, 16], "datatype": "FP32", "data": flat},
            {
                "name": "new_node_edges",
                "shape": [len(EDGES), 2],
                "datatype": "INT64",
                "data": [v for e in EDGES for v in e],
            },
        ],
        "parameters": parameters,
    }


HUGE = [2**63, 1]
CASES = [
    ("/v1/predict", {"nodes": [1], "fanouts": HUGE}),
    ("/v1/predict", {"nodes": [1], "fanouts": [2**63 - 1, 1]}),
    ("/v1/predict", {"nodes": [1], "fanouts": [MAX_FANOUT + 1, 1]}),
    ("/v1/predict", {"new_nodes": NEW_NODES, "mode": "ns", "fanouts": HUGE}),
    ("/v1/predict", {"new_nodes": NEW_NODES, "mode": "ns", "fanouts": [-2, 1]}),
    ("/v2/models/sage/infer", _oip_new_nodes({"mode": "ns", "fanouts": HUGE})),
    ("/v2/models/sage/infer", _oip_new_nodes({"mode": "ns", "fanouts": [1e300, 1]})),
    ("/v2/models/sage/infer", _oip_new_nodes({"mode": "ns", "fanouts": "25,10"})),
    ("/v2/models/sage/infer", _oip([1], {"fanouts": HUGE})),
    ("/v2/models/sage/infer", _oip([1], {"fanouts": [1.5, 1]})),
    ("/v2/models/sage/infer", _oip([1], {"fanouts": [3]})),  # one hop, two layers
]


@pytest.mark.parametrize(("path", "body"), CASES)
def test_out_of_range_fanouts_are_400_naming_fanouts(sampled_server, path, body) -> None:
    r = httpx.post(f"{sampled_server}{path}", json=body, timeout=60)
    assert r.status_code == 400, r.text
    err = error_of(r)
    assert err["field"] == "fanouts" and err["kind"] == "invalid_input", err
    assert len(r.content) < 500


def test_infinite_fanout_in_oip_parameters_is_400(sampled_server) -> None:
    raw = json.dumps(_oip([1], {"fanouts": [float("inf"), 1]}))  # Python's json writes Infinity
    r = httpx.post(
        f"{sampled_server}/v2/models/sage/infer",
        content=raw,
        headers={"content-type": "application/json"},
        timeout=60,
    )
    assert r.status_code == 400, r.text
    assert error_of(r)["field"] == "fanouts"


def test_oip_node_ids_request_uses_its_fanouts(sampled_server) -> None:
    """OIP with fanouts [-1, -1] equals /v1/predict with [-1, -1], not the sampled default."""
    want = httpx.post(
        f"{sampled_server}/v1/predict",
        json={"nodes": NODES, "output": "probs", "fanouts": [-1, -1]},
        timeout=60,
    ).json()["predictions"]
    r = httpx.post(
        f"{sampled_server}/v2/models/sage/infer",
        json=_oip(NODES, {"fanouts": [-1, -1]}),
        timeout=60,
    )
    assert r.status_code == 200, r.text
    out = r.json()["outputs"][0]
    assert out["shape"] == [len(NODES), 4]
    np.testing.assert_allclose(np.reshape(out["data"], (len(NODES), 4)), want, atol=1e-6)
    sampled = [
        httpx.post(f"{sampled_server}/v2/models/sage/infer", json=_oip(NODES), timeout=60).json()
        for _ in range(3)
    ]  # the default samples 2 of ~15 neighbours: some answer differs from the full one
    assert any(
        not np.allclose(np.reshape(s["outputs"][0]["data"], (len(NODES), 4)), want, atol=1e-6)
        for s in sampled
    )


@pytest.mark.parametrize(
    "parameters",
    [{"mode": "srpe"}, {"gamma": 0.5}, {"policy": "random"}, {"fanout": [2, 2]}],
)
def test_oip_node_ids_request_refuses_other_parameters(sampled_server, parameters) -> None:
    r = httpx.post(f"{sampled_server}/v2/models/sage/infer", json=_oip([1], parameters), timeout=60)
    assert r.status_code == 400, r.text
    err = error_of(r)
    assert err["field"] == "parameters" and "fanouts" in err["message"], err


@pytest.mark.parametrize("node_ids", [[2000], [1, -1], [2**63 - 1]])
def test_oip_out_of_range_node_id_names_node_ids(sampled_server, node_ids) -> None:
    r = httpx.post(f"{sampled_server}/v2/models/sage/infer", json=_oip(node_ids), timeout=60)
    assert r.status_code == 400, r.text
    assert error_of(r)["field"] == "node_ids"
