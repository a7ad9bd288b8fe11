"""publish: every file byte-identical at the destination (directory and SeaweedFS), meta.json
last, the self-loop table, refusals."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gnnserve.data import layout
from gnnserve.data.blobs import open_blobs
from gnnserve.data.publish import SELF_LOOPS, publish, self_loop_ids
from gnnserve.errors import InvalidInputError, StoreFormatError


def _expected_files(store: Path) -> list[str]:
    return [p.name for p in layout.data_files(store, layout.read_meta(store))]


def _check_round_trip(store: Path, url: str, options: dict[str, str] | None) -> None:
    report = publish(store, url, options, progress=False)
    assert report.files == [*_expected_files(store), SELF_LOOPS, layout.META]
    blobs = open_blobs(url, options)
    assert blobs.names() == sorted(report.files)
    for name in report.files[:-2] + [layout.META]:
        assert blobs.get(name) == (store / name).read_bytes(), name
    meta = layout.read_meta(store)
    indptr = np.fromfile(store / layout.INDPTR, dtype=np.int64)
    indices = np.fromfile(store / layout.INDICES, dtype=meta.indices_dtype)
    loops = np.load(io.BytesIO(blobs.get(SELF_LOOPS)), allow_pickle=False)
    np.testing.assert_array_equal(loops, self_loop_ids(indptr, indices))
    sizes = [len(blobs.get(name)) for name in report.files]
    assert report.bytes == sum(sizes) and report.seconds > 0


def test_publish_to_a_directory_round_trip(small_store: Path, tmp_path: Path) -> None:
    _check_round_trip(small_store, (tmp_path / "pub").as_uri(), None)


@pytest.mark.distributed
def test_publish_to_s3_round_trip(object_store: Any, small_store: Path) -> None:
    _check_round_trip(small_store, f"s3://{object_store.bucket}/pub/small", object_store.options())


@pytest.mark.distributed
def test_publish_refusals_and_overwrite(
    object_store: Any, small_store: Path, tmp_path: Path
) -> None:
    url, options = f"s3://{object_store.bucket}/pub/again", object_store.options()
    publish(small_store, url, options, progress=False)
    with pytest.raises(InvalidInputError, match="not empty") as info:
        publish(small_store, url, options, progress=False)
    assert info.value.field == "to"
    changed = tmp_path / "changed"
    shutil.copytree(small_store, changed)
    doc = json.loads((changed / layout.META).read_text())
    (changed / layout.META).write_text(json.dumps(doc, indent=7))  # same store, other bytes
    publish(changed, url, options, overwrite=True, progress=False)
    assert open_blobs(url, options).get(layout.META) == (changed / layout.META).read_bytes()
    with pytest.raises(StoreFormatError, match="not a gnnserve store"):
        publish(tmp_path / "nothing", f"s3://{object_store.bucket}/pub/none", options)
    assert open_blobs(f"s3://{object_store.bucket}/pub/none", options).names() == []


def test_publish_refuses_a_directory_that_is_not_a_store(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / layout.INDPTR).write_bytes(b"\0" * 16)
    with pytest.raises(StoreFormatError, match="not a gnnserve store"):
        publish(tmp_path / "src", str(tmp_path / "out"), progress=False)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("chunk", [1, 3, 1 << 23])
def test_self_loop_ids_match_a_plain_loop(chunk: int) -> None:
    rng = np.random.default_rng(chunk)
    degrees = rng.integers(0, 5, 200)
    indptr = np.concatenate([[0], np.cumsum(degrees)])
    indices = rng.integers(0, 10, int(indptr[-1]))  # many loops among vertices 0..9
    want = [v for v in range(200) for u in indices[indptr[v] : indptr[v + 1]] if u == v]
    np.testing.assert_array_equal(self_loop_ids(indptr, indices, chunk_edges=chunk), want)
