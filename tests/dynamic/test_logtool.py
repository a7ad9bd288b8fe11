"""``gnnserve log verify|repair`` through the real command line entry point."""

from __future__ import annotations

from pathlib import Path

import pytest

from gnnserve.cli import main
from gnnserve.dynamic.wal import UpdateLog, encode_record, replay

HEADER = [{"op": "base", "checksum": "abc"}]


def _write(path: Path, n: int) -> list[int]:
    """Header + n batches written by the real UpdateLog; returns each record's start offset."""
    log = UpdateLog(path, "always")
    starts, offset = [], 0
    for version in range(n + 1):
        ops = HEADER if version == 0 else [{"op": "add_edge", "src": version, "dst": 0}]
        log.append(version, ops)
        starts.append(offset)
        offset += len(encode_record(version, ops))
    log.close()
    return starts


def _flip(path: Path, offset: int) -> bytes:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))
    return bytes(data)


def test_verify_clean(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "log"
    _write(path, 4)
    assert main(["log", "verify", str(path)]) == 0
    out = capsys.readouterr().out
    assert "5 good records (seq 0 to 4)" in out
    assert "last seq: 4" in out and "status: clean" in out


def test_verify_torn_tail(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "log"
    _write(path, 4)
    full = path.read_bytes()
    path.write_bytes(full[:-7])
    assert main(["log", "verify", str(path)]) == 0
    out = capsys.readouterr().out
    torn = len(encode_record(4, [{"op": "add_edge", "src": 4, "dst": 0}])) - 7
    assert f"status: torn tail of {torn} bytes" in out and "last seq: 3" in out
    assert path.read_bytes() == full[:-7]  # verify changes nothing


def test_verify_corrupt(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "log"
    starts = _write(path, 6)
    damaged = _flip(path, starts[2] + 12)
    assert main(["log", "verify", str(path)]) == 1
    out = capsys.readouterr().out
    assert f"status: corrupt at offset {starts[2]} (seq 2)" in out
    assert "4 valid records follow it (seq 3 to 6)" in out and "last seq: 1" in out
    assert path.read_bytes() == damaged


def test_verify_missing_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["log", "verify", str(tmp_path / "nope")]) == 2
    assert "not found" in capsys.readouterr().err


def test_repair_needs_the_explicit_flag(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "log"
    starts = _write(path, 3)
    damaged = _flip(path, starts[1] + 12)
    assert main(["log", "repair", str(path)]) == 2
    assert "--keep-good-prefix" in capsys.readouterr().err
    assert path.read_bytes() == damaged and sorted(tmp_path.iterdir()) == [path]


def test_repair_keeps_the_good_prefix_and_the_damaged_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "log"
    starts = _write(path, 6)
    damaged = _flip(path, starts[3] + 12)
    assert main(["log", "repair", str(path), "--keep-good-prefix"]) == 0
    out = capsys.readouterr().out
    dropped = len(damaged) - starts[3]
    assert f"dropped {dropped} bytes from offset {starts[3]}" in out
    assert "the damaged record (seq 3) and 3 valid records (seq 4 to 6)" in out
    assert path.read_bytes() == damaged[: starts[3]]
    asides = list(tmp_path.glob("log.corrupt-*"))
    assert len(asides) == 1 and asides[0].read_bytes() == damaged
    assert str(asides[0]) in out
    assert [v for v, _ in replay(path)] == [0, 1, 2]
    assert main(["log", "verify", str(path)]) == 0
    assert "status: clean" in capsys.readouterr().out
    assert main(["log", "repair", str(path), "--keep-good-prefix"]) == 0  # now a no-op
    assert "nothing to repair" in capsys.readouterr().out
    assert len(list(tmp_path.glob("log.corrupt-*"))) == 1


def test_repair_of_a_bad_header_leaves_an_empty_log(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "log"
    _write(path, 2)
    damaged = _flip(path, 15)
    assert main(["log", "repair", str(path), "--keep-good-prefix"]) == 0
    assert "kept 0 records" in capsys.readouterr().out
    assert path.read_bytes() == b""
    assert [p.read_bytes() for p in tmp_path.glob("log.corrupt-*")] == [damaged]
