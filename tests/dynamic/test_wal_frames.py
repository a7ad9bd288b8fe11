"""Binary frames in the update log (bulk batches): they replay beside JSON lines, a torn final
frame is dropped, damage before an intact record is corruption and leaves the file alone."""

from __future__ import annotations

from pathlib import Path

import pytest

from gnnserve.dynamic.records import FRAME_HEADER, encode_frame
from gnnserve.dynamic.wal import UpdateLog, replay, scan_log
from gnnserve.errors import StoreFormatError

HEADER = [{"op": "base", "checksum": "abc"}]
PAYLOADS = [bytes(range(i, i + 40)) + b"\n" * i for i in range(1, 4)]  # newlines inside too


def _write(path: Path) -> list[tuple[int, object]]:
    """Header (JSON), frame 1, JSON 2, frame 3, frame 4: every kind next to every other."""
    log = UpdateLog(path, "always")
    records: list[tuple[int, object]] = [(0, HEADER)]
    log.append(0, HEADER)
    for seq, kind in enumerate(["frame", "json", "frame", "frame"], start=1):
        if kind == "json":
            ops = [{"op": "add_edge", "src": seq, "dst": 0}]
            log.append(seq, ops)
            records.append((seq, ops))
        else:
            payload = PAYLOADS[seq % 3]
            log.append_frame(seq, payload)
            records.append((seq, payload))
    log.close()
    return records


def test_frames_and_lines_replay_in_order(tmp_path: Path) -> None:
    records = _write(tmp_path / "log")
    assert list(replay(tmp_path / "log")) == records
    assert scan_log(tmp_path / "log").status == "clean"


@pytest.mark.parametrize("cut", [1, 10, FRAME_HEADER.size + 5, FRAME_HEADER.size + 40])
def test_a_torn_final_frame_is_dropped(tmp_path: Path, cut: int) -> None:
    path = tmp_path / "log"
    _write(path)
    full = path.read_bytes()
    last = len(encode_frame(4, PAYLOADS[1]))
    path.write_bytes(full[: len(full) - last + cut])  # the last frame's first ``cut`` bytes
    assert [seq for seq, _ in replay(path)] == [0, 1, 2, 3]
    assert path.read_bytes() == full[: len(full) - last]


def test_a_zero_filled_final_frame_is_torn(tmp_path: Path) -> None:
    path = tmp_path / "log"
    _write(path)
    full = path.read_bytes()
    last = len(encode_frame(4, PAYLOADS[1]))
    path.write_bytes(full[: len(full) - last] + b"\0" * last)  # size on disk, data not
    assert [seq for seq, _ in replay(path)] == [0, 1, 2, 3]


@pytest.mark.parametrize("where", ["header", "payload"])
def test_damage_before_an_intact_record_is_refused(tmp_path: Path, where: str) -> None:
    path = tmp_path / "log"
    _write(path)
    data = bytearray(path.read_bytes())
    third = len(data) - 2 * len(encode_frame(4, PAYLOADS[1]))  # frame 3 starts here
    data[third + (6 if where == "header" else FRAME_HEADER.size + 3)] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(StoreFormatError, match="1 valid record follows it .seq 4"):
        list(replay(path))
    assert path.read_bytes() == bytes(data)  # left as it was


def test_a_frame_longer_than_the_rest_of_the_file_but_garbled_after_is_corrupt(
    tmp_path: Path,
) -> None:
    """More bytes after a damaged frame than its header announces: not one record's damage."""
    path = tmp_path / "log"
    _write(path)
    data = path.read_bytes()
    path.write_bytes(data + encode_frame(5, b"x" * 8)[:-2] + b"\xee" * 200)
    with pytest.raises(StoreFormatError, match="more than one final record"):
        list(replay(path))
