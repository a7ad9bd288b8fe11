"""The one reader of format/version meta files, alone and behind its three users."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from gnnserve.data import layout
from gnnserve.data.meta import read_meta_file
from gnnserve.embeddings import stores as pe_stores
from gnnserve.errors import StoreFormatError
from gnnserve.models import checkpoint

_GOOD = {"format": "thing", "format_version": 3, "value": [1, 2]}


def _read(path: Path, **kw: object) -> dict[str, object]:
    args: dict = {"version": 3, "missing": f"{path} missing here", "format_name": "thing"}
    return read_meta_file(path, "where", **{**args, **kw})


def test_a_good_file_is_returned_whole(tmp_path: Path) -> None:
    (tmp_path / "m.json").write_text(json.dumps(_GOOD))
    assert _read(tmp_path / "m.json") == _GOOD


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"{not json", "m.json is unreadable"),
        (b"\xff\xfe{}", "m.json is unreadable"),  # not UTF-8
        (b"[1, 2]", "m.json is not a thing meta file"),
        (b'"thing"', "m.json is not a thing meta file"),
        (json.dumps({**_GOOD, "format": "other"}).encode(), "m.json is not a thing meta file"),
        (json.dumps({"format_version": 3}).encode(), "m.json is not a thing meta file"),
        (json.dumps({**_GOOD, "format_version": 4}).encode(), "m.json: format version 4, "),
        (json.dumps({**_GOOD, "format_version": "3"}).encode(), "format version '3', "),
        (json.dumps({**_GOOD, "format_version": True}).encode(), "format version True, "),
        (json.dumps({"format": "thing"}).encode(), "format version None, this gnnserve reads 3"),
    ],
)
def test_bad_files_are_format_errors_naming_file_and_field(
    tmp_path: Path, content: bytes, message: str
) -> None:
    (tmp_path / "m.json").write_bytes(content)
    with pytest.raises(StoreFormatError, match=message) as info:
        _read(tmp_path / "m.json")
    assert info.value.field == "where"


def test_missing_file_gets_the_callers_message(tmp_path: Path) -> None:
    with pytest.raises(StoreFormatError, match="m.json missing here") as info:
        _read(tmp_path / "m.json")
    assert info.value.field == "where"


def test_without_a_format_name_any_object_of_the_version_passes(tmp_path: Path) -> None:
    path = tmp_path / "m.json"
    path.write_text(json.dumps({"a": 1}))
    assert _read(path, format_name=None, default_version=3) == {"a": 1}
    with pytest.raises(StoreFormatError, match="format version None"):
        _read(path, format_name=None)  # the version is required without a default
    path.write_text("[1]")
    with pytest.raises(StoreFormatError, match="m.json is not a JSON object"):
        _read(path, format_name=None, default_version=3)


def _store_copy(small_store: Path, tmp_path: Path) -> Path:
    store = tmp_path / "s"
    shutil.copytree(small_store, store, ignore=shutil.ignore_patterns("embeddings"))
    return store


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"\xff\xfe{}", "meta.json is unreadable"),  # raised UnicodeDecodeError before
        (b"[1, 2]", "meta.json is not a JSON object"),
        (b'{"format_version": 2}', "meta.json: format version 2, this gnnserve reads 1"),
        (b'{"name": "x"}', "meta.json is malformed"),  # required fields missing
    ],
)
def test_store_meta_errors(small_store: Path, tmp_path: Path, content: bytes, message: str) -> None:
    store = _store_copy(small_store, tmp_path)
    (store / layout.META).write_bytes(content)
    with pytest.raises(StoreFormatError, match=message) as info:
        layout.read_meta(store)
    assert info.value.field == "store"


def test_store_meta_without_format_version_is_read_as_version_1(
    small_store: Path, tmp_path: Path
) -> None:
    store = _store_copy(small_store, tmp_path)
    doc = json.loads((store / layout.META).read_text())
    del doc["format_version"]
    (store / layout.META).write_text(json.dumps(doc))
    assert layout.read_meta(store) == layout.read_meta(small_store)


def test_checkpoint_and_embeddings_errors_name_their_fields(
    small_ckpt: Path, tmp_path: Path
) -> None:
    ckpt = tmp_path / "ckpt"
    shutil.copytree(small_ckpt, ckpt)
    (ckpt / checkpoint.CONFIG).write_bytes(b"\xff")
    with pytest.raises(StoreFormatError, match="config.json is unreadable") as info:
        checkpoint.load_checkpoint(ckpt)
    assert info.value.field == "model_path"
    (tmp_path / "pes").mkdir()
    (tmp_path / "pes" / pe_stores.META).write_text('{"format": "gnnserve-embeddings"}')
    with pytest.raises(StoreFormatError, match="format version None") as info:
        pe_stores.open_embeddings(tmp_path / "pes")
    assert info.value.field == "embeddings"
