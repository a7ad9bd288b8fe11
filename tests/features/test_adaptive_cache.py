"""AdaptiveFeatureCache: rows equal the wrapped store's; eviction, hit counts and the one fetch
per read agree with a plain dict/set reference; evicted memory goes back to the OS."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from gnnserve.data.layout import read_meta
from gnnserve.data.writer import GraphData, write_store
from gnnserve.errors import InvalidInputError
from gnnserve.features.adaptive_cache import ENTRY_OVERHEAD_BYTES, AdaptiveFeatureCache
from gnnserve.features.stores import InMemoryFeatures


class CountingFeatures(InMemoryFeatures):
    """The real in-memory store, recording the ids of every read it serves."""

    def __init__(self, store: Path) -> None:
        super().__init__(store, read_meta(store))
        self.calls: list[np.ndarray] = []

    def _read(self, ids: np.ndarray) -> torch.Tensor:
        self.calls.append(ids.copy())
        return super()._read(ids)


class Reference:
    """The cache's contract in plain Python: id -> degree, eviction by sorting and popping."""

    def __init__(self, entry_bytes: int) -> None:
        self.entry_bytes = entry_bytes
        self.degree: dict[int, int] = {}

    def prepare(self, ids: list[int], degrees: list[int], budget: int) -> int:
        for v, d in zip(ids, degrees, strict=True):
            if v in self.degree:
                self.degree[v] = d
        request = set(ids)
        missing = sum(v not in self.degree for v in ids)
        order = sorted(
            (v for v in self.degree if v not in request), key=lambda v: (self.degree[v], -v)
        )
        evicted = 0
        while (len(self.degree) + missing) * self.entry_bytes > budget and order:
            del self.degree[order.pop(0)]
            evicted += 1
        return evicted

    def read(self, ids: list[int], degrees: list[int]) -> tuple[int, int]:
        cached = set(self.degree)
        hits = sum(v in cached for v in ids)
        for v, d in zip(ids, degrees, strict=True):
            self.degree[v] = d
        return hits, len(ids) - hits


@pytest.fixture()
def inner(small_store: Path) -> CountingFeatures:
    return CountingFeatures(small_store)


def test_random_requests_match_store_and_reference(inner: CountingFeatures) -> None:
    cache = AdaptiveFeatureCache(inner)
    ref = Reference(cache.entry_bytes)
    assert cache.entry_bytes == 16 * 4 + ENTRY_OVERHEAD_BYTES
    rng = np.random.default_rng(1)
    for step in range(300):
        if step % 25 == 0:
            degree_of = rng.integers(0, 6, inner.num_nodes)  # few values: many ties
        ids = rng.choice(400, size=int(rng.integers(1, 60)), replace=False).astype(np.int64)
        budget = int(rng.integers(0, 250)) * cache.entry_bytes + int(rng.integers(0, 8))
        before = set(cache.cached_ids().tolist())
        evicted = cache.prepare(ids, degree_of[ids], budget)
        assert evicted == ref.prepare(ids.tolist(), degree_of[ids].tolist(), budget)
        assert sorted(ref.degree) == cache.cached_ids().tolist()
        assert before & set(ids.tolist()) <= set(cache.cached_ids().tolist())  # request kept
        reads = rng.permutation(np.concatenate([ids, ids[: ids.size // 3]]))  # duplicates
        hits, misses = cache.stats.hits, cache.stats.misses
        rows = cache.read(reads, degree_of[reads])
        torch.testing.assert_close(rows, inner.get(reads), atol=0, rtol=0)
        assert (cache.stats.hits - hits, cache.stats.misses - misses) == ref.read(
            reads.tolist(), degree_of[reads].tolist()
        )
        assert len(cache) == len(ref.degree)
        assert cache.nbytes == len(cache) * cache.entry_bytes
        if ids.size * cache.entry_bytes <= budget:
            assert cache.nbytes <= budget


def test_eviction_order_lowest_degree_then_larger_id(inner: CountingFeatures) -> None:
    cache = AdaptiveFeatureCache(inner)
    ids = np.array([10, 11, 12, 13, 14, 15], dtype=np.int64)
    cache.read(ids, np.array([5, 1, 1, 0, 9, 1]))
    eb = cache.entry_bytes
    # 2 new rows, room for 6 entries: evict 2 -> 13 (degree 0), then 15 (degree 1, largest id)
    assert cache.prepare(np.array([20, 21]), np.array([0, 0]), 6 * eb + eb - 1) == 2
    assert cache.cached_ids().tolist() == [10, 11, 12, 14]
    assert cache.stats.evictions == 2
    # 13 is asked for again with a high degree: the request's cached 12 is kept although its
    # degree is low; 11 goes
    assert cache.prepare(np.array([12, 13]), np.array([1, 50]), 4 * eb) == 1
    assert cache.cached_ids().tolist() == [10, 12, 14]


def test_request_rows_are_never_evicted(inner: CountingFeatures) -> None:
    cache = AdaptiveFeatureCache(inner)
    cache.read(np.arange(50), np.zeros(50, np.int64))
    request = np.arange(40, 70)  # 10 cached, 20 missing
    assert cache.prepare(request, np.full(30, 100), budget_bytes=0) == 40  # all others
    assert cache.cached_ids().tolist() == list(range(40, 50))
    assert cache.prepare(request, np.full(30, 100), budget_bytes=0) == 0  # nothing evictable


def test_one_fetch_per_read_of_the_missing_rows(inner: CountingFeatures) -> None:
    cache = AdaptiveFeatureCache(inner)
    cache.read(np.array([5, 3, 5, 9]))
    assert [c.tolist() for c in inner.calls] == [[3, 5, 9]]
    cache.read(np.array([9, 3, 3]))  # all hits: no fetch
    assert len(inner.calls) == 1
    out = cache.get(np.array([7, 1, 9, 7, 1]))  # FeatureStore path: one fetch of {1, 7}
    assert [c.tolist() for c in inner.calls[1:]] == [[1, 7]]
    torch.testing.assert_close(out, inner.get(np.array([7, 1, 9, 7, 1])), atol=0, rtol=0)
    stats = cache.stats
    assert (stats.hits, stats.misses, stats.fetched_rows, stats.inner_calls) == (4, 8, 5, 2)
    assert stats.bytes_fetched == 5 * 16 * 4 and stats.hit_rate == pytest.approx(4 / 12)


def test_clear_empty_reads_and_bad_input(inner: CountingFeatures) -> None:
    cache = AdaptiveFeatureCache(inner)
    assert cache.read(np.array([], np.int64)).shape == (0, 16)
    cache.read(np.arange(10))
    assert cache.clear() == 10 and len(cache) == 0 and cache.nbytes == 0
    assert cache.stats.clears == 1
    torch.testing.assert_close(cache.read(np.array([4])), inner.get(np.array([4])))
    with pytest.raises(InvalidInputError) as info:
        cache.read(np.array([1, 2000]))
    assert info.value.field == "ids"
    with pytest.raises(InvalidInputError) as info:
        cache.read(np.array([1, 2]), np.array([1]))
    assert info.value.field == "degrees"
    with pytest.raises(InvalidInputError) as info:
        cache.prepare(np.array([1]), np.array([1]), -1)
    assert info.value.field == "budget"


def _rss() -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    pytest.skip("no VmRSS in /proc/self/status")


def test_evicted_rows_are_returned_to_the_os(tmp_path: Path) -> None:
    n, dim = 1500, 8192  # 48 MiB of rows: above glibc's largest dynamic mmap threshold
    rng = np.random.default_rng(0)
    edges = np.stack([np.arange(n - 1), np.arange(1, n)])
    write_store(GraphData("wide", n, edges, rng.standard_normal((n, dim), np.float32)), tmp_path)
    cache = AdaptiveFeatureCache(InMemoryFeatures(tmp_path, read_meta(tmp_path)))
    base = _rss()
    cache.read(np.arange(n), np.arange(n))
    full = _rss()
    assert full - base > 0.9 * n * dim * 4
    cache.prepare(np.arange(100), np.arange(100), 100 * cache.entry_bytes)
    assert len(cache) == 100
    assert full - _rss() > 0.8 * (n - 100) * dim * 4  # freed at once, not kept by the allocator
