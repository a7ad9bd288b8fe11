"""One update log shared by several stores (the workers of `serve --workers N --update-log`):
every store applies every batch in seq order, its own and the others', read by offset; a torn
tail left by a dead appender is cut, corruption refused; the supervisor's writer lock keeps any
other server out."""

from __future__ import annotations

import os
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from gnnserve.dynamic.records import encode_frame
from gnnserve.dynamic.shared_log import hold_writer_lock, shares_log
from gnnserve.dynamic.store import DynamicStore
from gnnserve.dynamic.wal import LogInUseError, UpdateLog, replay, scan_log
from gnnserve.errors import InvalidInputError, StoreFormatError
from gnnserve.features import open_feature_store
from gnnserve.graph import open_graph_store
from tests.dynamic.test_store import _assert_same, _random_batch, _reference


def _shared(store: Path, log: Path) -> DynamicStore:
    graph, features = open_graph_store(store), open_feature_store(store)
    return DynamicStore(graph, features, log, fsync="never", shared=True)


def _edges(store: DynamicStore) -> list[tuple[int, int]]:
    indptr, indices = store.graph.csr()
    dst = np.repeat(np.arange(store.graph.num_nodes), np.diff(indptr))
    return sorted(zip(np.asarray(indices).tolist(), dst.tolist(), strict=True))


def test_every_store_applies_every_batch_in_seq_order(small_store: Path, tmp_path: Path) -> None:
    log = tmp_path / "u.log"
    lock = hold_writer_lock(log)  # the supervisor's
    a, b = _shared(small_store, log), _shared(small_store, log)
    try:
        edges, n = _reference(small_store)
        rng = np.random.default_rng(3)
        for i in range(12):  # the writers alternate; each first applies the other's batches
            writer = (a, b)[i % 2]
            result = writer.apply(_random_batch(rng, edges, n, 16))
            n = writer.graph.num_nodes
            assert result.seq == i + 1
        for store in (a, b):
            store.ensure_version(12)
            _assert_same(store, edges, n)
        assert _edges(a) == _edges(b)
        seqs = [seq for seq, _ in replay(log, truncate=False)]
        assert seqs == list(range(13))  # the header and 12 batches, each once
        with pytest.raises(InvalidInputError, match="ahead of the update log") as info:
            a.ensure_version(13)
        assert info.value.field == "min_version"
    finally:
        a.close()
        b.close()
        os.close(lock)


def test_the_other_stores_batches_arrive_in_the_background(
    small_store: Path, tmp_path: Path
) -> None:
    log = tmp_path / "u.log"
    a, b = _shared(small_store, log), _shared(small_store, log)
    try:
        a.apply([{"op": "add_edge", "src": 1, "dst": 2}])
        deadline = time.monotonic() + 30  # polled every 10 ms: a correct run is far below
        while b.graph.seq < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert b.graph.seq == 1 and _edges(a) == _edges(b)
    finally:
        a.close()
        b.close()


def test_a_dead_appenders_torn_tail_is_cut_and_corruption_refused(
    small_store: Path, tmp_path: Path
) -> None:
    log = tmp_path / "u.log"
    a = _shared(small_store, log)
    a.apply([{"op": "add_edge", "src": 1, "dst": 2}])
    a.close()
    good = log.stat().st_size
    with open(log, "ab") as fh:  # an appender killed mid-write: half of its frame
        fh.write(encode_frame(2, b"x" * 64)[:40])
    b = _shared(small_store, log)  # reading unlocked leaves it; the append lock cuts it
    try:
        assert b.graph.seq == 1 and log.stat().st_size == good
        assert b.apply([{"op": "add_edge", "src": 3, "dst": 4}]).seq == 2
    finally:
        b.close()
    assert scan_log(log).status == "clean" and scan_log(log).last_seq == 2
    logged = log.read_bytes()
    at = good + 25  # inside the third record, followed by a valid copy of it: not a torn tail
    damaged = logged[:at] + bytes([logged[at] ^ 0xFF]) + logged[at + 1 :] + logged[good:]
    for locked in (True, False):  # start-up (under the append lock) and a follower
        log.write_bytes(damaged)
        with pytest.raises(StoreFormatError, match="corrupt at byte offset"):
            _shared(small_store, log) if locked else _follow_from(small_store, log, logged, good)
        assert log.read_bytes() == damaged  # refused, not cut


def _follow_from(store: Path, log: Path, logged: bytes, good: int) -> None:
    """A store started on the log's first two records, then following the damaged rest."""
    damaged = log.read_bytes()
    log.write_bytes(logged[:good])
    follower = _shared(store, log)
    try:
        log.write_bytes(damaged)
        follower.follow()
    finally:
        follower.close()


def test_the_writer_lock_keeps_other_servers_out_and_workers_in(
    small_store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = tmp_path / "dir" / "u.log"
    lock = hold_writer_lock(log)
    try:
        with pytest.raises(LogInUseError):
            UpdateLog(log)  # a second server
        with pytest.raises(LogInUseError):
            hold_writer_lock(log)  # a second deployment
        store = _shared(small_store, log)
        store.close()
    finally:
        os.close(lock)
    UpdateLog(log).close()  # free again once the supervisor is gone
    assert not shares_log()
    monkeypatch.setenv("GNNSERVE_SHARED_LOG", "1")
    assert shares_log()


def test_counts_match_after_concurrent_writers(small_store: Path, tmp_path: Path) -> None:
    """Two stores appending from two threads at once: every acknowledged batch is in the log
    once, in seq order, and both stores end equal to the reference."""
    import threading

    log = tmp_path / "u.log"
    stores = [_shared(small_store, log), _shared(small_store, log)]
    added: Counter[tuple[int, int]] = Counter()
    seqs: list[int] = []
    guard = threading.Lock()

    def write(store: DynamicStore, k: int) -> None:
        for i in range(20):
            u, v = k * 100 + i, k * 100 + i + 1
            seq = store.apply([{"op": "add_edge", "src": u, "dst": v}]).seq
            with guard:
                added[(u, v)] += 1
                seqs.append(seq)

    threads = [threading.Thread(target=write, args=(s, k)) for k, s in enumerate(stores)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    try:
        assert sorted(seqs) == list(range(1, 41))
        edges, n = _reference(small_store)
        edges.update(added)
        for store in stores:
            store.ensure_version(40)
            _assert_same(store, edges, n)
    finally:
        for store in stores:
            store.close()


def test_min_version_names_a_seq_or_a_version_of_this_store() -> None:
    from gnnserve.dynamic.graph import requested_seq

    assert [requested_seq(v, "abc") for v in (5, "5", "abc.7", "abc.0")] == [5, 5, 7, 0]
    for bad in ("other.7", "abc.x", "abc", "", -1):
        with pytest.raises(InvalidInputError) as info:
            requested_seq(bad, "abc")
        assert info.value.field == "min_version"
