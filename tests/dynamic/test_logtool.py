"""``gnnserve log verify|repair`` through the real command line entry point."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from gnnserve.cli import main
from gnnserve.dynamic.store import DynamicStore
from gnnserve.dynamic.wal import LogInUseError, UpdateLog, encode_record, replay
from gnnserve.errors import StoreFormatError
from gnnserve.features import open_feature_store
from gnnserve.graph import open_graph_store

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


# -- batches checked against the store; the writer lock ---------------------------------------

BAD_OPS = {
    "float32 overflow": {"op": "upsert_features", "node": 4, "features": [1e39] + [0.0] * 15},
    "NaN": {"op": "add_node", "features": [float("nan")] * 16},
    "unknown node": {"op": "add_edge", "src": 1, "dst": 10**6},
}


def _log_with_a_refused_batch(store: Path, path: Path, op: dict) -> tuple[bytes, int]:
    """Header + batches 1-2 applied by a real store, then batch 3 = ``op`` (intact record the
    API would refuse, written around it) and batch 4 (valid); the bytes and where batch 3
    starts."""
    dyn = DynamicStore(open_graph_store(store), open_feature_store(store), path, fsync="never")
    dyn.apply([{"op": "add_edge", "src": 1, "dst": 2}])
    dyn.apply([{"op": "add_edge", "src": 2, "dst": 3}])
    dyn.close()
    good = path.stat().st_size
    writer = UpdateLog(path, "never")
    writer.append(3, [op])
    writer.append(4, [{"op": "add_edge", "src": 5, "dst": 6}])
    writer.close()
    return path.read_bytes(), good


@pytest.mark.parametrize("case", list(BAD_OPS))
def test_verify_and_repair_with_the_store_find_a_batch_serve_refuses(
    small_store: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str
) -> None:
    path = tmp_path / "log"
    damaged, kept = _log_with_a_refused_batch(small_store, path, BAD_OPS[case])
    with pytest.raises(StoreFormatError, match="seq 3"):
        DynamicStore(open_graph_store(small_store), open_feature_store(small_store), path)
    assert main(["log", "verify", str(path)]) == 0  # records intact: only the store can tell
    assert "batches: not checked" in capsys.readouterr().out
    assert main(["log", "verify", str(path), "--store", str(small_store)]) == 1
    out = capsys.readouterr().out
    assert "status: clean" in out and "batches: refused" in out and "seq 3" in out
    assert path.read_bytes() == damaged  # verify changes nothing
    assert main(["log", "repair", str(path), "--store", str(small_store)]) == 2  # no flag
    assert "--keep-good-prefix" in capsys.readouterr().err
    args = ["log", "repair", str(path), "--store", str(small_store), "--keep-good-prefix"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert f"dropped {len(damaged) - kept} bytes from offset {kept}" in out
    assert "the refused batch (seq 3) and 1 valid records (seq 4 to 4) after it" in out
    assert "kept 3 records (seq 0 to 2)" in out
    assert path.read_bytes() == damaged[:kept]
    assert [p.read_bytes() for p in tmp_path.glob("log.corrupt-*")] == [damaged]
    dyn = DynamicStore(open_graph_store(small_store), open_feature_store(small_store), path)
    assert dyn.replayed == 2  # serve starts again, with the batches before the refused one
    dyn.close()
    assert main(["log", "verify", str(path), "--store", str(small_store)]) == 0
    assert "batches: all 2 apply to" in capsys.readouterr().out


def test_repair_and_a_second_writer_are_refused_while_a_writer_holds_the_log(
    small_store: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "log"
    starts = _write(path, 3)
    damaged = _flip(path, starts[2] + 12)
    # another process writes the log (a server): it holds the lock until it exits
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(path)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        assert main(["log", "repair", str(path), "--keep-good-prefix"]) == 2
        err = capsys.readouterr().err
        assert "in use by another process" in err and "stop that server first" in err
        with pytest.raises(LogInUseError):
            UpdateLog(path, "never")
        assert path.read_bytes() == damaged and not list(tmp_path.glob("log.corrupt-*"))
    finally:
        holder.kill()
        holder.wait(30)
    assert main(["log", "repair", str(path), "--keep-good-prefix"]) == 0  # the writer is gone
    assert path.read_bytes() == damaged[: starts[2]]


HOLD = """
import sys, time
from gnnserve.dynamic.wal import UpdateLog
log = UpdateLog(sys.argv[1], "never")
print("locked", flush=True)
time.sleep(600)
"""
