"""The s3 blob store against a real SeaweedFS (the session's ``object_store``): exact ranges, one
GET per range as the server counts them, whole objects, streamed multipart uploads, clear errors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gnnserve.data.blobs import open_blobs
from gnnserve.data.publish import publish
from gnnserve.data.seaweed import free_ports
from gnnserve.errors import InvalidInputError, StoreFormatError
from tests.conftest import python_output

pytestmark = pytest.mark.distributed
SIZE = 100_000


@pytest.fixture(scope="module")
def uploaded(object_store: Any) -> tuple[Any, bytes]:
    """A 100 kB random object ``x.bin`` under s3://<bucket>/ranges."""
    blobs = open_blobs(f"s3://{object_store.bucket}/ranges", object_store.options())
    data = np.random.default_rng(0).bytes(SIZE)
    blobs.put("x.bin", data)
    blobs.manifest()  # the one GET for the block manifest (absent here), before any counting
    return blobs, data


def test_ranges_equal_slices_one_get_each(object_store: Any, uploaded: tuple[Any, bytes]) -> None:
    blobs, data = uploaded
    rng = np.random.default_rng(1)
    starts = rng.integers(0, SIZE, 60)
    ends = np.minimum(starts + rng.integers(0, 5000, 60), SIZE)
    starts[0], ends[0] = SIZE - 1, SIZE  # the last byte
    starts[1], ends[1] = 10, 10  # empty: no request
    starts[2], ends[2] = 0, SIZE  # all of it
    starts[3], ends[3] = starts[4], ends[4]  # the same range twice: fetched twice
    nonempty = int(np.sum(ends > starts))
    before, gets = blobs.stats.requests, object_store.settled_requests("GET")
    read_before = blobs.stats.bytes_read
    parts = blobs.get_ranges("x.bin", starts, ends)
    assert parts == [data[a:b] for a, b in zip(starts, ends, strict=True)]
    seen = object_store.wait_requests("GET", gets + nonempty) - gets
    assert seen == nonempty  # the server saw exactly these
    assert blobs.stats.requests - before == 60
    assert blobs.stats.bytes_read - read_before == int(np.sum(ends - starts))
    assert blobs.get_ranges("x.bin", [], []) == []


def test_whole_objects_names_and_sizes(uploaded: tuple[Any, bytes]) -> None:
    blobs, data = uploaded
    before = blobs.stats.requests, blobs.stats.bytes_read
    assert blobs.get("x.bin") == data
    assert (blobs.stats.requests, blobs.stats.bytes_read) == (before[0] + 1, before[1] + SIZE)
    assert blobs.size("x.bin") == SIZE
    assert blobs.names() == ["x.bin"]


def test_missing_objects_and_ranges_past_the_end(uploaded: tuple[Any, bytes]) -> None:
    blobs, _ = uploaded
    for call in (lambda: blobs.size("nope.bin"), lambda: blobs.get("nope.bin")):
        with pytest.raises(StoreFormatError, match="'nope.bin' not found"):
            call()
    with pytest.raises(StoreFormatError, match="'nope.bin' not found"):
        blobs.get_ranges("nope.bin", [0], [4])
    for start, end in ((SIZE - 5, SIZE + 1), (SIZE, SIZE + 1), (SIZE + 10, SIZE + 20)):
        with pytest.raises(StoreFormatError, match=f"range end {end} past the end"):
            blobs.get_ranges("x.bin", [0, start], [1, end])
    with pytest.raises(InvalidInputError, match="start <= end"):
        blobs.get_ranges("x.bin", [5], [4])


def test_put_file_streams_in_parts_and_delete(object_store: Any, tmp_path: Path) -> None:
    blobs = open_blobs(f"s3://{object_store.bucket}/files/", object_store.options())
    path = tmp_path / "big.bin"
    path.write_bytes(np.random.default_rng(2).bytes(11 << 20))  # > 5 MB: a multipart upload
    puts = object_store.requests("PUT")
    blobs.put_file("big.bin", path)
    assert object_store.wait_requests("PUT", puts + 3) - puts >= 3  # parts, not one PUT
    assert blobs.get("big.bin") == path.read_bytes()
    assert blobs.get_ranges("big.bin", [(11 << 20) - 3], [11 << 20]) == [path.read_bytes()[-3:]]
    blobs.delete("big.bin")
    blobs.delete("big.bin")  # already gone: no error
    assert blobs.names() == []


def test_wrong_credentials_and_dead_endpoints_name_the_endpoint(object_store: Any) -> None:
    options = {**object_store.options(), "secret_access_key": "wrong-secret-0123456789"}
    blobs = open_blobs(f"s3://{object_store.bucket}/x", options)
    with pytest.raises(StoreFormatError, match=object_store.endpoint):
        blobs.names()
    dead = f"http://127.0.0.1:{free_ports(1)[0]}"
    blobs = open_blobs(
        f"s3://{object_store.bucket}/x", {**object_store.options(), "endpoint": dead}
    )
    for call in (lambda: blobs.size("x.bin"), lambda: blobs.get_ranges("x.bin", [0], [1])):
        with pytest.raises(StoreFormatError, match=dead):
            call()
    with pytest.raises(InvalidInputError, match="unknown object-store options"):
        open_blobs(f"s3://{object_store.bucket}/x", {"endpiont": "x"})


def test_without_settings_the_error_points_at_the_objstore_exports(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No endpoint, no credentials: the error (here composed for a failure this machine cannot
    reach AWS to produce) tells the user to run the lines `gnnserve objstore` prints."""
    for key in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION"):
        monkeypatch.delenv(key, raising=False)
    blobs = open_blobs("s3://bucket/x")
    with pytest.raises(StoreFormatError, match="export AWS_") as info:
        blobs._fail(ConnectionError("dns error"), "meta.json")  # type: ignore[attr-defined]
    assert "the default AWS endpoint" in str(info.value)
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:1")
    with pytest.raises(StoreFormatError) as info:
        open_blobs("s3://bucket/x")._fail(ConnectionError("refused"), "meta.json")  # type: ignore[attr-defined]
    assert "export AWS_" not in str(info.value)


def test_settings_come_from_the_environment(
    object_store: Any, uploaded: tuple[Any, bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    for key, value in object_store.env().items():
        monkeypatch.setenv(key, value)
    blobs = open_blobs(f"s3://{object_store.bucket}/ranges")
    assert blobs.get_ranges("x.bin", [3], [9]) == [uploaded[1][3:9]]


def test_blobs_module_does_not_need_obstore(tmp_path: Path) -> None:
    (tmp_path / "x.bin").write_bytes(b"abc")
    code = (
        "import sys; import gnnserve.data.blobs as b; "
        "assert 'obstore' not in sys.modules, 'obstore imported'; "
        f"print(b.open_blobs('file://{tmp_path}').names())"
    )
    assert python_output(code) == ["['x.bin']"]


def test_on_demand_sampling_from_s3_equals_local(object_store: Any, small_store: Path) -> None:
    from gnnserve.graph import open_graph_store
    from gnnserve.graph.remote import RemoteCSR
    from gnnserve.sampling.ondemand import OnDemandSampler
    from gnnserve.sampling.sampler import NeighborSampler

    url = f"s3://{object_store.bucket}/sampling"
    publish(small_store, url, object_store.options(), progress=False)
    remote = OnDemandSampler(RemoteCSR(open_blobs(url, object_store.options())), [5, 3])
    local = NeighborSampler(open_graph_store(small_store), [5, 3])
    seeds = np.array([3, 77, 1500])
    got, want = remote.sample(seeds, rng_seed=4), local.sample(seeds, rng_seed=4)
    np.testing.assert_array_equal(got.subgraph.nodes, want.nodes)
    for a, b in zip(got.subgraph.blocks, want.blocks, strict=True):
        np.testing.assert_array_equal(a.edge_index.numpy(), b.edge_index.numpy())
    assert 0 < got.bytes_read < (small_store / "indices.bin").stat().st_size


def test_a_read_past_its_deadline_is_a_504_not_a_format_error(object_store: Any) -> None:
    from gnnserve.errors import StoreTimeoutError

    blobs = open_blobs(f"s3://{object_store.bucket}/ranges", object_store.options())
    blobs.deadline_s = 1e-4  # type: ignore[attr-defined]  # S3BlobStore's deadline, seconds
    starts = np.arange(0, SIZE - 100, 100)
    with pytest.raises(StoreTimeoutError, match="took longer than 0.0001 s") as err:
        blobs.get_ranges("x.bin", starts, starts + 50)
    assert err.value.http_status == 504 and err.value.retry_after_s == 1.0
    blobs.deadline_s = 30.0  # type: ignore[attr-defined]
    assert blobs.get_ranges("x.bin", [0], [3]) == [blobs.get("x.bin")[:3]]
