"""Update log: round trip, torn tail dropped, corruption stops replay, order enforced."""

from __future__ import annotations

from pathlib import Path

import pytest

from gnnserve.errors import StoreFormatError
from gnnserve.graph.wal import UpdateLog, encode_record, replay


def _write(path: Path, n: int) -> list[list[dict]]:
    log = UpdateLog(path, "always")
    batches = [[{"op": "add_edge", "src": i, "dst": i + 1}] for i in range(n)]
    for version, ops in enumerate(batches, start=1):
        log.append(version, ops)
    log.close()
    return batches


def test_round_trip(tmp_path: Path) -> None:
    batches = _write(tmp_path / "log", 5)
    assert list(replay(tmp_path / "log")) == list(enumerate(batches, start=1))


@pytest.mark.parametrize("cut", [1, 5, 20])
def test_torn_tail_is_dropped_and_truncated(tmp_path: Path, cut: int) -> None:
    path = tmp_path / "log"
    batches = _write(path, 3)
    full = path.read_bytes()
    path.write_bytes(full[:-cut])  # the last record lost its end in a crash
    assert [v for v, _ in replay(path)] == [1, 2]
    assert path.read_bytes() == full[: len(full) - len(encode_record(3, batches[2]))]
    log = UpdateLog(path)  # appending after the truncation continues cleanly
    log.append(3, batches[2])
    log.close()
    assert [v for v, _ in replay(path)] == [1, 2, 3]


def test_corrupt_record_stops_replay(tmp_path: Path) -> None:
    path = tmp_path / "log"
    _write(path, 3)
    data = bytearray(path.read_bytes())
    second = data.index(b"\n") + 1
    data[second + 20] ^= 0x01  # flip a bit inside record 2's payload
    path.write_bytes(bytes(data))
    assert [v for v, _ in replay(path)] == [1]


def test_out_of_order_versions_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "log"
    path.write_bytes(encode_record(2, []) + encode_record(1, []))
    with pytest.raises(StoreFormatError):
        list(replay(path))
