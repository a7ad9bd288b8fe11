"""Several models over one graph (`serve --model NAME=CKPT` repeated, a real server process) and
the repository extension: each model answers as its own full-graph forward, shares the graph,
features and samplers in memory, and a new version is swapped in under load with no request
failed and every answer from the version it names."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch

from gnnserve.config import ServeConfig
from gnnserve.demo import start_server, stop_server, wait_ready
from gnnserve.errors import InvalidInputError
from gnnserve.features import open_feature_store
from gnnserve.graph import open_graph_store
from gnnserve.models.checkpoint import load_checkpoint
from gnnserve.ports import free_port
from gnnserve.server.models import build_models
from tests.conftest import make_checkpoint
from tests.server.errors import error_of

NODES = [0, 7, 99, 1234, 7]


def _full_graph_probs(store: Path, ckpt: Path) -> tuple[str, np.ndarray]:
    """(model version, softmax of a plain full-graph forward) of ``ckpt`` on ``store``."""
    graph = open_graph_store(store)
    indptr, indices = graph.csr()
    dst = np.repeat(np.arange(graph.num_nodes), np.diff(indptr))
    edge_index = torch.from_numpy(np.stack([np.asarray(indices, np.int64), dst]))
    x = open_feature_store(store).get(np.arange(graph.num_nodes))
    loaded = load_checkpoint(ckpt)
    with torch.inference_mode():
        return loaded.version, torch.softmax(loaded.model(x, edge_index), 1).numpy()


@pytest.fixture(scope="module")
def two_models(
    small_store: Path, small_ckpt: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, Path]]:
    """A server of 'sage' (the session checkpoint) and 'gcn' over one graph; (URL, work dir)."""
    work = tmp_path_factory.mktemp("models")
    gcn = make_checkpoint(small_store, work / "gcn", arch="gcn", seed=3)
    port = free_port()
    flags = ["--name", "sage", "--model", f"gcn={gcn}", "--fanouts=-1,-1"]
    proc = start_server(small_store, small_ckpt, port, *flags)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, proc)
        yield url, work
    finally:
        assert stop_server(proc) == 0


def _infer(url: str, model: str, nodes: list[int], version: str | None = None) -> httpx.Response:
    path = f"/v2/models/{model}" + (f"/versions/{version}" if version else "") + "/infer"
    tensor = {"name": "node_ids", "shape": [len(nodes)], "datatype": "INT64", "data": nodes}
    body = {"inputs": [tensor], "outputs": [{"name": "probs"}]}
    return httpx.post(url + path, json=body, timeout=60)


def _probs(r: httpx.Response) -> tuple[str, np.ndarray]:
    assert r.status_code == 200, r.text
    out = r.json()["outputs"][0]
    return r.json()["model_version"], np.array(out["data"]).reshape(out["shape"])


def test_each_model_answers_as_its_own_full_graph_forward(
    two_models: tuple[str, Path], small_store: Path, small_ckpt: Path
) -> None:
    url, work = two_models
    for name, ckpt in (("sage", small_ckpt), ("gcn", work / "gcn")):
        version, want = _full_graph_probs(small_store, ckpt)
        got_version, got = _probs(_infer(url, name, NODES))
        assert got_version == version
        np.testing.assert_allclose(got, want[NODES], atol=1e-5)
        v1 = httpx.post(
            f"{url}/v1/predict", json={"nodes": NODES, "output": "probs", "model": name}
        )
        assert v1.json()["model"] == name and v1.json()["model_version"] == version
        np.testing.assert_allclose(v1.json()["predictions"], want[NODES], atol=1e-5)
    default = httpx.post(f"{url}/v1/predict", json={"nodes": [1]}).json()
    assert default["model"] == "sage"
    index = httpx.get(f"{url}/v2/repository/index").json()
    assert [(m["name"], m["state"]) for m in index] == [("sage", "READY"), ("gcn", "READY")]
    r = _infer(url, "nope", [1])
    assert r.status_code == 404 and "['sage', 'gcn']" in error_of(r)["message"]


def test_a_new_version_swaps_in_under_load_without_a_failed_request(
    two_models: tuple[str, Path], small_store: Path
) -> None:
    """Four clients keep asking 'gcn' while a retrained checkpoint is loaded: every request is
    answered, each answer equals the full-graph forward of the version it names, both
    versions answer, and afterwards only the new one is served."""
    url, work = two_models
    old_version, old = _full_graph_probs(small_store, work / "gcn")
    retrained = make_checkpoint(small_store, work / "gcn_v2", arch="gcn", seed=4)
    new_version, new = _full_graph_probs(small_store, retrained)
    assert new_version != old_version
    want = {old_version: old[NODES], new_version: new[NODES]}
    answers: list[tuple[str, np.ndarray]] = []
    failures: list[str] = []
    loaded = threading.Event()

    def client() -> None:
        seen_new = 0
        while seen_new < 5:  # until the new version answered a few times after the load
            r = _infer(url, "gcn", NODES)
            if r.status_code != 200:
                failures.append(r.text)
                return
            answers.append(_probs(r))
            seen_new += loaded.is_set() and answers[-1][0] == new_version

    threads = [threading.Thread(target=client) for _ in range(4)]
    for t in threads:
        t.start()
    while len(answers) < 8 and not failures:
        threading.Event().wait(0.01)
    body = {"parameters": {"checkpoint": str(retrained)}}
    r = httpx.post(f"{url}/v2/repository/models/gcn/load", json=body, timeout=120)
    loaded.set()
    for t in threads:
        t.join(120)
    assert r.status_code == 200 and r.json() == {"name": "gcn", "version": new_version}, r.text
    assert failures == []
    for version, probs in answers:
        np.testing.assert_allclose(probs, want[version], atol=1e-5)
    assert {v for v, _ in answers} == {old_version, new_version}
    assert _probs(_infer(url, "gcn", NODES, version=new_version))[0] == new_version
    r = _infer(url, "gcn", NODES, version=old_version)
    assert r.status_code == 404 and "no version" in r.json()["error"]


def test_unload_then_load_again(two_models: tuple[str, Path], small_store: Path) -> None:
    url, _ = two_models
    assert httpx.post(f"{url}/v2/repository/models/gcn/unload", timeout=60).status_code == 200
    assert _infer(url, "gcn", [1]).status_code == 404
    index = {m["name"]: m for m in httpx.get(f"{url}/v2/repository/index").json()}
    assert index["gcn"]["state"] == "UNAVAILABLE" and index["sage"]["state"] == "READY"
    assert httpx.get(f"{url}/v2/health/ready").status_code == 200  # the loaded ones are
    last = httpx.post(f"{url}/v2/repository/models/sage/unload", timeout=60)
    assert last.status_code == 409 and "only one loaded" in last.json()["error"]
    bad = httpx.post(f"{url}/v2/repository/models/gcn/load", json={"parameters": {"x": 1}})
    assert bad.status_code == 400 and "unknown parameters" in bad.json()["error"]
    missing = {"parameters": {"checkpoint": "/no/such/checkpoint"}}
    bad = httpx.post(f"{url}/v2/repository/models/gcn/load", json=missing, timeout=60)
    assert bad.status_code == 400 and bad.json()["kind"] == "model_load_failed", bad.text
    assert "not found" in bad.json()["error"]
    assert _infer(url, "gcn", [1]).status_code == 404  # still unloaded, nothing half-built
    assert httpx.post(f"{url}/v2/repository/models/gcn/load", timeout=120).status_code == 200
    assert _probs(_infer(url, "gcn", NODES))[1].shape == (len(NODES), 4)
    assert _probs(_infer(url, "sage", NODES))[1].shape == (len(NODES), 4)


def test_models_share_the_graph_features_and_samplers(
    small_store: Path, small_ckpt: Path, tmp_path: Path
) -> None:
    """What a second model adds is its own: the graph, features and planner (samplers,
    pre-samples) are the first model's objects; a model with another depth samples with its
    training fanouts; bad combinations are refused naming the option."""
    gcn = make_checkpoint(small_store, tmp_path / "gcn", arch="gcn", seed=3)
    config = ServeConfig.load(
        None,
        **{
            "store.path": str(small_store),
            "model_path": str(small_ckpt),
            "models": {"gcn": str(gcn)},
        },
    )
    models = build_models(config)
    try:
        first, second = models.engines()
        assert second.graph is first.graph and second.features is first.features
        assert second.planner is first.planner and second.runner is not first.runner
        assert second.answer_cache is not first.answer_cache or first.answer_cache is None
    finally:
        models.stop()
    tiered = config.model_copy(deep=True)
    tiered.store.tiers = "ram=1.0"
    with pytest.raises(InvalidInputError, match="--tiers"):
        build_models(tiered)


def test_tritonclient_drives_the_repository(two_models: tuple[str, Path]) -> None:
    """Triton's own client: index, load (a reload of the same checkpoint: same version), the
    readiness it reports, and an unload of an unknown model as its exception."""
    import tritonclient.http as triton
    from tritonclient.utils import InferenceServerException

    url, _ = two_models
    client = triton.InferenceServerClient(url=url.removeprefix("http://"))
    index = {m["name"]: m for m in client.get_model_repository_index()}
    assert {"sage", "gcn"} <= set(index) and index["sage"]["state"] == "READY"
    client.load_model("sage")
    assert client.get_model_metadata("sage")["versions"] == [index["sage"]["version"]]
    assert client.is_model_ready("sage")
    with pytest.raises(InferenceServerException) as info:
        client.unload_model("nope")
    assert info.value.status() == "404" and "not loaded" in info.value.message()
