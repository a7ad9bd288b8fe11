"""Update log: round trip; only a torn final record is dropped; damage before valid records, a
version gap or a bad header is refused without touching the file; read-only replay."""

from __future__ import annotations

from pathlib import Path

import pytest

from gnnserve.dynamic.wal import UpdateLog, encode_record, replay, scan_log
from gnnserve.errors import StoreFormatError

HEADER = [{"op": "base", "checksum": "abc"}]


def _write(path: Path, n: int) -> list[list[dict]]:
    """A log written by the real UpdateLog: the header (version 0), then batches 1..n."""
    log = UpdateLog(path, "always")
    batches = [HEADER] + [[{"op": "add_edge", "src": i, "dst": i + 1}] for i in range(n)]
    for version, ops in enumerate(batches):
        log.append(version, ops)
    log.close()
    return batches


def _offsets(batches: list[list[dict]]) -> list[int]:
    """Byte offset where each record starts."""
    starts = [0]
    for version, ops in enumerate(batches):
        starts.append(starts[-1] + len(encode_record(version, ops)))
    return starts[:-1]


def _flip(path: Path, offset: int) -> bytes:
    """Flip one bit of the byte at ``offset``; returns the damaged file's bytes."""
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))
    return bytes(data)


def test_round_trip(tmp_path: Path) -> None:
    batches = _write(tmp_path / "log", 5)
    assert list(replay(tmp_path / "log")) == list(enumerate(batches))
    result = scan_log(tmp_path / "log")
    assert (result.status, result.records, result.last_seq) == ("clean", 6, 5)


@pytest.mark.parametrize("cut", [1, 5, 20])
def test_torn_tail_is_dropped_and_truncated(tmp_path: Path, cut: int) -> None:
    path = tmp_path / "log"
    batches = _write(path, 3)
    full = path.read_bytes()
    path.write_bytes(full[:-cut])  # the last record lost its end in a crash
    assert [v for v, _ in replay(path)] == [0, 1, 2]
    assert path.read_bytes() == full[: len(full) - len(encode_record(3, batches[3]))]
    log = UpdateLog(path)  # appending after the truncation continues cleanly
    log.append(3, batches[3])
    log.close()
    assert [v for v, _ in replay(path)] == [0, 1, 2, 3]


def test_damaged_final_record_is_a_torn_tail(tmp_path: Path) -> None:
    path = tmp_path / "log"
    batches = _write(path, 4)
    last = _offsets(batches)[-1]
    _flip(path, last + 20)  # the final append, never acknowledged if it was not synced
    assert [v for v, _ in replay(path)] == [0, 1, 2, 3]
    assert path.stat().st_size == last


def test_zero_filled_tail_is_torn(tmp_path: Path) -> None:
    """Power loss after the size grew but before the data reached the disk: zeros at the end."""
    path = tmp_path / "log"
    batches = _write(path, 2)
    good = path.read_bytes()
    path.write_bytes(good + b"\0" * len(encode_record(3, batches[1])))
    assert scan_log(path).status == "torn"
    assert [v for v, _ in replay(path)] == [0, 1, 2]
    assert path.read_bytes() == good


@pytest.mark.parametrize("where", ["header", "middle"])
def test_damage_before_valid_records_is_refused_and_left_alone(tmp_path: Path, where: str) -> None:
    path = tmp_path / "log"
    batches = _write(path, 6)
    index = 0 if where == "header" else 3
    offset = _offsets(batches)[index]
    damaged = _flip(path, offset + 20)
    with pytest.raises(StoreFormatError) as err:
        list(replay(path))
    message = err.value.message
    assert f"byte offset {offset}" in message
    assert f"expected seq {index}" in message
    assert f"{6 - index} valid records follow" in message
    assert f"gnnserve log repair {path} --keep-good-prefix" in message
    assert path.read_bytes() == damaged  # never truncated or modified
    result = scan_log(path)
    assert (result.status, result.good_end, result.last_seq) == ("corrupt", offset, index - 1)


def test_flipped_newline_merging_the_last_two_records_is_corruption(tmp_path: Path) -> None:
    """The damaged line then holds the final record whole: it was acknowledged, not torn."""
    path = tmp_path / "log"
    batches = _write(path, 4)
    end_of_third = _offsets(batches)[-1] - 1
    data = bytearray(path.read_bytes())
    data[end_of_third] = ord("x")
    path.write_bytes(bytes(data))
    with pytest.raises(StoreFormatError, match="1 valid record follows"):
        list(replay(path))
    assert path.read_bytes() == bytes(data)


def test_two_damaged_records_at_the_end_are_corruption(tmp_path: Path) -> None:
    """A crash leaves at most one incomplete final record; two bad lines are not a torn write."""
    path = tmp_path / "log"
    batches = _write(path, 4)
    starts = _offsets(batches)
    _flip(path, starts[-2] + 20)
    damaged = _flip(path, starts[-1] + 20)
    with pytest.raises(StoreFormatError, match=f"byte offset {starts[-2]}"):
        list(replay(path))
    assert path.read_bytes() == damaged


def test_version_gap_is_corruption(tmp_path: Path) -> None:
    path = tmp_path / "log"
    path.write_bytes(b"".join(encode_record(v, HEADER if v == 0 else []) for v in (0, 1, 2, 4)))
    with pytest.raises(StoreFormatError, match="expected seq 3"):
        list(replay(path))


def test_out_of_order_versions_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "log"
    path.write_bytes(encode_record(0, HEADER) + encode_record(2, []) + encode_record(1, []))
    with pytest.raises(StoreFormatError):
        list(replay(path))


def test_first_record_must_be_the_header(tmp_path: Path) -> None:
    path = tmp_path / "log"
    path.write_bytes(encode_record(1, []) + encode_record(2, []))
    with pytest.raises(StoreFormatError, match="expected seq 0"):
        list(replay(path))


def test_read_only_replay_stops_at_a_record_being_written(tmp_path: Path) -> None:
    """Beside a live writer the last record may be half-written: no error, file untouched, though
    the writer completes it and goes on appending while the replay runs."""
    path = tmp_path / "log"
    _write(path, 3)
    partial = encode_record(4, [{"op": "add_edge", "src": 9, "dst": 8}])
    with open(path, "ab") as fh:
        fh.write(partial[:15])
    before = path.read_bytes()
    records = replay(path, truncate=False)
    assert next(records)[0] == 0
    with open(path, "ab") as fh:  # the writer finishes that record and appends another
        fh.write(partial[15:] + encode_record(5, []))
    versions = [v for v, _ in records]
    assert versions == list(range(1, len(versions) + 1)) and len(versions) >= 3
    assert path.read_bytes() == before + partial[15:] + encode_record(5, [])


def test_read_only_replay_still_refuses_corruption(tmp_path: Path) -> None:
    path = tmp_path / "log"
    batches = _write(path, 3)
    _flip(path, _offsets(batches)[1] + 20)
    with pytest.raises(StoreFormatError):
        list(replay(path, truncate=False))
