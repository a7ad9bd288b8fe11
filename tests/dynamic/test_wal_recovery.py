"""A damaged update log at start-up: the store, the engine and a real ``gnnserve serve`` process
start only when the damage is confined to the final (unacknowledged) record."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from gnnserve.config import ServeConfig
from gnnserve.demo import stop_server, wait_ready
from gnnserve.dynamic.store import DynamicStore
from gnnserve.engine.loader import build_engine
from gnnserve.errors import StoreFormatError
from gnnserve.features import open_feature_store
from gnnserve.graph import open_graph_store
from gnnserve.ports import free_port

BATCHES = 6


def _open(store: Path, log: Path) -> DynamicStore:
    return DynamicStore(open_graph_store(store), open_feature_store(store), log)


def _logged(store: Path, log: Path) -> list[int]:
    """BATCHES feature upserts (batch k sets node k to k) through the real store; returns each
    record's start offset (header first)."""
    dyn = _open(store, log)
    starts = [0]
    for k in range(1, BATCHES + 1):
        starts.append(log.stat().st_size)  # the record is appended here
        dyn.apply([{"op": "upsert_features", "node": k, "features": [float(k)] * dyn.features.dim}])
    dyn.close()
    return starts


def _damage(log: Path, where: str, starts: list[int]) -> tuple[int, bytes]:
    """Flip a bit inside the header, a middle record or the last record; (offset, file bytes)."""
    record = {"header": 0, "middle": BATCHES // 2, "end": BATCHES}[where]
    data = bytearray(log.read_bytes())
    data[starts[record] + 20] ^= 0x01
    log.write_bytes(bytes(data))
    return starts[record], bytes(data)


def _rows(store: DynamicStore) -> np.ndarray:
    return store.features.get(np.arange(1, BATCHES + 1)).numpy()[:, 0]


@pytest.mark.parametrize("where", ["header", "middle", "end"])
def test_only_a_damaged_final_record_lets_the_store_open(
    small_store: Path, tmp_path: Path, where: str
) -> None:
    log = tmp_path / "updates.log"
    starts = _logged(small_store, log)
    base = open_feature_store(small_store).get(np.arange(1, BATCHES + 1)).numpy()[:, 0]
    offset, damaged = _damage(log, where, starts)
    if where != "end":
        with pytest.raises(StoreFormatError, match=f"corrupt at byte offset {offset} "):
            _open(small_store, log)
        assert log.read_bytes() == damaged  # refused, never truncated
        return
    dyn = _open(small_store, log)  # the last batch is dropped as a torn tail
    try:
        assert dyn.replayed == BATCHES - 1 and dyn.graph.seq == BATCHES - 1
        want = np.r_[np.arange(1, BATCHES, dtype=np.float32), base[-1]]
        np.testing.assert_array_equal(_rows(dyn), want)
        assert log.read_bytes() == damaged[:offset]
        again = [{"op": "upsert_features", "node": 1, "features": [0.5] * dyn.features.dim}]
        assert dyn.apply(again).seq == BATCHES  # appends continue after the truncation
    finally:
        dyn.close()


def _config(store: Path, ckpt: Path, log: Path) -> ServeConfig:
    return ServeConfig.load(
        None, **{"store.path": str(store), "model_path": str(ckpt), "store.update_log": str(log)}
    )


def test_engine_starts_on_a_torn_final_record_only(
    small_store: Path, small_ckpt: Path, tmp_path: Path
) -> None:
    torn, corrupt = tmp_path / "torn.log", tmp_path / "corrupt.log"
    _damage(torn, "end", _logged(small_store, torn))
    offset, damaged = _damage(corrupt, "middle", _logged(small_store, corrupt))
    with build_engine(_config(small_store, small_ckpt, torn)) as engine:
        assert engine.graph.version.endswith(f".{BATCHES - 1}")
        assert engine.updates is not None and engine.updates.replayed == BATCHES - 1
    with pytest.raises(StoreFormatError, match=f"byte offset {offset} "):
        build_engine(_config(small_store, small_ckpt, corrupt))
    assert corrupt.read_bytes() == damaged


@pytest.mark.slow  # a real process: imports torch and friends (~10 s of CPU)
def test_serve_refuses_a_corrupt_log_with_exit_code_2(
    small_store: Path, small_ckpt: Path, tmp_path: Path
) -> None:
    log = tmp_path / "updates.log"
    offset, damaged = _damage(log, "middle", _logged(small_store, log))
    port = free_port()
    cmd = [sys.executable, "-m", "gnnserve.cli", "serve", "--store", str(small_store)]
    cmd += ["--model", str(small_ckpt), "--port", str(port), "--update-log", str(log)]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE)
    try:
        with pytest.raises(RuntimeError, match="exited with code 2"):
            wait_ready(f"http://127.0.0.1:{port}", proc)  # fails at once if it starts serving
        stderr = proc.communicate(timeout=30)[1].decode()
    finally:
        stop_server(proc)
    error = [line for line in stderr.splitlines() if line.startswith("error: ")]
    assert len(error) == 1, stderr
    assert f"corrupt at byte offset {offset} (expected seq {BATCHES // 2}" in error[0]
    assert f"{BATCHES - BATCHES // 2} valid records follow" in error[0]
    assert f"gnnserve log repair {log} --keep-good-prefix" in error[0]
    assert "Traceback" not in stderr
    assert log.read_bytes() == damaged
