"""The s3 blob store against a real SeaweedFS: exact ranges, one request each, clear errors;
publish round trip; the objstore and publish commands."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gnnserve.cli import main
from gnnserve.data.blobs import open_blobs
from gnnserve.data.publish import SELF_LOOPS, publish
from gnnserve.errors import InvalidInputError, StoreFormatError

pytestmark = pytest.mark.distributed


def test_ranges_equal_slices_one_request_each(object_store: Any) -> None:
    blobs = open_blobs(f"s3://{object_store.bucket}/ranges", object_store.options())
    data = np.random.default_rng(0).bytes(100_000)
    blobs.put("x.bin", data)
    rng = np.random.default_rng(1)
    starts = rng.integers(0, 100_000, 50)
    ends = np.minimum(starts + rng.integers(0, 5000, 50), 100_000)
    starts[0], ends[0] = 99_999, 100_000  # the last byte
    starts[1], ends[1] = 10, 10  # empty
    before = blobs.stats.requests
    parts = blobs.get_ranges("x.bin", starts, ends)
    assert parts == [data[a:b] for a, b in zip(starts, ends, strict=True)]
    assert blobs.stats.requests - before == 50
    assert blobs.size("x.bin") == 100_000 and blobs.names() == ["x.bin"]
    with pytest.raises(StoreFormatError, match="not found"):
        blobs.size("missing.bin")


def test_wrong_credentials_name_the_endpoint(object_store: Any) -> None:
    options = {**object_store.options(), "secret_access_key": "wrong-secret-0123456789"}
    blobs = open_blobs(f"s3://{object_store.bucket}/x", options)
    with pytest.raises(StoreFormatError, match=object_store.endpoint.split("//")[1]):
        blobs.size("x.bin")
    with pytest.raises(InvalidInputError, match="unknown object-store options"):
        open_blobs(f"s3://{object_store.bucket}/x", {"endpiont": "x"})


def test_publish_round_trip_and_refusals(
    object_store: Any, small_store: Path, tmp_path: Path
) -> None:
    url = f"s3://{object_store.bucket}/small"
    report = publish(small_store, url, object_store.options(), progress=False)
    assert report.files[-1] == "meta.json" and SELF_LOOPS in report.files
    blobs = open_blobs(url, object_store.options())
    for path in small_store.iterdir():
        if path.is_file() and path.name in report.files:
            assert blobs.get(path.name) == path.read_bytes()
    with pytest.raises(InvalidInputError, match="not empty"):
        publish(small_store, url, object_store.options(), progress=False)
    publish(small_store, url, object_store.options(), overwrite=True, progress=False)
    with pytest.raises(StoreFormatError, match="not a gnnserve store"):
        publish(tmp_path, f"s3://{object_store.bucket}/empty", object_store.options())


def test_publish_command_to_a_directory(
    small_store: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "pub"
    assert main(["publish", "--store", str(small_store), "--to", out.as_uri()]) == 0
    report = json.loads(capsys.readouterr().out)
    assert sorted(report["files"]) == sorted(p.name for p in out.iterdir())
    assert main(["publish", "--store", str(small_store), "--to", str(out)]) == 2  # not empty


def test_objstore_command_starts_and_stops(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "gnnserve.cli", "objstore", "--dir", str(tmp_path)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        assert "SeaweedFS S3 endpoint http://127.0.0.1:" in first
        env = dict(
            line.removeprefix("export ").strip().split("=", 1)
            for line in [proc.stdout.readline() for _ in range(4)]
        )
        blobs = open_blobs(
            "s3://gnnserve/x",
            {
                "endpoint": env["AWS_ENDPOINT_URL"],
                "access_key_id": env["AWS_ACCESS_KEY_ID"],
                "secret_access_key": env["AWS_SECRET_ACCESS_KEY"],
            },
        )
        blobs.put("a", b"1")
        assert blobs.get("a") == b"1"
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0


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
