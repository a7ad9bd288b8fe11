"""AdaptiveFeatureCache: FaaS-GNN's memory-aware feature cache (§4.3) in front of a FeatureStore.

Entries are (vertex id, feature row, degree). Before a request runs, :meth:`prepare` is told the
request's vertices, their full-graph degrees and how many bytes the cache may hold once the
request's missing rows are in; it evicts the fewest lowest-degree entries that make them fit,
never one the request reads. :meth:`read` then serves hits from the cache and fetches every miss
from the wrapped store in one ``get_valid`` call.

Storage, all of it proportional to the cache, none to the graph (a serverless instance in front
of a 100M-node remote store cannot afford an N-sized slot map): slots ``[0, len)`` hold the rows
(one float32 slab) with their ids and degrees in parallel arrays; a sorted id array with the slot
of each id answers look-ups by ``np.searchsorted``. Eviction moves surviving tail slots into the
holes, so the slots stay dense, and the slab is resized to exactly ``len`` rows with
``ndarray.resize`` (``realloc``): an mmap-allocated slab (see ``models.memory``: a fixed
``M_MMAP_THRESHOLD``) shrinks in place with ``mremap`` and its pages go back to the OS at once,
with no transient copy that could push a memory-limited instance over its limit.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np
import torch

from gnnserve.data.validate import check_node_ids
from gnnserve.errors import InvalidInputError
from gnnserve.features.base import FeatureStore
from gnnserve.features.stores import gather_rows

# Bytes per entry besides its row: its id and degree (slot arrays) and its id and slot in the
# sorted look-up arrays, int64 each.
ENTRY_OVERHEAD_BYTES = 32


@dataclass
class CacheStats:
    """Running counters of an AdaptiveFeatureCache (rows counted per requested row)."""

    hits: int = 0  # requested rows whose id was cached when the read began
    misses: int = 0  # requested rows whose id was not (duplicates of one id each count)
    fetched_rows: int = 0  # distinct rows fetched from the wrapped store
    inner_calls: int = 0  # get_valid calls on the wrapped store (at most one per read)
    bytes_fetched: int = 0  # float32 bytes of the fetched rows
    evictions: int = 0  # entries evicted by prepare (clear() not counted)
    clears: int = 0  # clear() calls (FaaS-GNN: after a misprediction that risked OOM)

    @property
    def hit_rate(self) -> float:
        """hits / (hits + misses); 0.0 before any read."""
        total = self.hits + self.misses
        return self.hits / total if total else 0.0


class AdaptiveFeatureCache(FeatureStore):
    """Caches the rows read through it from ``inner``; memory-aware, degree-based eviction.

    ``nbytes`` counts ``len(self) * (4 * dim + ENTRY_OVERHEAD_BYTES)``: the arrays are sized to
    exactly the entries held, so this is the memory they occupy (allocator headers aside).
    Eviction order: lowest degree first, among equal degrees the larger id first. Thread-safe
    (one lock; a read's fetch from ``inner`` happens under it).
    """

    def __init__(self, inner: FeatureStore) -> None:
        self.inner = inner
        self._dim = inner.dim
        self.stats = CacheStats()
        self._lock = threading.Lock()
        self._empty()

    def _empty(self) -> None:
        # Owned arrays only: _resize reallocates them in place (no views of them ever escape).
        self._rows = np.empty((0, self._dim), dtype=np.float32)  # slot -> row
        self._slot_id = np.empty(0, dtype=np.int64)  # slot -> vertex id
        self._slot_degree = np.empty(0, dtype=np.int64)  # slot -> degree
        self._sorted_id = np.empty(0, dtype=np.int64)  # cached ids, ascending
        self._sorted_slot = np.empty(0, dtype=np.int64)  # slot of each _sorted_id

    @property
    def num_nodes(self) -> int:
        return self.inner.num_nodes

    @property
    def dim(self) -> int:
        return self._dim

    @property
    def entry_bytes(self) -> int:
        """Bytes one entry takes: its float32 row plus ENTRY_OVERHEAD_BYTES."""
        return 4 * self._dim + ENTRY_OVERHEAD_BYTES

    @property
    def nbytes(self) -> int:
        """Bytes held: ``len(self) * entry_bytes``."""
        return len(self) * self.entry_bytes

    def __len__(self) -> int:
        return int(self._sorted_id.size)

    def cached_ids(self) -> np.ndarray:
        """int64 ids of the entries held, ascending (a copy)."""
        return self._sorted_id.copy()

    def clear(self) -> int:
        """Drop every entry and free its memory; returns how many were dropped."""
        with self._lock:
            dropped = len(self)
            self._empty()
            self.stats.clears += 1
            return dropped

    def prepare(self, ids: np.ndarray, degrees: np.ndarray, budget_bytes: int) -> int:
        """Make room for a request before it runs; returns the number of entries evicted.

        ``ids``: the distinct int64 vertices the request will read; ``degrees``: their full-graph
        in-degrees (also refreshed on the cached ones); ``budget_bytes``: what the cache may hold
        once the request's missing rows are added. Evicts the fewest entries, lowest degree first,
        so that ``nbytes`` after adding them is <= the budget, never an entry in ``ids``; when
        even that cannot fit, evicts every other entry (the caller decides what to do).
        """
        ids, degrees = self._check(check_node_ids(ids, self.num_nodes, "ids"), degrees)
        if isinstance(budget_bytes, bool) or int(budget_bytes) < 0:
            raise InvalidInputError(f"budget_bytes must be >= 0, got {budget_bytes}", "budget")
        with self._lock:
            hit, slots = self._lookup(ids)
            self._slot_degree[slots[hit]] = degrees[hit]
            n, missing = len(self), int(ids.size - np.count_nonzero(hit))
            excess = (n + missing) * self.entry_bytes - int(budget_bytes)
            if excess <= 0:
                return 0
            protected = np.zeros(n, dtype=bool)
            protected[slots[hit]] = True
            candidates = np.flatnonzero(~protected)
            k = min(candidates.size, -(-excess // self.entry_bytes))
            if k == 0:
                return 0
            self._evict(self._lowest(candidates, k))
            self.stats.evictions += k
            return k

    def read(self, ids: np.ndarray, degrees: np.ndarray | None = None) -> torch.Tensor:
        """float32 [len(ids), F] rows of ``ids`` (duplicates allowed, order kept), equal to
        ``inner.get(ids)``; misses are fetched in one call and cached with ``degrees`` (aligned
        with ``ids``; None: degree 0). InvalidInputError naming ``ids`` or ``degrees``."""
        ids = check_node_ids(ids, self.num_nodes, "ids")
        if degrees is not None:
            ids, degrees = self._check(ids, degrees)
        return self._read_with(ids, degrees)

    def _read(self, ids: np.ndarray) -> torch.Tensor:
        """FeatureStore path (``get``/``get_valid``): misses cached with degree 0."""
        return self._read_with(ids, None)

    def _check(self, ids: np.ndarray, degrees: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        ids = np.asarray(ids, dtype=np.int64)
        deg = np.asarray(degrees)
        if deg.shape != ids.shape or (deg.size and not np.issubdtype(deg.dtype, np.integer)):
            raise InvalidInputError(
                f"degrees must be {ids.size} integers, one per id; got {deg.dtype} "
                f"{list(deg.shape)}",
                "degrees",
            )
        return ids, deg.astype(np.int64, copy=False)

    def _lookup(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(hit bool [n], slot int64 [n]: meaningful where hit) of ``ids``."""
        n = len(self)
        if n == 0:
            return np.zeros(ids.size, dtype=bool), np.zeros(ids.size, dtype=np.int64)
        pos = np.minimum(np.searchsorted(self._sorted_id, ids), n - 1)
        return self._sorted_id[pos] == ids, self._sorted_slot[pos]

    def _lowest(self, candidates: np.ndarray, k: int) -> np.ndarray:
        """The ``k`` slots of ``candidates`` first in eviction order (degree asc, id desc)."""
        if k >= candidates.size:
            return candidates
        degree = self._slot_degree[candidates]
        cut = np.partition(degree, k - 1)[k - 1]  # the k-th smallest degree
        below = candidates[degree < cut]
        tied = candidates[degree == cut]
        tied = tied[np.argsort(-self._slot_id[tied], kind="stable")[: k - below.size]]
        return np.concatenate([below, tied])

    def _read_with(self, ids: np.ndarray, degrees: np.ndarray | None) -> torch.Tensor:
        with self._lock:
            hit, slots = self._lookup(ids)
            n_hit = int(np.count_nonzero(hit))
            if degrees is not None and n_hit:
                self._slot_degree[slots[hit]] = degrees[hit]
            if n_hit < ids.size:
                miss_at = np.flatnonzero(~hit)
                slots[miss_at] = self._fetch(ids[miss_at], miss_at, degrees)
            self.stats.hits += n_hit
            self.stats.misses += int(ids.size) - n_hit
            return gather_rows(self._rows, slots)

    def _fetch(self, miss: np.ndarray, at: np.ndarray, degrees: np.ndarray | None) -> np.ndarray:
        """Fetch the distinct ids of ``miss`` (found at ``at`` of the request) from ``inner`` in
        one call, insert them; returns the slot of every ``miss`` entry."""
        unique, first = np.unique(miss, return_index=True)
        degree = degrees[at[first]] if degrees is not None else np.zeros(unique.size, np.int64)
        rows = self.inner.get_valid(unique).detach().cpu().numpy()
        base = len(self)
        self._insert(unique, degree, rows)
        self.stats.inner_calls += 1
        self.stats.fetched_rows += int(unique.size)
        self.stats.bytes_fetched += int(unique.size) * 4 * self._dim
        return base + np.searchsorted(unique, miss)

    def _insert(self, ids: np.ndarray, degree: np.ndarray, rows: np.ndarray) -> None:
        """Append entries for sorted, distinct, uncached ``ids`` at slots ``len..len+m``."""
        n, m = len(self), ids.size
        self._resize(n + m)
        self._rows[n:] = rows
        self._slot_id[n:] = ids
        self._slot_degree[n:] = degree
        pos = np.searchsorted(self._sorted_id, ids)
        self._sorted_id = np.insert(self._sorted_id, pos, ids)
        self._sorted_slot = np.insert(self._sorted_slot, pos, np.arange(n, n + m))

    def _evict(self, victims: np.ndarray) -> None:
        """Remove the entries at slots ``victims``; survivors beyond the new length move into
        the holes the victims leave below it, then the arrays shrink."""
        n = len(self)
        keep = n - victims.size
        gone = np.zeros(n, dtype=bool)
        gone[victims] = True
        holes = np.flatnonzero(gone[:keep])
        movers = keep + np.flatnonzero(~gone[keep:])
        self._rows[holes] = self._rows[movers]
        self._slot_id[holes] = self._slot_id[movers]
        self._slot_degree[holes] = self._slot_degree[movers]
        remap = np.arange(n)
        remap[movers] = holes
        stay = ~gone[self._sorted_slot]
        self._sorted_id = self._sorted_id[stay]
        self._sorted_slot = remap[self._sorted_slot[stay]]
        self._resize(keep)

    def _resize(self, n: int) -> None:
        # refcheck=False: the arrays are private and no view of them outlives a call.
        self._rows.resize((n, self._dim), refcheck=False)
        self._slot_id.resize(n, refcheck=False)
        self._slot_degree.resize(n, refcheck=False)
