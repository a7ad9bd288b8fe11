"""Fog start-up profiles kept between runs: a restart with the same graph, model and nodes
reuses the measured profile (no calibration subgraph timed, no link probed) and plans the same;
any change of those keys another profile; an unreadable file is measured again."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from gnnserve.data.generators import sbm
from gnnserve.data.writer import write_store
from gnnserve.deploy.fog.profile_cache import Profile, ProfileCache, profile_key
from gnnserve.deploy.fog.profiler import LatencyModel
from gnnserve.deploy.fog.service import FogService, NodeSpec
from gnnserve.graph import open_graph_store
from gnnserve.graph.base import GraphStore
from tests.deploy.fog.test_service import F, _model

NODES = [NodeSpec("a", None, "wifi"), NodeSpec("b", None, "4g")]


def test_profiles_round_trip_and_bad_files_are_measured_again(tmp_path: Path) -> None:
    cache = ProfileCache(tmp_path)
    profile = Profile([LatencyModel(0.1, 0.02, 1.5), LatencyModel(0.3, 0.01, 0.5)], [0.2, 0.4],
                      [1e6, 2e6])  # fmt: skip
    cache.save("k", profile)
    assert cache.load("k", 2) == profile
    assert cache.load("k", 3) is None  # another node count
    assert cache.load("absent", 2) is None
    (tmp_path / "k.json").write_text("{not json")
    assert cache.load("k", 2) is None


def test_the_key_follows_graph_model_and_nodes() -> None:
    indptr, indices = np.array([0, 1, 2]), np.array([1, 0])
    model = _model()
    key = profile_key(indptr, indices, model, NODES)
    assert key == profile_key(indptr.copy(), indices.copy(), _model(), list(NODES))
    assert key != profile_key(indptr, np.array([1, 1]), model, NODES)
    assert key != profile_key(indptr, indices, _model(hidden=32), NODES)
    assert key != profile_key(indptr, indices, model, [NODES[0], NodeSpec("b", 0.5, "4g")])


@pytest.mark.distributed
def test_a_restart_reuses_the_profile(ray_instance, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    data = sbm(num_nodes=400, num_classes=3, feature_dim=F, avg_degree=8.0, seed=2)
    write_store(data, tmp_path / "store")
    graph: GraphStore = open_graph_store(tmp_path / "store")
    cache, model, x = ProfileCache(tmp_path / "profiles"), _model(), data.x
    timed: list[int] = []

    def start(**options: object) -> FogService:
        svc = FogService(model, graph, x, NODES, "strawman", testbed=False, profiles=cache,
                         **options)  # type: ignore[arg-type]  # fmt: skip
        timed.append(int(not svc.profile_reused))
        return svc

    with start() as first:
        plan = first.membership.copy()
    with start() as second:
        np.testing.assert_array_equal(second.membership, plan)
    assert timed == [1, 0]
    assert len(list((tmp_path / "profiles").glob("*.json"))) == 1


def test_the_default_directory_follows_gnnserve_cache_dir_then_xdg(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from gnnserve.deploy.fog.profile_cache import default_dir

    monkeypatch.setenv("GNNSERVE_CACHE_DIR", str(tmp_path / "own"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_dir() == tmp_path / "own" / "fog"
    monkeypatch.delenv("GNNSERVE_CACHE_DIR")
    assert default_dir() == tmp_path / "xdg" / "gnnserve" / "fog"
