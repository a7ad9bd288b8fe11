"""DGSService: the DGS architecture (seed 004, Figure 1) on a local Ray cluster.

Partitioning. Sampling worker i owns the vertex-id range ``KeyRanges.range_of(i)`` and so the
events u -> v with v in it (the update stream is keyed by the vertex whose reservoir changes).
Serving worker j owns the query vertices v with ``v % n_serving == j``. The two counts are
independent constructor arguments.

One update batch (version t) runs in phases; the coordinator (this object) only routes the
events and waits at the barriers, the data goes worker to worker:
1. check: each sampling worker replays its events against its adjacency (a delete must find its
   edge); any rejection rejects the whole batch, which then changes nothing.
2. ingest: each sampling worker applies its events in order (adjacency, then reservoirs with the
   PreSampler kernels) and sends, for every changed reservoir R_q(y) some serving worker W reads
   (y in L_h(W)), +-1 count deltas for the added / removed member to that member's owner.
3. settle level 1 .. k-1 (subscriptions.py): owners add the net deltas; a count crossing 0 <-> 1
   means W now needs / no longer needs that vertex's next-hop reservoir, which sends deltas for
   the level after it. k - 1 rounds reach the exact subscription tables.
4. publish: each sampling worker pushes to exactly the subscribed serving workers the reservoirs
   that changed or became needed, and drops the ones no longer needed; serving workers stage them.
5. commit: every serving worker applies its staged pushes of batch t at once.

Consistency model. Batches are applied one at a time, in the order ``apply_events`` is called,
each event exactly once and each vertex's events in batch order (one owner per vertex, events
kept in order when split). ``apply_events`` returns after step 5, so any later ``sample`` reads
batch t or newer; a request reads one committed batch on every serving worker it touches
(requests are submitted under the lock that commits are, and an actor runs one call at a time).
Batches carry versions: passing ``version`` makes a replay idempotent (an already applied version
is skipped, a gap is refused), the exactly-once hook for an upstream durable log. A request is
answered from the serving workers' local caches only; seeds of several serving workers are split,
each part sampled by its worker, and the parts merged into exactly the single-worker result.

Failures. A serving worker that dies is replaced: the request that met the death fails with
:class:`~gnnserve.errors.WorkerFailedError` (HTTP 503 with a retry hint; the details go to the
log), and a new worker at the last committed batch gets, from every sampling worker, exactly the
reservoirs it last pushed to the old one (``resync``), so its cache equals the one lost. A death
found during an update batch is handled the same way at that batch's commit. Between the
replacement and the next request or batch nothing else changes. A sampling worker that dies
takes its reservoirs and adjacency with it: that is not recovered here (the caller gives up on
DGS and samples locally).
"""

from __future__ import annotations

import logging
import threading
import time
from itertools import chain
from typing import Any

import numpy as np
import ray
from ray.exceptions import RayActorError

from gnnserve.data.validate import check_node_ids
from gnnserve.deploy.dgs.partition import KeyRanges, Modulo, split
from gnnserve.deploy.dgs.sampling_worker import SamplingWorker
from gnnserve.deploy.dgs.serving_worker import ServingWorker
from gnnserve.deploy.ray import start_ray, stop_ray
from gnnserve.errors import InvalidInputError, WorkerFailedError
from gnnserve.fanouts import check_fanouts
from gnnserve.sampling import presample_kernels as pk
from gnnserve.sampling.presample import DELETE, INSERT, check_csr
from gnnserve.sampling.sampler import to_subgraph
from gnnserve.types import SampledSubgraph

_SamplingActor = ray.remote(num_cpus=0)(SamplingWorker)
_ServingActor = ray.remote(num_cpus=0)(ServingWorker)
_IDENTITY = np.empty(0, dtype=np.int64)
log = logging.getLogger(__name__)


def _count(value: object, field: str) -> int:
    """A worker count: an int >= 1."""
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
        raise InvalidInputError(f"{field} must be an int >= 1, got {value!r}", field)
    return int(value)


class DGSService:
    """Sampling workers + serving workers for the k-hop query ``fanouts`` over a CSR graph.

    ``indptr`` / ``indices``: in-neighbour CSR of N vertices; ``query_vertices``: ids requests
    may ask for (default all). Uses the running Ray instance or starts a local one
    (``num_cpus`` logical CPUs; the workers reserve none).
    """

    def __init__(
        self,
        indptr: np.ndarray,
        indices: np.ndarray,
        fanouts: list[int],
        n_sampling: int = 2,
        n_serving: int = 2,
        seed: int = 0,
        query_vertices: np.ndarray | None = None,
        num_cpus: int | None = None,
    ) -> None:
        self.fanouts = check_fanouts(fanouts, allow_all=False)  # a reservoir holds no "all"
        queries = list(dict.fromkeys(self.fanouts))
        self.hop_query = np.array([queries.index(f) for f in self.fanouts], dtype=np.int64)
        self._fans = np.array(queries, dtype=np.int64)
        indptr, indices = check_csr(indptr, indices)
        self.num_nodes = indptr.size - 1
        self.ranges = KeyRanges(self.num_nodes, _count(n_sampling, "n_sampling"))
        self.serving = Modulo(_count(n_serving, "n_serving"))
        self.is_query = np.zeros(self.num_nodes, dtype=bool)
        qv = np.arange(self.num_nodes) if query_vertices is None else query_vertices
        self.is_query[check_node_ids(qv, self.num_nodes, "query_vertices")] = True
        self._owns_ray = start_ray(num_cpus or n_sampling + n_serving)
        self._lock = threading.Lock()  # commits vs request submission
        self._write_lock = threading.Lock()  # one batch at a time
        self.version = -1  # last committed batch
        self.replaced = 0  # serving workers replaced after they died
        self._servers: list[Any] = [
            _ServingActor.remote(j, self.num_nodes, self.fanouts) for j in range(n_serving)
        ]
        self._samplers: list[Any] = [
            self._sampler(i, indptr, indices, seed) for i in range(n_sampling)
        ]
        _wait([w.connect.remote(self._samplers, self._servers) for w in self._samplers])
        self._propagate(0, first_level=0)

    def _sampler(self, i: int, indptr: np.ndarray, indices: np.ndarray, seed: int) -> Any:
        """Start sampling worker i with the CSR rows of its key range."""
        lo, hi = self.ranges.range_of(i)
        rows = indptr[lo : hi + 1]
        sub_indices = np.asarray(indices[rows[0] : rows[-1]], dtype=np.int64)
        return _SamplingActor.remote(
            i, self.ranges.bounds, rows - rows[0], sub_indices, self.fanouts, seed,
            self.serving.parts, self.is_query[lo:hi],
        )  # fmt: skip

    # updates ---------------------------------------------------------------------------------
    def apply_events(
        self,
        kinds: np.ndarray,
        srcs: np.ndarray,
        dsts: np.ndarray,
        version: int | None = None,
    ) -> int:
        """Apply a batch of edge events (INSERT 0 / DELETE 1 of srcs[i] -> dsts[i]) in order.

        All or nothing: a bad event raises InvalidInputError and changes nothing. Returns the
        committed batch version; ``version`` (optional) = version + 1 expected, <= current skips.
        """
        with self._write_lock:
            if version is not None and self._replayed(version):
                return self.version
            kinds, srcs, dsts = self._check_events(kinds, srcs, dsts)
            if kinds.size == 0:
                return self.version
            parts = split(self.ranges.owner(dsts), self.ranges.parts)
            self._check_deletes(parts, kinds, srcs, dsts)
            t = self.version + 1
            acks = ray.get(
                [
                    self._samplers[i].ingest.remote(t, kinds[p], srcs[p], dsts[p])
                    for i, p in enumerate(parts)
                    if p.size
                ]
            )
            self._propagate(t, first_level=1, acks=acks)
            return t

    def _replayed(self, version: int) -> bool:
        """True when batch ``version`` is already applied; InvalidInputError on a gap."""
        if version <= self.version:
            return True
        if version != self.version + 1:
            raise InvalidInputError(
                f"batch version {version} skips ahead: last applied is {self.version}", "version"
            )
        return False

    def _check_events(
        self, kinds: np.ndarray, srcs: np.ndarray, dsts: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Events as int64 arrays of equal length, kinds in {INSERT, DELETE}, ids < N."""
        kinds_arr = np.asarray(kinds)
        if kinds_arr.size and not np.issubdtype(kinds_arr.dtype, np.integer):
            raise InvalidInputError(f"event kinds must be integers, got {kinds_arr.dtype}", "kinds")
        kinds_arr = kinds_arr.astype(np.int64)
        srcs = check_node_ids(srcs, self.num_nodes, "src")
        dsts = check_node_ids(dsts, self.num_nodes, "dst")
        if kinds_arr.ndim != 1 or not kinds_arr.size == srcs.size == dsts.size:
            raise InvalidInputError("kinds, srcs and dsts must be 1-D of equal length", "kinds")
        bad = np.flatnonzero((kinds_arr != INSERT) & (kinds_arr != DELETE))
        if bad.size:
            i = int(bad[0])
            raise InvalidInputError(
                f"event {i}: kind {int(kinds_arr[i])} is neither INSERT (0) nor DELETE (1)",
                "kinds",
            )
        return kinds_arr, srcs, dsts

    def _check_deletes(
        self, parts: list[np.ndarray], kinds: np.ndarray, srcs: np.ndarray, dsts: np.ndarray
    ) -> None:
        """Reject the batch if some delete finds no edge (first such event in batch order)."""
        owners = [i for i, p in enumerate(parts) if p.size]
        found = ray.get(
            [
                self._samplers[i].check.remote(kinds[parts[i]], srcs[parts[i]], dsts[parts[i]])
                for i in owners
            ]
        )
        bad = [(int(parts[i][r[0]]), r[1]) for i, r in zip(owners, found, strict=True) if r]
        if bad:
            pos, why = min(bad)
            raise InvalidInputError(f"event {pos}: {why}; batch rejected", "dsts")

    def _propagate(
        self, version: int, first_level: int, acks: list[list[Any]] | None = None
    ) -> None:
        """Phases 3-5 of a batch: settle the levels, publish, commit on every serving worker.

        A serving worker found dead when its pushes or its commit are awaited is replaced at
        this batch (the sampling workers' pushed state is this batch's by then)."""
        _wait(acks or [])
        for level in range(first_level, len(self.fanouts)):
            _wait(ray.get([w.settle.remote(level) for w in self._samplers]))
        pushes = chain.from_iterable(ray.get([w.publish.remote(version) for w in self._samplers]))
        dead = {w for w, ref in pushes if not _alive(ref)}
        with self._lock:
            for j, server in enumerate(self._servers):
                if j not in dead and not _alive(server.commit.remote(version)):
                    dead.add(j)
            self.version = version
            self._replace(sorted(dead))

    # failures --------------------------------------------------------------------------------
    def recover(self) -> list[int]:
        """Replace every serving worker that died (see the module doc); returns their indices."""
        with self._write_lock, self._lock:
            dead = [j for j, s in enumerate(self._servers) if not _alive(s.ping.remote())]
            self._replace(dead)
        return dead

    def _replace(self, dead: list[int]) -> None:
        """New serving workers ``dead`` at ``self.version``, their caches rebuilt from the
        sampling workers. The caller holds both locks (no batch, no request in between)."""
        if not dead:
            return
        start = time.perf_counter()
        for j in dead:
            self._servers[j] = _ServingActor.remote(j, self.num_nodes, self.fanouts, self.version)
        _wait([w.connect.remote(self._samplers, self._servers) for w in self._samplers])
        _wait(ray.get([w.resync.remote(j) for w in self._samplers for j in dead]))
        self.replaced += len(dead)
        log.warning(
            "DGS: serving worker(s) %s died and were replaced at batch %d in %.1f s",
            dead,
            self.version,
            time.perf_counter() - start,
        )

    # requests --------------------------------------------------------------------------------
    def sample(self, seeds: np.ndarray) -> SampledSubgraph:
        """k-hop sample of ``seeds`` (duplicates allowed) from the serving workers' caches.

        Equal to ``PreSampler.sample(seeds)`` for the same seed and event sequence.
        """
        seeds = self._check_seeds(seeds)
        groups = [g for g in split(self.serving.owner(seeds), self.serving.parts) if g.size]
        owners = self.serving.owner(seeds[[g[0] for g in groups]]).tolist()
        with self._lock:
            refs = [
                self._servers[w].sample.remote(seeds[g])
                for w, g in zip(owners, groups, strict=True)
            ]
        try:
            parts = ray.get(refs)
        except RayActorError as exc:
            log.warning("DGS: a serving worker died while answering: %s", exc)
            self.recover()
            raise WorkerFailedError(
                "a DGS serving worker failed while answering this request and was replaced; "
                "retry the request"
            ) from None
        if len({v for v, _ in parts}) != 1:
            raise RuntimeError("serving workers answered from different batches")
        subgraphs = [to_subgraph(_writable(arrays), self.hop_query.size) for _, arrays in parts]
        if len(subgraphs) == 1:
            return subgraphs[0]
        return merge_samples(seeds, subgraphs, self.hop_query, self._fans)

    def warm_up(self) -> None:
        """Compile each sampling worker's update path (``SamplingWorker.warm_up``) and answer
        one sample on every serving worker alone and one across all of them (the merge), so
        that no request or update after this compiles a kernel."""
        ray.get([w.warm_up.remote() for w in self._samplers])
        queries = np.flatnonzero(self.is_query)
        if queries.size == 0:
            return
        owner = self.serving.owner(queries)
        firsts = np.array([queries[owner == w][0] for w in np.unique(owner)], dtype=np.int64)
        for seed in firsts:
            self.sample(np.array([seed]))
        self.sample(np.concatenate([firsts, firsts]))  # duplicates, several workers: merged

    def compiled(self) -> dict[str, list[dict[str, list[str]]]]:
        """Per serving and per sampling worker, the numba signatures its process holds."""
        return {
            "serving": ray.get([s.compiled.remote() for s in self._servers]),
            "sampling": ray.get([w.compiled.remote() for w in self._samplers]),
        }

    def _check_seeds(self, seeds: np.ndarray) -> np.ndarray:
        """Seeds as int64, non-empty, each a query vertex of this service."""
        seeds = check_node_ids(seeds, self.num_nodes, "seeds")
        if seeds.size == 0:
            raise InvalidInputError("seeds must not be empty", "seeds")
        unknown = np.flatnonzero(~self.is_query[seeds])
        if unknown.size:
            v = int(seeds[unknown[0]])
            raise InvalidInputError(f"seed {v} is not a query vertex of this service", "seeds")
        return seeds

    # introspection ---------------------------------------------------------------------------
    def cache_contents(self) -> list[np.ndarray]:
        """Per serving worker, int64 [m, 2 + max fanout] (query, vertex, members) it caches."""
        return ray.get([s.contents.remote() for s in self._servers])  # type: ignore[no-any-return]

    def subscriptions(self) -> np.ndarray:
        """int64 [m, 3] (query, vertex, serving worker) of every subscription, all workers."""
        return np.concatenate(ray.get([w.subscriptions.remote() for w in self._samplers]))

    def stats(self) -> list[dict[str, int]]:
        """Per sampling worker: events applied, last batch, bytes held."""
        return ray.get([w.stats.remote() for w in self._samplers])  # type: ignore[no-any-return]

    def shutdown(self) -> None:
        """Stop the workers, and Ray if this service started it."""
        for actor in self._samplers + self._servers:
            ray.kill(actor)
        self._samplers, self._servers = [], []
        stop_ray(self._owns_ray)
        self._owns_ray = False

    def __enter__(self) -> DGSService:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()


def _alive(ref: Any) -> bool:
    """Wait for one actor call: False when its actor died (RayActorError), else True."""
    try:
        ray.get(ref)
    except RayActorError:
        return False
    return True


def _wait(refs: list[Any]) -> None:
    """Wait for ObjectRefs, given flat or as lists of lists (acks returned by workers)."""
    flat = list(chain.from_iterable(r if isinstance(r, list) else [r] for r in refs))
    ray.get(flat)


def _writable(assembled: tuple[Any, ...]) -> tuple[Any, ...]:
    """Ray hands large arrays over read-only (zero-copy from its object store); copy those,
    as torch tensors made from them must own writable memory."""
    return tuple(
        a.copy() if isinstance(a, np.ndarray) and not a.flags.writeable else a for a in assembled
    )


def merge_samples(
    seeds: np.ndarray, parts: list[SampledSubgraph], hop_query: np.ndarray, fans: np.ndarray
) -> SampledSubgraph:
    """The sample of ``seeds`` assembled from samples of disjoint groups of them.

    Each part's block h holds, per destination in order, its hop-h reservoir in slot order; the
    union of the parts holds every reservoir the whole request reads (L_h of a union is the
    union of the L_h), so assembling from them on compact ids reproduces the single-cache
    result (assembly depends only on first-appearance order, not on id values).
    """
    ids = np.unique(np.concatenate([p.nodes for p in parts]))
    cols = np.concatenate([[0], np.cumsum(fans)[:-1]]).astype(np.int64)
    table = np.full((ids.size, int(fans.sum())), -1, dtype=np.int64)
    counts = np.full((ids.size, fans.size), -1, dtype=np.int64)
    for part in parts:
        local = np.searchsorted(ids, part.nodes)
        for h, block in enumerate(reversed(part.blocks)):
            src, dst = block.edge_index.numpy()
            q = int(hop_query[h])
            per_dst = np.bincount(dst, minlength=block.n_dst)
            counts[local[: block.n_dst], q] = per_dst
            slot = np.arange(dst.size) - np.concatenate([[0], np.cumsum(per_dst)[:-1]])[dst]
            table[local[dst], cols[q] + slot] = local[src]
    local_id = np.full(ids.size, -1, dtype=np.int64)
    out = pk.assemble(
        table, counts, cols, hop_query, np.searchsorted(ids, seeds), local_id, _IDENTITY
    )
    if out[6] >= 0:
        raise RuntimeError(f"merged parts miss a reservoir of vertex {ids[out[6]]}")
    return to_subgraph((ids[out[0]], *out[1:]), hop_query.size)
