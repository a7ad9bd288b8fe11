"""A per-request ``seed`` for existing nodes: the same seed gives the same answer, equal to the
sampler's draws for that seed run outside the server; without one every request draws anew."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch

from gnnserve.engine.loader import build_engine
from gnnserve.features import open_feature_store
from gnnserve.graph import open_graph_store
from gnnserve.models.checkpoint import load_checkpoint
from gnnserve.sampling.sampler import NeighborSampler
from tests.engine.test_engine_newnodes import config
from tests.server.conftest import serving

NODES = [5, 17, 42, 100, 1999, 17]
FANOUTS = [2, 2]  # ~15 neighbours a node: two draws of 2 rarely agree everywhere


@pytest.fixture(scope="module", params=[False, True], ids=["on-demand", "presample"])
def server(request, small_store: Path, small_ckpt: Path) -> Iterator[str]:
    """The sampled default on demand, and served by DGS reservoirs (a seed bypasses them)."""
    overrides = {"sampler.fanouts": FANOUTS, "sampler.presample": request.param}
    with serving(build_engine(config(small_store, small_ckpt, **overrides))) as url:
        yield url


def _probs(base: str, nodes: list[int], **extra: object) -> np.ndarray:
    r = httpx.post(
        f"{base}/v1/predict", json={"nodes": nodes, "output": "probs", **extra}, timeout=60
    )
    assert r.status_code == 200, r.text
    return np.asarray(r.json()["predictions"], np.float64)


def _reference(store: Path, ckpt: Path, nodes: list[int], seed: int) -> np.ndarray:
    """Probabilities from the sampler's draws for ``seed`` and the model, outside the server."""
    graph, features = open_graph_store(store), open_feature_store(store)
    model = load_checkpoint(ckpt).model.eval()
    sg = NeighborSampler(graph, FANOUTS).sample(np.asarray(nodes), rng_seed=seed)
    x = features.get(sg.input_nodes)
    degree = torch.from_numpy(graph.gcn_degree(sg.input_nodes))
    with torch.inference_mode():
        logits, _ = model.forward_blocks(x, sg.blocks, degree)
    return torch.softmax(logits[torch.from_numpy(sg.seed_rows)], 1).numpy()


def test_the_same_seed_gives_the_sampler_s_answer_every_time(
    server: str, small_store: Path, small_ckpt: Path
) -> None:
    want = _reference(small_store, small_ckpt, NODES, 7)
    for _ in range(3):
        np.testing.assert_allclose(_probs(server, NODES, seed=7), want, atol=1e-6)
    one = _reference(small_store, small_ckpt, [42], 7)  # a node's answer: not its batch's
    np.testing.assert_allclose(_probs(server, [42], seed=7), one, atol=1e-6)
    np.testing.assert_allclose(one, want[[2]], atol=1e-6)


def test_seeded_requests_batched_together_keep_their_own_draws(server: str) -> None:
    """Concurrent requests with different seeds (and none) ride in batches of one seed each."""
    alone = {s: _probs(server, NODES, seed=s) for s in (1, 2)}
    assert not np.allclose(alone[1], alone[2], atol=1e-6)  # the seed decides the draws

    async def burst() -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=60) as client:
            bodies = [{"nodes": NODES, "output": "probs", "seed": 1 + i % 2} for i in range(12)]
            bodies += [{"nodes": NODES, "output": "probs"}] * 4
            return await asyncio.gather(
                *(client.post(f"{server}/v1/predict", json=b) for b in bodies)
            )

    answers = asyncio.run(burst())
    for i, r in enumerate(answers[:12]):
        got = np.asarray(r.json()["predictions"])
        np.testing.assert_allclose(got, alone[1 + i % 2], atol=1e-6)


def test_a_bad_seed_is_400_naming_seed(server: str) -> None:
    for seed in (2**64, 1.5, "7"):
        r = httpx.post(f"{server}/v1/predict", json={"nodes": [1], "seed": seed}, timeout=60)
        assert r.status_code in (400, 422), r.text
        assert r.json()["error"]["field"] == "seed", r.text


def test_oip_node_ids_take_a_seed(server: str) -> None:
    body = {
        "inputs": [{"name": "node_ids", "shape": [len(NODES)], "datatype": "INT64", "data": NODES}],
        "outputs": [{"name": "probs"}],
        "parameters": {"seed": 7},
    }
    r = httpx.post(f"{server}/v2/models/default/infer", json=body, timeout=60)
    if r.status_code == 404:
        r = httpx.post(f"{server}/v2/models/sage/infer", json=body, timeout=60)
    assert r.status_code == 200, r.text
    got = np.reshape(r.json()["outputs"][0]["data"], (len(NODES), -1))
    np.testing.assert_allclose(got, _probs(server, NODES, seed=7), atol=1e-6)
