"""TieredFeatures: reads across every tier equal the store's own rows; per-tier counters add up
to the rows read; the cold tier through the remote backend reads only the cold rows."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from gnnserve.data.layout import read_meta
from gnnserve.data.writer import GraphData, write_store
from gnnserve.errors import InvalidInputError
from gnnserve.features import open_feature_store
from gnnserve.features import tiered as tiered_module
from gnnserve.features.placement import tier_plan
from gnnserve.features.tiered import TieredFeatures
from tests.conftest import random_simple_graph

ROW = 16 * 4  # small_store: 16 float32 per row
BUDGETS = {"gpu": 100 * ROW, "ram": 300 * ROW, "disk": 500 * ROW, "remote": None}


def make_plan(n: int, row_bytes: int = ROW, seed: int = 0) -> Any:
    return tier_plan(np.random.default_rng(seed).random(n), row_bytes, BUDGETS)


@pytest.fixture
def tiered(small_store: Path, tmp_path: Path) -> TieredFeatures:
    return TieredFeatures(small_store, make_plan(2000), tier_dir=tmp_path / "tiers")


def test_reads_equal_the_store_across_all_tiers(small_store: Path, tiered: TieredFeatures) -> None:
    ref = open_feature_store(small_store)
    rng = np.random.default_rng(1)
    ids = rng.integers(0, 2000, 3000)  # duplicates
    assert set(np.unique(tiered.plan.tier[ids]).tolist()) == {0, 1, 2, 3}
    assert torch.equal(tiered.get(ids), ref.get(ids))
    for t in range(4):  # each tier alone (no scatter), duplicates included
        one = np.repeat(tiered.plan.nodes[t][::7], 2)
        assert torch.equal(tiered.get(one), ref.get(one))
    assert tiered.get(np.empty(0, dtype=np.int64)).shape == (0, 16)
    assert torch.equal(tiered.get([5, 5, 1999]), ref.get([5, 5, 1999]))  # a list of ints


def test_disk_tier_file_holds_its_rows_in_tier_order(
    small_store: Path, tiered: TieredFeatures, tmp_path: Path
) -> None:
    disk = tiered.plan.nodes[2]
    table = np.fromfile(tmp_path / "tiers" / "disk.bin", dtype="<f4").reshape(-1, 16)
    np.testing.assert_array_equal(table, open_feature_store(small_store).get(disk).numpy())
    media = {c.tier: c.medium for c in tiered.stats().tiers}
    gpu = "cuda" if torch.cuda.is_available() else "host"
    assert media == {"gpu": gpu, "ram": "host", "disk": "mmap", "remote": "mmap-store"}
    held = {c.tier: (c.resident_rows, c.resident_bytes) for c in tiered.stats().tiers}
    assert held == {"gpu": (100, 100 * ROW), "ram": (300, 300 * ROW), "disk": (500, 500 * ROW),
                    "remote": (1100, 0)}  # fmt: skip


def test_counters_add_up_to_the_rows_read(tiered: TieredFeatures) -> None:
    rng = np.random.default_rng(2)
    expected = np.zeros(4, dtype=np.int64)
    for size in (1, 50, 2500, 0):
        ids = rng.integers(0, 2000, size)
        tiered.get(ids)
        expected += np.bincount(tiered.plan.tier[ids], minlength=4)
    stats = tiered.stats()
    assert stats.reads == 4 and stats.rows_read == 2551
    assert [c.rows_read for c in stats.tiers] == expected.tolist()
    assert [c.bytes_read for c in stats.tiers] == (expected * ROW).tolist()
    assert stats.hit_rate("ram") == pytest.approx(expected[1] / 2551)
    text = tiered.metrics.render().decode()
    for name, rows in zip(("gpu", "ram", "disk", "remote"), expected.tolist(), strict=True):
        hits = f'gnnserve_features_tier_hits_total{{placement="0",tier="{name}"}}'
        read = f'gnnserve_features_tier_bytes_total{{placement="0",tier="{name}"}}'
        assert f"{hits} {float(rows)}" in text and f"{read} {float(rows * ROW)}" in text
    assert 'gnnserve_features_tier_rows{tier="disk"} 500.0' in text
    assert 'gnnserve_features_tier_resident_bytes{tier="ram"} 19200.0' in text


@pytest.mark.parametrize(
    "ids", [[-1], [2000], [0.5], [[1, 2]], np.array([3, 2000], dtype=np.int32)]
)
def test_bad_ids_raise(tiered: TieredFeatures, ids: Any) -> None:
    with pytest.raises(InvalidInputError) as err:
        tiered.get(ids)
    assert err.value.field == "ids"
    assert tiered.stats().reads == 0


def test_cold_tier_through_the_remote_backend_reads_only_cold_rows(
    small_store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tiered_module, "_CHUNK_ROWS", 64)  # tiers filled in several chunks
    plan = make_plan(2000, seed=3)
    tiered = TieredFeatures(small_store.as_uri(), plan)
    assert tiered.stats().tiers[3].medium == "remote"
    blobs = tiered.source.blobs  # type: ignore[attr-defined]
    before = blobs.stats.bytes_read
    ids = np.random.default_rng(4).integers(0, 2000, 800)
    assert torch.equal(tiered.get(ids), open_feature_store(small_store).get(ids))
    cold = np.unique(ids[plan.tier[ids] == 3])
    assert blobs.stats.bytes_read - before == cold.size * ROW
    tier_dir = tiered._tier_dir
    assert (tier_dir / "disk.bin").is_file()
    tiered.close()
    assert not tier_dir.exists()


def test_float16_store_and_from_scores(tmp_path: Path) -> None:
    n = 300
    rng = np.random.default_rng(5)
    x = rng.standard_normal((n, 8)).astype(np.float32)
    data = GraphData("f16", n, random_simple_graph(n, 2000, seed=1), x, None, None, None, None)
    write_store(data, tmp_path / "f16", feature_dtype="float16")
    scores = rng.random(n)
    budgets = {"ram": 40 * 16, "disk": 100 * 16, "remote": None}  # 8 float16 = 16 bytes a row
    tiered = TieredFeatures.from_scores(tmp_path / "f16", scores, budgets)
    assert tiered.plan.sizes() == {"ram": 40, "disk": 100, "remote": 160}
    ids = rng.integers(0, n, 500)
    ref = open_feature_store(tmp_path / "f16", "mmap").get(ids)
    assert torch.equal(tiered.get(ids), ref)
    assert tiered.stats().tiers[1].resident_bytes == 100 * 16
    assert tiered.stats().tiers[0].bytes_read == int((tiered.plan.tier[ids] == 0).sum()) * 16


def test_bad_plans_raise(small_store: Path) -> None:
    with pytest.raises(InvalidInputError, match="1999 nodes") as err:
        TieredFeatures(small_store, make_plan(1999))
    assert err.value.field == "plan"
    plan = tier_plan(np.ones(2000), ROW, {"nvme": 10 * ROW, "remote": None})
    with pytest.raises(InvalidInputError, match="nvme"):
        TieredFeatures(small_store, plan)


def test_gpu_tier_without_cuda_is_held_in_host_memory(
    small_store: Path, caplog: pytest.LogCaptureFixture
) -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with caplog.at_level(logging.WARNING):
        tiered = TieredFeatures(small_store, make_plan(2000))
    assert "no CUDA device" in caplog.text
    ids = tiered.plan.nodes[0]
    assert torch.equal(tiered.get(ids), open_feature_store(small_store).get(ids))


@pytest.mark.gpu
def test_gpu_tier_on_cuda(small_store: Path) -> None:
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    tiered = TieredFeatures(small_store, make_plan(2000))
    assert tiered.stats().tiers[0].medium == "cuda"
    ids = np.random.default_rng(6).integers(0, 2000, 4000)
    out = tiered.get(ids)
    assert out.device.type == "cpu"
    assert torch.equal(out, open_feature_store(small_store).get(ids))


@pytest.mark.distributed
def test_cold_tier_on_an_s3_object_store(object_store: Any, small_store: Path) -> None:
    from gnnserve.data.publish import publish

    url = f"s3://{object_store.bucket}/tiered/small"
    publish(small_store, url, object_store.options(), progress=False)
    plan = make_plan(2000, seed=7)
    tiered = TieredFeatures(url, plan, options=object_store.options())
    assert tiered.meta.checksum == read_meta(small_store).checksum
    ids = np.random.default_rng(8).integers(0, 2000, 600)
    assert torch.equal(tiered.get(ids), open_feature_store(small_store).get(ids))
    assert tiered.stats().tiers[3].medium == "remote"
