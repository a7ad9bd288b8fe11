"""bench/quiver_routing.py pure helpers and load generators, against plain computations."""

from __future__ import annotations

import math
from concurrent.futures import Future
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

from gnnserve.errors import OverloadedError
from gnnserve.graph import open_graph_store
from tests.bench.loader import load_bench

routing = load_bench("quiver_routing")


def test_nearest_rank_is_the_smallest_value_covering_q_percent() -> None:
    rng = np.random.default_rng(0)
    for n in (1, 7, 100, 333):
        v = rng.exponential(5.0, n)
        v[rng.random(n) < 0.05] = math.inf  # failed requests
        for q in (50, 90, 99, 100):
            # brute force: the smallest value x with at least q% of the values <= x
            want = min(x for x in v if np.sum(v <= x) >= q / 100 * n)
            assert routing.nearest_rank(v, q) == want
    assert routing.nearest_rank(np.array([]), 99) == math.inf


def test_draw_request_sizes_follow_the_mix_and_nodes_the_degree() -> None:
    deg = np.array([0, 1, 3, 0, 6], dtype=float)
    cdf = np.cumsum(deg) / deg.sum()
    rng = np.random.default_rng(1)
    mix = {1: 0.5, 4: 0.3, 9: 0.2}
    reqs = [routing.draw_request(rng, cdf, mix) for _ in range(20_000)]
    sizes = np.array([r.size for r in reqs])
    for size, share in mix.items():  # 4 sigma of a binomial share
        assert abs(np.mean(sizes == size) - share) < 4 * math.sqrt(share * (1 - share) / 20_000)
    nodes = np.concatenate(reqs)
    assert nodes.dtype == np.int64
    counts = np.bincount(nodes, minlength=deg.size)
    assert counts[0] == 0 and counts[3] == 0  # no edges: never drawn
    want = deg / deg.sum()
    sigma = np.sqrt(want * (1 - want) / nodes.size)
    assert np.all(np.abs(counts / nodes.size - want) <= 4 * sigma + 1e-12)


def test_degree_cdf_is_the_cumulative_out_degree_share(small_store: Path) -> None:
    indptr, indices = open_graph_store(small_store).csr()
    n = indptr.size - 1
    deg = np.bincount(np.repeat(np.arange(n), np.diff(indptr)), minlength=n)  # row lengths
    got = routing.degree_cdf(small_store)
    assert got[-1] == 1.0
    np.testing.assert_allclose(np.diff(np.concatenate([[0.0], got])), deg / deg.sum())


def test_slo_arms_differ_only_in_the_batch_bound() -> None:
    arms = routing.slo_arms(10.0, (16, 64))
    assert set(arms) == {"strict", "loose", "fixed_16", "fixed_64"}
    assert arms["strict"]["batcher.psgs_bound"] == "strict"
    assert arms["loose"]["batcher.psgs_bound"] == "loose"
    assert all(a["sampler.routing"] == "latency" for a in arms.values())
    assert arms["fixed_64"] == {"sampler.routing": "latency", "batcher.max_batch_nodes": 64}


class FakeEngine:
    """Answers every request at once (timings: 0.25 ms queued of 1 ms), refuses (429) those of
    exactly 128 nodes."""

    def __init__(self) -> None:
        self.sizes: list[int] = []

    def request(self, nodes: np.ndarray) -> np.ndarray:
        return nodes

    def submit(self, nodes: np.ndarray) -> Future[Any]:
        self.sizes.append(int(nodes.size))
        if nodes.size == 128:
            raise OverloadedError("full")
        future: Future[Any] = Future()
        future.set_result(SimpleNamespace(timings=SimpleNamespace(queue_ms=0.25, total_ms=1.0)))
        return future


def test_open_loop_counts_refusals_as_infinite_and_answers_as_finite() -> None:
    engine = FakeEngine()
    cdf = np.linspace(0.1, 1.0, 10)
    lat = routing.open_loop(engine, cdf, 400.0, 0.5, seed=3)
    assert lat.size == len(engine.sizes) > 100
    refused = np.array(engine.sizes) == 128
    assert refused.any()
    assert np.all(np.isinf(lat[refused]))
    assert np.all(np.isfinite(lat[~refused])) and np.all(lat[~refused] < 50)


def test_kept_up_needs_the_answers_and_their_rate() -> None:
    due = np.sort(np.random.default_rng(2).uniform(0.0, 2.0, 500))
    quick = np.full(due.size, 5.0)  # every answer 5 ms after its send
    assert routing.kept_up(due, quick, 2.0)
    refused = quick.copy()
    refused[:6] = math.inf  # 1.2% not answered
    assert not routing.kept_up(due, refused, 2.0)
    # a backlog that grows: the k-th answer waits k ms, the last one ~0.5 s after the window
    growing = np.arange(due.size, dtype=float) * 1.0
    assert not routing.kept_up(due, growing, 2.0)
    assert routing.kept_up(due, growing * 0.1, 2.0)  # 50 ms behind at the end: within 5%


def test_a_hybrid_equals_a_single_path_when_its_point_sends_every_batch_one_way() -> None:
    cost = np.array([5.0, 2.0, 9.0, 4.0])
    same = routing.same_as_single
    assert same(math.inf, cost, 2) == "inline"
    assert same(9.0 + 5.0 + 0.5, cost, 2) == "inline"  # above the two costliest together
    assert same(9.0 + 5.0, cost, 2) is None  # the costliest batch reaches it
    assert same(2.0, cost, 2) == "parallel"  # the cheapest one-node batch reaches it
    assert same(0.0, cost, 2) == "parallel"
    assert same(2.5, cost, 2) is None
