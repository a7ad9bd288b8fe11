"""DGS workers on a real local Ray cluster: exactly the single-process PreSampler's samples."""

from __future__ import annotations

import os
import signal
import time

import numpy as np
import pytest
import ray

from gnnserve.data.writer import build_csr
from gnnserve.deploy.dgs import DGSService
from gnnserve.errors import InvalidInputError, WorkerFailedError
from gnnserve.sampling.presample import DELETE, INSERT, PreSampler
from gnnserve.types import SampledSubgraph
from tests.conftest import random_simple_graph

pytestmark = [pytest.mark.distributed, pytest.mark.usefixtures("ray_instance")]
N = 2000


class Graph:
    """The test's own dynamic graph (in-neighbour lists) plus the reference PreSampler."""

    def __init__(self, n: int, edges: int, fanouts: list[int], seed: int) -> None:
        ei = random_simple_graph(n, edges, seed=seed)
        self.indptr, self.indices = build_csr(ei, n)
        self.nbrs = [self.indices[self.indptr[v] : self.indptr[v + 1]].tolist() for v in range(n)]
        self.ref = PreSampler(self.indptr, self.indices, fanouts, seed=seed)
        self.rng = np.random.default_rng(seed + 1)

    def neighbors_of(self, v: int) -> np.ndarray:
        return np.array(self.nbrs[v], dtype=np.int64)

    def batch(self, size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Random inserts and deletes (a third of the deletes hit a hop-0 reservoir member)."""
        events: list[tuple[int, int, int]] = []
        n = len(self.nbrs)
        while len(events) < size:
            v = int(self.rng.integers(n))
            if self.rng.random() < 0.5 and self.nbrs[v]:
                res = [u for u in self.ref.reservoir(v, 0).tolist() if u in self.nbrs[v]]
                hit = res and self.rng.random() < 0.33
                u = res[0] if hit else self.nbrs[v][int(self.rng.integers(len(self.nbrs[v])))]
                self.nbrs[v].remove(u)
                events.append((DELETE, u, v))
            else:
                u = int(self.rng.integers(n))
                self.nbrs[v].append(u)  # parallel edges allowed: slots are a multiset
                events.append((INSERT, u, v))
        kinds, srcs, dsts = (np.array(c, dtype=np.int64) for c in zip(*events, strict=True))
        self.ref.apply_events(kinds, srcs, dsts, self.neighbors_of)
        return kinds, srcs, dsts


def assert_same(got: SampledSubgraph, want: SampledSubgraph) -> None:
    """Bit-identical samples: nodes, seed rows, every block's sizes and edge_index."""
    np.testing.assert_array_equal(got.nodes, want.nodes)
    np.testing.assert_array_equal(got.seed_rows, want.seed_rows)
    assert got.num_seeds == want.num_seeds
    assert len(got.blocks) == len(want.blocks)
    for a, b in zip(got.blocks, want.blocks, strict=True):
        assert (a.n_src, a.n_dst) == (b.n_src, b.n_dst)
        np.testing.assert_array_equal(a.edge_index.numpy(), b.edge_index.numpy())


def check_requests(svc: DGSService, g: Graph, queries: np.ndarray, n_serving: int) -> None:
    """Batches spanning serving workers, single-worker batches and single seeds all match."""
    rng = np.random.default_rng(len(g.nbrs) + svc.version)
    for seeds in (
        rng.choice(queries, 64),
        queries[queries % n_serving == 0][:20],
        rng.choice(queries, 1),
        np.repeat(rng.choice(queries, 3), 2),
    ):
        assert_same(svc.sample(seeds), g.ref.sample(seeds))


def expected_caches(g: Graph, queries: np.ndarray, n_serving: int) -> list[dict]:
    """Per serving worker {(query, vertex): reservoir}: hop h reads R_{q_h} of every node reached
    before hop h, from the worker's query vertices (computed by BFS on the reference)."""
    out = []
    for w in range(n_serving):
        reached = set(queries[queries % n_serving == w].tolist())
        need: dict[tuple[int, int], list[int]] = {}
        for hop, q in enumerate(g.ref.hop_query.tolist()):
            grown = set(reached)
            for x in reached:
                need[(q, x)] = g.ref.reservoir(x, hop).tolist()
                grown.update(need[(q, x)])
            reached = grown
        out.append(need)
    return out


def actual_caches(svc: DGSService) -> list[dict]:
    """Per serving worker {(query, vertex): reservoir} as its local cache holds them."""
    out = []
    for rows in svc.cache_contents():
        out.append({(int(r[0]), int(r[1])): [int(x) for x in r[2:] if x >= 0] for r in rows})
    return out


def test_two_by_two_workers_equal_presampler() -> None:
    """Acceptance: 2 sampling + 2 serving workers == PreSampler, batch after batch."""
    g = Graph(N, 20_000, [5, 3], seed=3)
    queries = np.arange(N)
    svc = DGSService(g.indptr, g.indices, [5, 3], n_sampling=2, n_serving=2, seed=3)
    try:
        check_requests(svc, g, queries, 2)
        for t in range(1, 5):
            assert svc.apply_events(*g.batch(1500)) == t
            check_requests(svc, g, queries, 2)
        assert sum(s["events"] for s in svc.stats()) == 4 * 1500
    finally:
        svc.shutdown()


def test_subscription_tables_and_caches_are_exact() -> None:
    """3 hops, 3 sampling workers, query vertices a subset: caches hold exactly what is needed."""
    g = Graph(N, 16_000, [3, 2, 2], seed=5)
    queries = np.arange(0, N, 7)  # ~290 query vertices: caches far smaller than the graph
    svc = DGSService(g.indptr, g.indices, [3, 2, 2], 3, 2, seed=5, query_vertices=queries)
    dropped, added = 0, 0
    prev: list[dict] = []
    try:
        for step in range(4):
            if step:
                svc.apply_events(*g.batch(2000))
            want = expected_caches(g, queries, 2)
            have = actual_caches(svc)
            assert have == want  # same keys (none stale, none missing), same reservoirs
            subs = {tuple(r) for r in svc.subscriptions().tolist()}
            assert subs == {(q, v, w) for w, need in enumerate(want) for q, v in need}
            for old, new in zip(prev, have, strict=False):
                dropped += len(old.keys() - new.keys())
                added += len(new.keys() - old.keys())
            prev = have
            check_requests(svc, g, queries, 2)
        assert dropped > 50 and added > 50  # the batches did move subscriptions both ways
    finally:
        svc.shutdown()


def test_worker_counts_do_not_change_samples() -> None:
    """1 vs 3 sampling workers and 1 vs 2 serving workers (hops sharing one fanout)."""
    g = Graph(N, 20_000, [4, 4], seed=8)
    queries = np.arange(N)
    small = DGSService(g.indptr, g.indices, [4, 4], n_sampling=1, n_serving=1, seed=8)
    large = DGSService(g.indptr, g.indices, [4, 4], n_sampling=3, n_serving=2, seed=8)
    try:
        for _ in range(3):
            events = g.batch(2500)
            assert small.apply_events(*events) == large.apply_events(*events)
            seeds = np.random.default_rng(small.version).choice(queries, 100)
            want = g.ref.sample(seeds)
            assert_same(small.sample(seeds), want)
            assert_same(large.sample(seeds), want)
    finally:
        small.shutdown()
        large.shutdown()


def test_bad_input_is_rejected_with_a_message_and_changes_nothing() -> None:
    g = Graph(200, 1_500, [3, 2], seed=1)
    svc = DGSService(g.indptr, g.indices, [3, 2], 2, 2, seed=1, query_vertices=np.arange(100))
    try:
        seeds = np.arange(0, 100, 3)
        before, cached = svc.sample(seeds), svc.cache_contents()
        v, u = 5, g.nbrs[5][0]
        bad_calls = [
            (lambda: svc.sample(np.array([200])), "seeds"),
            (lambda: svc.sample(np.array([-1])), "seeds"),
            (lambda: svc.sample(np.array([], dtype=np.int64)), "seeds"),
            (lambda: svc.sample(np.array([3, 150])), "seeds"),  # not a query vertex
            (lambda: svc.apply_events([2], [0], [1]), "kinds"),
            (lambda: svc.apply_events([0, 1], [0], [1]), "kinds"),
            (lambda: svc.apply_events([0], [0], [200]), "dst"),
            (lambda: svc.apply_events([0, 1, 1], [7, u, u], [9, v, v]), "dsts"),  # 2nd delete
            (lambda: svc.apply_events([1], [v], [v]), "dsts"),  # no self loop 5 -> 5
            (lambda: svc.apply_events([0], [0], [1], version=5), "version"),
            (lambda: DGSService(g.indptr, g.indices, [3], n_sampling=0), "n_sampling"),
            (lambda: DGSService(g.indptr, g.indices, [0]), "fanouts"),
            (lambda: DGSService(g.indptr, g.indices, [3, -1]), "fanouts"),  # no "all" reservoir
        ]
        for call, field in bad_calls:
            with pytest.raises(InvalidInputError) as err:
                call()
            assert err.value.field == field
            assert err.value.message and "Traceback" not in err.value.message
        assert svc.version == 0  # the rejected batches changed nothing
        assert_same(svc.sample(seeds), before)
        for now, then in zip(svc.cache_contents(), cached, strict=True):
            np.testing.assert_array_equal(now, then)
        events = g.batch(50)
        assert svc.apply_events(*events, version=1) == 1
        assert svc.apply_events(*events, version=1) == 1  # a replayed batch applies once
        assert_same(svc.sample(seeds), g.ref.sample(seeds))
    finally:
        svc.shutdown()


def _kill(actor: object) -> None:
    """kill -9 a worker's process and wait until Ray reports the actor dead."""
    pid = ray.get(actor.pid.remote())  # type: ignore[attr-defined]
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            ray.get(actor.ping.remote(), timeout=5)  # type: ignore[attr-defined]
        except ray.exceptions.RayActorError:
            return
        time.sleep(0.05)
    raise AssertionError("the killed worker still answers")


def test_a_dead_serving_worker_is_replaced_with_the_same_cache() -> None:
    """kill -9 a serving worker: the request meeting it gets WorkerFailedError (no Ray
    details), the replacement caches exactly what the dead one held, and later requests and
    batches equal the PreSampler, including a death found during an update batch."""
    g = Graph(N, 16_000, [4, 3], seed=11)
    queries = np.arange(N)
    svc = DGSService(g.indptr, g.indices, [4, 3], n_sampling=2, n_serving=2, seed=11)
    try:
        svc.apply_events(*g.batch(800))
        cached = actual_caches(svc)
        seeds = queries[queries % 2 == 1][:40]  # all on serving worker 1
        _kill(svc._servers[1])
        with pytest.raises(WorkerFailedError) as err:
            svc.sample(seeds)
        assert err.value.http_status == 503 and err.value.retry_after_s
        assert "Actor" not in err.value.message and "pid" not in err.value.message
        assert svc.replaced == 1
        assert actual_caches(svc) == cached  # same reservoirs (rows may sit elsewhere)
        check_requests(svc, g, queries, 2)
        _kill(svc._servers[0])  # found by the next batch's commit
        assert svc.apply_events(*g.batch(800)) == 2
        assert svc.replaced == 2
        assert actual_caches(svc) == expected_caches(g, queries, 2)
        check_requests(svc, g, queries, 2)
        assert svc.recover() == []  # nothing else died
    finally:
        svc.shutdown()


def test_warm_up_leaves_no_kernel_to_compile_on_any_worker() -> None:
    """After ``warm_up``, requests on one worker, across workers and with duplicates, and
    update batches, compile nothing in any worker's process (each compiled in the warm-up),
    and the warm-up changed no sample (the workers still equal the reference pre-sampler)."""
    g = Graph(N, 20_000, [5, 3], seed=5)
    svc = DGSService(g.indptr, g.indices, [5, 3], n_sampling=2, n_serving=3, seed=5)
    try:
        svc.warm_up()
        warm = svc.compiled()
        assembled = [w["gnnserve.sampling.presample_kernels.assemble"] for w in warm["serving"]]
        assert all(assembled), "a serving worker was left cold by the warm-up"
        applied = [w["gnnserve.deploy.dgs.adjacency._apply"] for w in warm["sampling"]]
        assert all(applied), "a sampling worker's update path was left cold by the warm-up"
        check_requests(svc, g, np.arange(N), 3)
        assert svc.apply_events(*g.batch(500)) == 1
        check_requests(svc, g, np.arange(N), 3)
        assert svc.compiled() == warm
        # Start-up: no worker process imports torch (~2 s of CPU each), even after serving.
        loaded = [
            w.__ray_call__.remote(lambda _: "torch" in __import__("sys").modules)
            for w in svc._servers + svc._samplers
        ]
        assert ray.get(loaded) == [False] * 5
    finally:
        svc.shutdown()
