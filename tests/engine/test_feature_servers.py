"""`serve --feature-servers N`: features on N Ray actors, placed by FAP, read by routing."""

from __future__ import annotations

import time

import pytest
import ray
import torch

from gnnserve.engine.loader import build_engine
from gnnserve.errors import InvalidInputError
from gnnserve.features.partitioned import RoutedFeatures
from tests.engine.conftest import serve_config

pytestmark = [pytest.mark.distributed, pytest.mark.usefixtures("ray_instance")]


def test_answers_equal_the_full_graph_forward_and_the_servers_stop_with_the_engine(
    small_store, small_ckpt, reference
) -> None:
    logits, _ = reference
    nodes = [0, 5, 17, 1999, 1234, 5]
    overrides = {"store.feature_servers": 3, "store.feature_server_share": 0.5}
    with build_engine(serve_config(small_store, small_ckpt, **overrides)) as engine:
        store = engine.features
        assert isinstance(store, RoutedFeatures) and store.servers == 3
        owner = store.cluster.owner
        replicated = int((owner == -1).sum())
        assert replicated > 0 and all((owner == p).sum() <= 1000 - replicated for p in range(3))
        probs = engine.predict(nodes, "probs").values
        assert store.routed.sum() >= 1 and store.stats.local_rows > 0
        actors = list(store.cluster.actors)
    torch.testing.assert_close(probs, torch.softmax(logits[nodes], 1), atol=1e-5, rtol=0)
    assert all(_dies(a) for a in actors)  # stopped with the engine


def _dies(actor: object, within_s: float = 30.0) -> bool:
    """True once a call on ``actor`` fails because it is dead (ray.kill is asynchronous: a
    call sent just after it may still be answered)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            ray.get(actor.nbytes.remote(), timeout=10)  # type: ignore[attr-defined]
        except ray.exceptions.RayActorError:
            return True
        time.sleep(0.2)
    return False


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"store.feature_servers": 2, "store.feature_server_share": 0.4}, "share"),
        ({"store.feature_servers": 2, "store.tiers": "ram=1M"}, "feature_servers"),
    ],
)
def test_placements_that_cannot_serve_are_refused(small_store, small_ckpt, overrides, field):
    with pytest.raises(InvalidInputError) as info:
        build_engine(serve_config(small_store, small_ckpt, **overrides))
    assert field in (info.value.field or "")
