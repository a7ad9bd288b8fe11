"""The Grafana dashboard's request, batch, sampling, cache, tier and freshness panels query
metrics real servers export (the deployment modes' rows: in each mode's served test)."""

from __future__ import annotations

import json
from pathlib import Path

import httpx

from gnnserve.config import ServeConfig
from gnnserve.engine.loader import build_engine
from tests.dashboard import DASHBOARD, dashboard_metrics, exported_names
from tests.server.conftest import serving


def _traffic(url: str, updates: bool) -> str:
    """Requests that make every local metric appear (a shed one included); /metrics after."""
    for _ in range(2):  # the second is an answer-cache hit
        assert httpx.post(f"{url}/v1/predict", json={"nodes": [1, 2]}).status_code == 200
    assert httpx.post(f"{url}/v1/predict", json={"nodes": [-1]}).status_code == 400
    if updates:
        ops = {"ops": [{"op": "add_edge", "src": 1, "dst": 2}]}
        assert httpx.post(f"{url}/v1/graph/updates", json=ops).status_code == 200
    return httpx.get(f"{url}/metrics").text


def test_every_local_panel_queries_exported_metrics(
    pe_store: Path, small_store: Path, small_ckpt: Path, tmp_path: Path
) -> None:
    """Two servers between them light every local panel: one with an update log, precomputed
    embeddings kept fresh and an answer cache; one with feature tiers."""
    base = {"model_path": str(small_ckpt), "sampler.fanouts": [-1, -1]}
    fresh = ServeConfig.load(
        None,
        **base,
        **{"store.path": str(pe_store), "store.update_log": str(tmp_path / "u.log")},
        **{"compute.result_cache_mb": 8},
    )
    tiered = ServeConfig.load(
        None, **base, **{"store.path": str(small_store), "store.tiers": "ram=0.5"}
    )
    names: set[str] = set()
    for config, updates in ((fresh, True), (tiered, False)):
        with serving(build_engine(config)) as url:
            names |= exported_names(_traffic(url, updates))
    used = dashboard_metrics(None)
    assert {"gnnserve_requests_total", "gnnserve_result_cache_hits"} <= used
    assert sorted(used - names) == []


def test_the_dashboard_is_grafana_json_with_a_panel_per_topic() -> None:
    dash = json.loads(DASHBOARD.read_text())
    titles = [p["title"] for p in dash["panels"]]
    for topic in ("Request rate", "Latency", "429", "Queue depth", "Batch size", "sampling path",
                  "cache hit rate", "Update lag", "DGS", "CGP", "FaaS", "Fog"):  # fmt: skip
        assert any(topic.lower() in t.lower() for t in titles), topic
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dash["panels"]:
        if panel["type"] != "row":
            assert panel["targets"] and all(t["expr"] for t in panel["targets"])
