"""The location resolver: paths and file URLs resolve to local paths; other schemes are refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from gnnserve.errors import InvalidInputError
from gnnserve.urls import SUPPORTED, StoreLocation, local_path, resolve


@pytest.mark.parametrize(
    ("given", "path"),
    [
        ("/data/store", "/data/store"),
        ("relative/store", "relative/store"),
        ("store", "store"),
        ("a:b/store", "a:b/store"),  # a colon without "://" is part of a path
        ("file:///data/store", "/data/store"),
        ("FILE:///data/store", "/data/store"),
        ("file://localhost/data/store", "/data/store"),
        ("file:/data/store", "/data/store"),
        ("file:///data/my%20store", "/data/my store"),
        ("file:///", "/"),
    ],
)
def test_paths_and_file_urls_resolve_to_local_paths(given: str, path: str) -> None:
    assert resolve(given, "store.path") == StoreLocation("file", Path(path))
    assert local_path(given, "store.path") == Path(path)


def test_path_objects_and_locations_pass_through(tmp_path: Path) -> None:
    assert resolve(tmp_path, "f") == StoreLocation("file", tmp_path)
    loc = StoreLocation("file", tmp_path)
    assert resolve(loc, "f") is loc
    assert str(loc) == str(tmp_path)


@pytest.mark.parametrize("url", ["http://host/store", "gs://b/x", "hdfs://n/x"])
def test_unknown_scheme_names_the_field_and_the_supported_ones(url: str) -> None:
    with pytest.raises(InvalidInputError) as info:
        resolve(url, "store.path")
    assert info.value.field == "store.path"
    message = info.value.message
    assert url.split(":")[0] in message and "store.path" in message
    assert all(f"{s}://" in message for s in SUPPORTED) and "plain paths" in message


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("file://otherhost/data", "host"),
        ("file:relative/store", "absolute"),
        ("file:///data/store?x=1", "query"),
        ("file:///data/store#frag", "fragment"),
    ],
)
def test_unusable_file_urls_are_refused(url: str, why: str) -> None:
    with pytest.raises(InvalidInputError, match=why) as info:
        resolve(url, "model_path")
    assert info.value.field == "model_path"


def test_s3_urls_resolve_to_bucket_and_prefix() -> None:
    loc = resolve("s3://my-bucket/graphs/sbm%20v2/", "remote")
    assert (loc.scheme, loc.bucket, loc.key) == ("s3", "my-bucket", "graphs/sbm v2")
    assert str(loc) == "s3://my-bucket/graphs/sbm v2"
    assert resolve("s3://bkt", "remote").key == ""


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("s3://", "bucket"),
        ("s3://Bad_Bucket/x", "bucket"),
        ("s3://ab/x", "bucket"),
        ("s3://bucket/x?versionId=1", "query"),
    ],
)
def test_bad_s3_urls_are_refused(url: str, why: str) -> None:
    with pytest.raises(InvalidInputError, match=why) as info:
        resolve(url, "remote")
    assert info.value.field == "remote"


def test_local_openers_refuse_an_object_store_url() -> None:
    with pytest.raises(InvalidInputError, match="--deploy faas --remote") as info:
        local_path("s3://bucket/store", "store.path")
    assert info.value.field == "store.path"
