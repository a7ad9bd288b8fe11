"""DGSService: the DGS architecture (seed 004, Figure 1) on a Ray cluster, fed by the log.

Partitioning. Sampling worker i owns the key range ``KeyRanges.owned(i)`` (a contiguous range
of the starting graph's ids, then every n_sampling-th added id) and so the events u -> v with v
in it (the update stream is keyed by the vertex whose reservoir changes). Serving worker j owns
the query vertices v with ``v % n_serving == j``. The two counts are independent.

The event stream is the update log (``dynamic.wal``), as DGS's Kafka topic: the coordinator
(this object) never carries events. It tells the workers that batches through seq t are
durable (``advance``, the store's version hook; ``apply_events`` first writes the service's own
log); then, for batch t (all batches up to t at once when several are new):
1. consume: each sampling worker reads the records after its log position from the
   :class:`~gnnserve.deploy.dgs.feed.LogFeed` and applies its own events in order (adjacency,
   then reservoirs with the PreSampler kernels; new vertices get rows and level-0
   subscriptions), and sends, for every changed reservoir R_q(y) some serving worker W reads
   (y in L_h(W)), +-1 count deltas for the added / removed member to that member's owner.
2. settle level 0 .. k-1 (subscriptions.py): owners add the net deltas; a count crossing 0 <-> 1
   means W now needs / no longer needs that vertex's next-hop reservoir, which sends deltas for
   the level after it. k rounds reach the exact subscription tables.
3. publish: each sampling worker pushes to exactly the subscribed serving workers the reservoirs
   that changed or became needed, and drops the ones no longer needed; serving workers stage them.
4. commit: every serving worker applies its staged pushes of batch t at once.
``apply_events`` checks a batch on the sampling workers (a delete must find its edge) before it
logs it; a store checks its batches itself.

Consistency model. Each record is applied exactly once by its workers, in log order (a worker
applies only the record after its position), each vertex's events in batch order. ``advance``
returns after step 4, so any later ``sample`` reads batch t or newer; a request reads one
committed batch on every serving worker it touches (requests are submitted under the lock that
commits are, and an actor runs one call at a time), and ``sample_at`` reports that batch. A
request is answered from the serving workers' local caches only; seeds of several serving
workers are split, each part sampled by its worker, and the parts merged into exactly the
single-worker result.

Failures. A serving worker that dies is replaced: the request that met the death fails with
:class:`~gnnserve.errors.WorkerFailedError` (HTTP 503 with a retry hint; the details go to the
log), and a new worker at the last committed batch gets, from every sampling worker, exactly the
reservoirs it last pushed to the old one (``resync``). A sampling worker that dies (found when a
batch calls it) is rebuilt from its last checkpoint (``recovery``) and replays the log from the
checkpoint's position; since its reservoirs depend only on its events and per-vertex
randomness, they equal those of a worker that never died. The subscription counts, which other
workers' messages built, are then recounted everywhere in a new epoch and every serving cache
is replaced by full copies, at the batch being applied (``_rebuild_once``).
"""

from __future__ import annotations

import logging
import shutil
import threading
from itertools import chain
from typing import Any

import numpy as np
import ray
from ray.exceptions import RayActorError

from gnnserve.data.validate import check_node_ids
from gnnserve.deploy.dgs.checks import check_events, check_seeds, positive_count
from gnnserve.deploy.dgs.feed import LogFeed, LogSource, Position, events_batch, on_this_node
from gnnserve.deploy.dgs.merge import merge_samples, writable
from gnnserve.deploy.dgs.partition import KeyRanges, Modulo, split
from gnnserve.deploy.dgs.recovery import Checkpoints, Recovery, ServingActor, alive, wait
from gnnserve.deploy.dgs.sampling_worker import Csr, SamplingWorker
from gnnserve.deploy.ray import start_ray, stop_ray
from gnnserve.dynamic.wal import UpdateLog
from gnnserve.errors import InvalidInputError, WorkerFailedError
from gnnserve.fanouts import check_fanouts
from gnnserve.sampling.presample import check_csr
from gnnserve.sampling.sampler import to_subgraph
from gnnserve.tempdirs import owned_tempdir, sweep_dead
from gnnserve.types import SampledSubgraph

_SamplingActor = ray.remote(num_cpus=0)(SamplingWorker)
_FeedActor = ray.remote(num_cpus=0)(LogFeed)
log = logging.getLogger(__name__)


class DGSService(Recovery):
    """Sampling workers + serving workers for the k-hop query ``fanouts`` over a CSR graph.

    ``indptr`` / ``indices``: in-neighbour CSR of N vertices; ``query_vertices``: ids requests
    may ask for (default all; added vertices always are). ``log``: the update log the workers
    consume and where they start in it (a store's log, fed by ``advance``); without one the
    service keeps its own log, written by ``apply_events``. Uses the running Ray instance or
    starts a local one (``num_cpus`` logical CPUs; the workers reserve none).
    ``checkpoint_every``: batches between sampling-worker checkpoints (``recovery``);
    ``worker_options``: Ray actor options for every worker (e.g. ``{"resources": {"dgs": 0.1}}``
    to place them on the nodes that offer that resource).
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
        log: LogSource | None = None,
        checkpoint_every: int = 64,
        worker_options: dict[str, Any] | None = None,
    ) -> None:
        self.fanouts = check_fanouts(fanouts, allow_all=False)  # a reservoir holds no "all"
        queries = list(dict.fromkeys(self.fanouts))
        self.hop_query = np.array([queries.index(f) for f in self.fanouts], dtype=np.int64)
        self._fans = np.array(queries, dtype=np.int64)
        indptr, indices = check_csr(indptr, indices)
        self.num_nodes = indptr.size - 1
        self.ranges = KeyRanges(self.num_nodes, positive_count(n_sampling, "n_sampling"))
        self.serving = Modulo(positive_count(n_serving, "n_serving"))
        self.is_query = np.zeros(self.num_nodes, dtype=bool)
        qv = np.arange(self.num_nodes) if query_vertices is None else query_vertices
        self.is_query[check_node_ids(qv, self.num_nodes, "query_vertices")] = True
        for stale in sweep_dead("dgs"):  # of deployments killed before they cleaned up
            logging.getLogger(__name__).info("dgs: removed %s (its owner is gone)", stale)
        self.dir = owned_tempdir("dgs")
        self._own_log = UpdateLog(self.dir / "updates.log", "never") if log is None else None
        self.log = log or LogSource(self.dir / "updates.log", Position(0, 0), dim=0)
        self.checkpoints = Checkpoints(
            self.dir, positive_count(checkpoint_every, "checkpoint_every")
        )
        self.worker_options = dict(worker_options or {})
        self._owns_ray = start_ray(num_cpus or n_sampling + n_serving)
        self._lock = threading.Lock()  # commits vs request submission
        self._write_lock = threading.Lock()  # one batch at a time
        self.version = self.log.start.seq  # last committed batch
        self.epoch = 0  # recovery epoch (sampling_worker module doc)
        self.replaced = 0  # serving workers replaced after they died
        self.rebuilt = 0  # sampling workers rebuilt from their checkpoints
        self._feed: Any = _FeedActor.options(**on_this_node()).remote(str(self.log.path))
        self._servers: list[Any] = [
            self._actor(ServingActor).remote(j, self.num_nodes, self.fanouts, self.version - 1)
            for j in range(n_serving)
        ]
        self._samplers: list[Any] = [
            self._sampler(i, seed, csr=self._rows(i, indptr, indices)) for i in range(n_sampling)
        ]
        self._seed = seed
        wait([w.connect.remote(self._samplers, self._servers) for w in self._samplers])
        self._propagate(self.version, self.num_nodes)
        self.checkpoints.take(self._samplers, self.version, force=True, wait=True)

    def _rows(self, i: int, indptr: np.ndarray, indices: np.ndarray) -> Csr:
        """The CSR rows of sampling worker i's key range, and which are query vertices."""
        lo, hi = self.ranges.range_of(i)
        rows = indptr[lo : hi + 1]
        sub = np.asarray(indices[rows[0] : rows[-1]], dtype=np.int64)
        return rows - rows[0], sub, self.is_query[lo:hi]

    def _sampler(self, i: int, seed: int, csr: Csr | None = None, ckpt: bytes | None = None) -> Any:
        """Start sampling worker i from its CSR rows or from a checkpoint."""
        return self._actor(_SamplingActor).remote(
            i, self.ranges, self.fanouts, seed, self.serving.parts, self._feed, self.log.dim,
            self.log.start, csr=csr, checkpoint=ckpt,
        )  # fmt: skip

    def _actor(self, cls: Any) -> Any:
        """A worker actor class with ``worker_options`` applied."""
        return cls.options(**self.worker_options) if self.worker_options else cls

    # updates ---------------------------------------------------------------------------------
    def apply_events(
        self,
        kinds: np.ndarray,
        srcs: np.ndarray,
        dsts: np.ndarray,
        version: int | None = None,
        add_nodes: int = 0,
    ) -> int:
        """Add ``add_nodes`` vertices (the next ids), then apply a batch of edge events (INSERT 0
        / DELETE 1 of srcs[i] -> dsts[i]) in order, through this service's own log.

        All or nothing: a bad event raises InvalidInputError and changes nothing. Returns the
        committed batch version; ``version`` (optional) = version + 1 expected, <= current skips.
        """
        if self._own_log is None:
            raise RuntimeError("this service consumes a store's log: updates go to the store")
        with self._write_lock:
            if version is not None and self._replayed(version):
                return self.version
            n = self.num_nodes + positive_count(add_nodes + 1, "add_nodes + 1") - 1
            t = self.version + 1
            kinds, srcs, dsts = check_events(kinds, srcs, dsts, n)
            if kinds.size == 0 and n == self.num_nodes:
                return self.version
            try:
                self._check_deletes(kinds, srcs, dsts, n)
            except RayActorError as exc:  # rebuild at the last batch, then check on it
                log.warning("DGS: a sampling worker died before batch %d: %s", t, exc)
                self._rebuild(self.version, self.num_nodes)
                self._check_deletes(kinds, srcs, dsts, n)
            self._own_log.append_frame(t, events_batch(n - self.num_nodes, kinds, srcs, dsts))
            self._advance(t, n)
            return t

    def advance(self, seq: int, num_nodes: int) -> int:
        """Batches through ``seq`` are in the log (the graph has ``num_nodes`` vertices): the
        workers consume them, and they are committed together. Returns the committed batch."""
        with self._write_lock:
            if seq > self.version:
                self._advance(seq, num_nodes)
            return self.version

    def _advance(self, seq: int, num_nodes: int) -> None:
        """Consume through ``seq`` and commit; rebuild the workers that died on the way."""
        try:
            acks = ray.get([w.consume.remote(seq) for w in self._samplers])
            self._propagate(seq, num_nodes, acks)
        except RayActorError as exc:
            log.warning("DGS: a sampling worker died during batch %d: %s", seq, exc)
            self._rebuild(seq, num_nodes)
        self.checkpoints.take(self._samplers, seq)

    def _replayed(self, version: int) -> bool:
        """True when batch ``version`` is already applied; InvalidInputError on a gap."""
        if version <= self.version:
            return True
        if version != self.version + 1:
            raise InvalidInputError(
                f"batch version {version} skips ahead: last applied is {self.version}", "version"
            )
        return False

    def _check_deletes(
        self, kinds: np.ndarray, srcs: np.ndarray, dsts: np.ndarray, num_nodes: int
    ) -> None:
        """Reject the batch if some delete finds no edge (first such event in batch order)."""
        parts = split(self.ranges.owner(dsts), self.ranges.parts)
        owners = [i for i, p in enumerate(parts) if p.size]
        found = ray.get(
            [
                self._samplers[i].check.remote(
                    kinds[parts[i]], srcs[parts[i]], dsts[parts[i]], num_nodes
                )
                for i in owners
            ]
        )
        bad = [(int(parts[i][r[0]]), r[1]) for i, r in zip(owners, found, strict=True) if r]
        if bad:
            pos, why = min(bad)
            raise InvalidInputError(f"event {pos}: {why}; batch rejected", "dsts")

    def _propagate(self, version: int, num_nodes: int, acks: list[list[Any]] | None = None) -> None:
        """Phases 3-5 of a batch: settle the levels, publish, commit on every serving worker.

        A serving worker found dead when its pushes or its commit are awaited is replaced at
        this batch (the sampling workers' pushed state is this batch's by then)."""
        wait(acks or [])
        self._settle()
        pushes = chain.from_iterable(ray.get([w.publish.remote(version) for w in self._samplers]))
        dead = {w for w, ref in pushes if not alive(ref)}
        self._commit(version, num_nodes, dead)

    def _settle(self) -> None:
        """Settle every level of subscription counts, in order (``subscriptions``)."""
        for level in range(len(self.fanouts)):
            wait(ray.get([w.settle.remote(level) for w in self._samplers]))

    def _commit(self, version: int, num_nodes: int, dead: set[int]) -> None:
        """Commit ``version`` on every serving worker; replace those that died."""
        with self._lock:
            for j, server in enumerate(self._servers):
                if j not in dead and not alive(server.commit.remote(version, num_nodes)):
                    dead.add(j)
            self._grow(num_nodes)
            self.version = version
            self._replace(sorted(dead))

    def _grow(self, num_nodes: int) -> None:
        """The graph has ``num_nodes`` vertices; the new ones are query vertices."""
        extra = num_nodes - self.num_nodes
        if extra > 0:
            self.is_query = np.concatenate([self.is_query, np.ones(extra, dtype=bool)])
            self.num_nodes = num_nodes

    # requests --------------------------------------------------------------------------------
    def sample(self, seeds: np.ndarray) -> SampledSubgraph:
        """k-hop sample of ``seeds`` (duplicates allowed) from the serving workers' caches.

        Equal to ``PreSampler.sample(seeds)`` for the same seed and event sequence.
        """
        return self.sample_at(seeds)[1]

    def sample_at(self, seeds: np.ndarray) -> tuple[int, SampledSubgraph]:
        """(batch the sample reflects, ``sample(seeds)``)."""
        with self._lock:
            seeds = check_seeds(seeds, self.is_query)
            groups = [g for g in split(self.serving.owner(seeds), self.serving.parts) if g.size]
            owners = self.serving.owner(seeds[[g[0] for g in groups]]).tolist()
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
        versions = {v for v, _ in parts}
        if len(versions) != 1:
            raise RuntimeError("serving workers answered from different batches")
        subgraphs = [to_subgraph(writable(arrays), self.hop_query.size) for _, arrays in parts]
        if len(subgraphs) == 1:
            return versions.pop(), subgraphs[0]
        return versions.pop(), merge_samples(seeds, subgraphs, self.hop_query, self._fans)

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
        """Stop the workers (and Ray if this service started it); remove the deployment's
        directory (checkpoints, its own log)."""
        self.checkpoints.close()
        for actor in [*self._samplers, *self._servers, self._feed]:
            ray.kill(actor)
        self._samplers, self._servers = [], []
        stop_ray(self._owns_ray)
        self._owns_ray = False
        if self._own_log is not None:
            self._own_log.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> DGSService:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
