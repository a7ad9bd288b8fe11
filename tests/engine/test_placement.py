"""Serving from FAP-placed feature tiers: exact answers, tier counters in /metrics, and a
re-placement learned from the seeds served."""

from __future__ import annotations

from pathlib import Path

import httpx
import numpy as np
import pytest
import torch

from gnnserve.config import ServeConfig
from gnnserve.engine.loader import build_engine
from gnnserve.engine.placement import TierRefresher, parse_tiers
from gnnserve.errors import InvalidInputError
from gnnserve.features import open_feature_store
from gnnserve.features.tiered import TieredFeatures
from tests.engine.conftest import serve_config
from tests.server.conftest import serving

ROW = 16 * 4  # the small store's float32 rows


def _config(store: Path, ckpt: Path, **overrides: object) -> ServeConfig:
    return serve_config(store, ckpt, **{"store.tiers": f"ram={200 * ROW}", **overrides})  # 10%


def test_parse_tiers() -> None:
    assert parse_tiers("ram=256M, disk=1.5G") == {
        "ram": 256 * 2**20,
        "disk": 1.5 * 2**30,
        "remote": None,
    }
    assert parse_tiers("gpu=1KiB,ram=2kb") == {"gpu": 1024, "ram": 2048, "remote": None}
    for bad, why in [
        ("ram", "NAME=SIZE"),
        ("ram=1X", "NAME=SIZE"),
        ("cache=1G", "unknown tier"),
        ("remote=1G", "unknown tier"),
        ("ram=1G,ram=2G", "twice"),
        ("disk=1G,ram=1M", "fastest first"),
    ]:
        with pytest.raises(InvalidInputError, match=why):
            parse_tiers(bad)


def test_tiered_engine_answers_exactly_and_counts_tiers(small_store, small_ckpt, reference) -> None:
    logits, _ = reference
    nodes = [5, 17, 1999, 0, 1234]
    with build_engine(_config(small_store, small_ckpt)) as engine:
        assert isinstance(engine.features, TieredFeatures)
        assert engine.features.plan.sizes() == {"ram": 200, "remote": 1800}
        probs = engine.predict(nodes, "probs").values
        stats = engine.features.stats()
    torch.testing.assert_close(probs, torch.softmax(logits[nodes], 1), atol=1e-5, rtol=0)
    assert stats.tiers[0].rows_read > 0 and stats.tiers[1].rows_read > 0


def test_tier_counters_are_in_metrics(small_store, small_ckpt) -> None:
    with serving(build_engine(_config(small_store, small_ckpt))) as url:
        r = httpx.post(f"{url}/v1/predict", json={"nodes": [1, 2, 3]}, timeout=30)
        assert r.status_code == 200
        text = httpx.get(f"{url}/metrics", timeout=30).text
    hits = {  # {placement="0",tier="ram"} value
        line.split('"')[3]: float(line.split()[-1])
        for line in text.splitlines()
        if line.startswith('gnnserve_features_tier_hits_total{placement="0"')
    }
    assert set(hits) == {"ram", "remote"} and sum(hits.values()) > 0
    assert "gnnserve_batch_size" in text  # the server's own metrics are still there


def test_tiers_refuse_an_update_log(small_store, small_ckpt, tmp_path: Path) -> None:
    config = _config(small_store, small_ckpt, **{"store.update_log": str(tmp_path / "log")})
    with pytest.raises(InvalidInputError, match="tiers"):
        build_engine(config)


def test_refresh_places_the_served_seeds_in_ram(small_store, small_ckpt) -> None:
    """20 popular seeds (fanouts 3,2): with p0 learned from them the RAM tier (10% of the rows)
    serves more than twice the share of their reads it served under uniform p0 (0.16 -> 0.43
    when written)."""
    popular = np.arange(40, 60)
    engine = build_engine(_config(small_store, small_ckpt, **{"sampler.fanouts": [3, 2]}))
    refresher = TierRefresher(engine, parse_tiers(f"ram={200 * ROW}"), interval_s=3600)
    with engine:
        refresher.start()
        before = engine.features
        assert isinstance(before, TieredFeatures)
        assert not refresher.refresh()  # nothing served yet: nothing to learn
        for _ in range(30):
            engine.predict(popular.tolist())
        assert refresher.refresh() and refresher.placements == 1
        after = engine.features
        assert isinstance(after, TieredFeatures) and after is not before
        for _ in range(30):
            engine.predict(popular.tolist())
        hit_before, hit_after = before.stats().hit_rate("ram"), after.stats().hit_rate("ram")
        assert hit_after > 2 * hit_before  # the learned p0 put more of their reads in RAM
        ids = np.arange(0, 2000, 7)
        torch.testing.assert_close(after.get(ids), open_feature_store(small_store).get(ids))
    assert not refresher._thread.is_alive()  # stopped with the engine
    # one set of counters across placements: the first one's reads are still there, by number
    assert after.metrics is before.metrics and after.placement == "1"
    text = after.metrics.render().decode()
    for number, store in (("0", before), ("1", after)):
        for tier in store.stats().tiers:
            series = f'{{placement="{number}",tier="{tier.tier}"}} {float(tier.rows_read)}'
            assert f"gnnserve_features_tier_hits_total{series}" in text
    assert "gnnserve_features_placement 1.0" in text
