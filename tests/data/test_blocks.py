"""Blocked objects: a published file above the block size is read back byte-exact through
``get``, ``get_ranges`` and ``size`` (local directory and SeaweedFS), one request per block piece,
and a damaged block or manifest is refused by name."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gnnserve.data import layout
from gnnserve.data.blobs import BlobStore, open_blobs
from gnnserve.data.blocks import MANIFEST, BlockManifest, block_name, split_ranges
from gnnserve.data.publish import publish
from gnnserve.errors import StoreFormatError, StoreTimeoutError
from gnnserve.features.remote import RemoteFeatures

BLOCK = 4096


@settings(max_examples=200, deadline=None)
@given(
    block=st.integers(1, 64),
    ranges=st.lists(st.tuples(st.integers(0, 500), st.integers(1, 200)), min_size=1, max_size=20),
)
def test_split_ranges_pieces_rebuild_each_range(block: int, ranges: list[tuple[int, int]]) -> None:
    data = np.arange(800, dtype=np.int64)
    lo = np.array([a for a, _ in ranges], dtype=np.int64)
    hi = lo + np.array([n for _, n in ranges], dtype=np.int64)
    blk, b_lo, b_hi, owner = split_ranges(lo, hi, block)
    assert np.all((b_lo >= 0) & (b_hi <= block) & (b_lo < b_hi))
    for i, (a, z) in enumerate(zip(lo, hi, strict=True)):
        mine = np.flatnonzero(owner == i)
        assert np.all(np.diff(mine) == 1)  # consecutive, in order
        got = np.concatenate(
            [
                data[b * block + x : b * block + y]
                for b, x, y in zip(blk[mine], b_lo[mine], b_hi[mine], strict=True)
            ]
        )
        np.testing.assert_array_equal(got, data[a:z])


def _check_blocked(blobs: BlobStore, store: Path) -> None:
    """Every file of ``store`` reads back exactly through ``blobs``, ranges across blocks too."""
    manifest = blobs.manifest()
    assert manifest.block_bytes == BLOCK and layout.FEATURES in manifest.objects
    expected = (store / layout.FEATURES).read_bytes()
    assert blobs.size(layout.FEATURES) == len(expected)
    assert blobs.get(layout.FEATURES) == expected
    rng = np.random.default_rng(0)
    lo = rng.integers(0, len(expected) - 1, 300)
    hi = np.minimum(lo + rng.integers(0, 3 * BLOCK, 300), len(expected))
    lo[0], hi[0] = BLOCK - 5, BLOCK + 5  # across one boundary
    lo[1], hi[1] = 7, 7  # empty
    lo[2], hi[2] = 0, len(expected)  # all of it
    before = blobs.stats.requests
    parts = blobs.get_ranges(layout.FEATURES, lo, hi)
    assert parts == [expected[a:b] for a, b in zip(lo, hi, strict=True)]
    pieces = split_ranges(lo[hi > lo], hi[hi > lo], BLOCK)[0].size
    assert blobs.stats.requests - before == pieces  # one request per block piece
    with pytest.raises(StoreFormatError, match="past the end"):
        blobs.get_ranges(layout.FEATURES, [0], [len(expected) + 1])


def test_published_blocks_read_back_exactly(small_store: Path, tmp_path: Path) -> None:
    report = publish(small_store, str(tmp_path / "pub"), progress=False, block_bytes=BLOCK)
    size = (small_store / layout.FEATURES).stat().st_size
    assert report.files[-2:] == [MANIFEST, layout.META] and layout.FEATURES in report.files
    assert not (tmp_path / "pub" / layout.FEATURES).exists()
    assert (tmp_path / "pub" / block_name(layout.FEATURES, 0)).stat().st_size == BLOCK
    assert report.blocks >= -(-size // BLOCK)
    blobs = open_blobs(str(tmp_path / "pub"))
    _check_blocked(blobs, small_store)
    meta = layout.read_blob_meta(blobs)
    ids = np.array([0, 5, meta.num_nodes - 1, 5])
    table = np.fromfile(small_store / layout.FEATURES, dtype=meta.feature_dtype)
    got = RemoteFeatures(blobs, meta).read_counted(ids)[0].numpy()
    np.testing.assert_array_equal(got, table.reshape(meta.num_nodes, -1)[ids])


def test_unblocked_publish_and_damaged_blocks(small_store: Path, tmp_path: Path) -> None:
    report = publish(small_store, str(tmp_path / "whole"), progress=False, block_bytes=0)
    assert MANIFEST not in report.files and report.blocks == 0
    assert open_blobs(str(tmp_path / "whole")).manifest() == BlockManifest()
    publish(small_store, str(tmp_path / "pub"), progress=False, block_bytes=BLOCK)
    last = tmp_path / "pub" / block_name(layout.FEATURES, 1)
    last.write_bytes(last.read_bytes()[:-1])  # a truncated block
    with pytest.raises(StoreFormatError, match="features.bin.blocks/00000001"):
        open_blobs(str(tmp_path / "pub")).get(layout.FEATURES)
    (tmp_path / "pub" / MANIFEST).write_text("{not json")
    with pytest.raises(StoreFormatError, match="malformed blocks.json"):
        open_blobs(str(tmp_path / "pub")).size(layout.FEATURES)


@pytest.mark.distributed
def test_blocks_on_seaweedfs_one_get_per_piece(object_store: Any, small_store: Path) -> None:
    url = f"s3://{object_store.bucket}/blocked"
    publish(small_store, url, object_store.options(), progress=False, block_bytes=BLOCK)
    blobs = open_blobs(url, object_store.options())
    gets = object_store.settled_requests("GET")
    _check_blocked(blobs, small_store)
    sent = blobs.stats.requests + 1  # + the manifest, read once
    assert object_store.wait_requests("GET", gets + sent) - gets == sent
    blobs.deadline_s = 1e-4  # type: ignore[attr-defined]  # range reads only, seconds
    expected = (small_store / layout.FEATURES).read_bytes()
    assert blobs.get(layout.FEATURES) == expected  # a download block by block has no deadline
    with pytest.raises(StoreTimeoutError):
        blobs.get_ranges(
            layout.FEATURES, np.arange(0, 30 * BLOCK, BLOCK), np.arange(1, 30 * BLOCK, BLOCK)
        )
