"""DGS workers fed by the update log: kill -9 of a sampling worker mid-stream, new vertices.

The reference is a single PreSampler fed the same batches (``test_dgs.Graph``): the DGS workers
are bit-identical to it (``test_dgs``), so equal to it also means equal to workers that never
died.
"""

from __future__ import annotations

import os
import signal

import numpy as np
import pytest
import ray

from gnnserve.deploy.dgs import DGSService
from gnnserve.deploy.dgs.feed import LogFeed, LogSource, Position, events_batch, record_events
from gnnserve.dynamic.wal import UpdateLog
from gnnserve.errors import InvalidInputError
from tests.deploy.dgs.test_dgs import Graph, actual_caches, check_requests, expected_caches

pytestmark = [pytest.mark.distributed, pytest.mark.usefixtures("ray_instance")]
N = 1500
FANOUTS = [4, 3]


def grow(g: Graph, count: int) -> None:
    """Add ``count`` vertices (no edges yet) to the test graph and its reference."""
    g.nbrs.extend([] for _ in range(count))
    g.ref.on_add_nodes(count)


def assert_reservoirs_equal(svc: DGSService, g: Graph) -> None:
    """Every vertex's reservoir of every query, in each owner, equals the reference's."""
    for v in range(len(g.nbrs)):
        owner = svc._samplers[int(svc.ranges.owner(np.array([v]))[0])]
        for q in range(len(g.ref.queries)):
            got = ray.get(owner.reservoir.remote(v, q))
            np.testing.assert_array_equal(got, g.ref._res.row(v, q), err_msg=f"v={v} q={q}")


def test_killed_sampling_worker_replays_its_log_and_new_vertices_join() -> None:
    g = Graph(N, 12_000, FANOUTS, seed=13)
    svc = DGSService(g.indptr, g.indices, FANOUTS, 3, 2, seed=13, checkpoint_every=4)
    try:
        for t in range(1, 7):  # batch 2 adds vertices, later batches reach them
            added = 5 if t == 2 else 0
            grow(g, added)
            assert svc.apply_events(*g.batch(400), add_nodes=added) == t
        assert svc.num_nodes == N + 5
        check_requests(svc, g, np.arange(N + 5), 2)  # new vertices sampled by DGS
        svc.checkpoints.flush()  # taken after batch 4
        victim = svc._samplers[1]
        os.kill(ray.get(victim.pid.remote()), signal.SIGKILL)
        for t in range(7, 10):  # batch 7 finds the death (its check): rebuilt at 4, replays 5, 6
            added = 3 if t == 8 else 0
            grow(g, added)
            assert svc.apply_events(*g.batch(400), add_nodes=added) == t
        assert svc.rebuilt == 1
        stats = svc.stats()
        assert stats[1]["replayed"] == 2 and stats[1]["seq"] == 9
        assert [s["seq"] for s in stats] == [9, 9, 9]
        assert_reservoirs_equal(svc, g)
        queries = np.arange(N + 8)
        assert actual_caches(svc) == expected_caches(g, queries, 2)
        check_requests(svc, g, queries, 2)
        version, _ = svc.sample_at(np.array([N + 7]))
        assert version == 9
    finally:
        svc.shutdown()
    assert not svc.dir.exists()  # checkpoints and the service's own log removed


def test_store_log_consumed_by_advance_survives_a_killed_worker(tmp_path) -> None:
    """As under a store: the service only learns that batches are durable (``advance``); a
    death met while consuming rebuilds the worker within that batch."""
    g = Graph(N, 12_000, FANOUTS, seed=21)
    log = UpdateLog(tmp_path / "store.log", "never")
    source = LogSource(tmp_path / "store.log", Position(0, 0), dim=0)
    svc = DGSService(g.indptr, g.indices, FANOUTS, 2, 2, seed=21, log=source, checkpoint_every=2)
    try:
        with pytest.raises(RuntimeError, match="store's log"):
            svc.apply_events([0], [1], [2])
        for t in range(1, 6):
            log.append_frame(t, events_batch(0, *g.batch(300)))
            if t % 2:  # two batches consumed at once
                assert svc.advance(t, N) == t
        svc.checkpoints.flush()  # taken after batch 3 (and 5: written in the background)
        os.kill(ray.get(svc._samplers[0].pid.remote()), signal.SIGKILL)
        grow(g, 2)
        log.append_frame(6, events_batch(2, *g.batch(300)))
        assert svc.advance(6, N + 2) == 6
        assert svc.rebuilt == 1 and svc.stats()[0]["seq"] == 6
        assert_reservoirs_equal(svc, g)
        assert actual_caches(svc) == expected_caches(g, np.arange(N + 2), 2)  # nothing stale
        check_requests(svc, g, np.arange(N + 2), 2)
    finally:
        svc.shutdown()
        log.close()


def test_feed_reads_by_offset_and_refuses_a_missing_record(tmp_path) -> None:
    log = UpdateLog(tmp_path / "u.log", "never")
    kinds, srcs, dsts = np.array([0, 1]), np.array([3, 4]), np.array([5, 6])
    log.append_frame(1, events_batch(2, kinds, srcs, dsts))
    log.append(2, [{"op": "add_edge", "src": 1, "dst": 2}])
    log.close()
    feed = LogFeed(tmp_path / "u.log")
    records = feed.read(Position(0, 0), upto=2)
    assert [r[0] for r in records] == [1, 2]
    added, k, s, d = record_events(records[0][2], dim=0)
    assert added == 2 and k.tolist() == [0, 1] and s.tolist() == [3, 4] and d.tolist() == [5, 6]
    added, k, s, d = record_events(records[1][2], dim=0)
    assert (added, k.tolist(), s.tolist(), d.tolist()) == (0, [0], [1], [2])
    assert feed.read(Position(1, records[0][1]), upto=2)[0][2] == records[1][2]
    with pytest.raises(RuntimeError, match="no intact record 3"):
        feed.read(Position(2, records[1][1]), upto=3)
    with pytest.raises(RuntimeError, match="no intact record 2"):
        feed.read(Position(1, records[0][1] + 1), upto=2)  # not a record boundary


def test_apply_events_refuses_bad_add_nodes() -> None:
    g = Graph(50, 200, [2], seed=1)
    with DGSService(g.indptr, g.indices, [2], 1, 1, seed=1) as svc:
        with pytest.raises(InvalidInputError, match="add_nodes"):
            svc.apply_events([], [], [], add_nodes=-1)
        with pytest.raises(InvalidInputError, match="dst"):
            svc.apply_events([0], [1], [50])  # 50 exists only with add_nodes=1
        assert svc.apply_events([0], [1], [50], add_nodes=1) == 1
