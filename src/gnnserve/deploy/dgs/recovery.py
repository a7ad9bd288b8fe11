"""Checkpoints of DGS sampling workers, from which one that died is rebuilt.

A checkpoint is a worker's reservoirs, adjacency and log position (``SamplingWorker.checkpoint``),
taken between batches every ``every`` batches and at start. It is fetched by the coordinator
and written to the deployment's own directory on the coordinator's node (a replacement may start
on any node of the cluster), one file per worker, replaced atomically. Writing runs in a
background thread: the batch that triggers a checkpoint does not wait for it. A worker rebuilt
from its checkpoint replays the log from the checkpoint's position (``SamplingWorker.consume``).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from itertools import chain
from pathlib import Path
from typing import Any

import ray
from ray.exceptions import RayActorError

from gnnserve.deploy.dgs.serving_worker import ServingWorker
from gnnserve.errors import WorkerFailedError

log = logging.getLogger(__name__)
ServingActor = ray.remote(num_cpus=0)(ServingWorker)


class Checkpoints:
    """Checkpoint files ``sampling-<i>.ckpt`` of the workers under ``directory``."""

    def __init__(self, directory: Path, every: int) -> None:
        if every < 1:
            raise ValueError("checkpoints are taken every >= 1 batches")
        self.dir, self.every = directory, every
        self.seq = -1  # batch of the last checkpoint begun
        self.written = 0  # checkpoint files written
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="dgs-checkpoint")
        self._pending: list[Future[None]] = []

    def path(self, i: int) -> Path:
        """Checkpoint file of sampling worker ``i``."""
        return self.dir / f"sampling-{i}.ckpt"

    def take(self, workers: list[Any], seq: int, force: bool = False, wait: bool = False) -> None:
        """Checkpoint every worker (all at batch ``seq``) if ``every`` batches passed since the
        last one, or ``force``; ``wait``: return once written."""
        if not force and seq - self.seq < self.every:
            return
        self.seq = seq
        refs = [w.checkpoint.remote() for w in workers]  # queued before the next batch's calls
        self._pending = [f for f in self._pending if not f.done()]
        self._pending.append(self._pool.submit(self._write, refs, seq))
        if wait:
            self.flush()

    def _write(self, refs: list[Any], seq: int) -> None:
        for i, ref in enumerate(refs):
            try:
                data = ray.get(ref)
            except RayActorError:
                log.warning("DGS: sampling worker %d died before its checkpoint at %d", i, seq)
                continue
            tmp = self.path(i).with_suffix(".tmp")
            tmp.write_bytes(data)
            os.replace(tmp, self.path(i))
            self.written += 1

    def flush(self) -> None:
        """Wait for the checkpoints being written (a failure is raised here)."""
        pending, self._pending = self._pending, []
        for future in pending:
            future.result()

    def load(self, i: int) -> bytes:
        """The last checkpoint of worker ``i`` (once those being written are done)."""
        self.flush()
        return self.path(i).read_bytes()

    def close(self) -> None:
        """Stop writing (the caller removes the directory)."""
        self._pool.shutdown(wait=True, cancel_futures=True)


class Recovery:
    """The failure handling of ``DGSService`` (its module doc, "Failures"): a mixin that reads
    the service's workers, locks and batch counters."""

    _samplers: list[Any]
    _servers: list[Any]
    _lock: threading.Lock
    _write_lock: threading.Lock
    _seed: int
    checkpoints: Checkpoints
    num_nodes: int
    fanouts: list[int]
    version: int
    epoch: int
    replaced: int
    rebuilt: int

    def _sampler(self, i: int, seed: int, csr: Any = None, ckpt: bytes | None = None) -> Any:
        raise NotImplementedError

    def _actor(self, cls: Any) -> Any:
        raise NotImplementedError

    def _settle(self) -> None:
        raise NotImplementedError

    def _commit(self, version: int, num_nodes: int, dead: set[int]) -> None:
        raise NotImplementedError

    def recover(self) -> list[int]:
        """Replace every serving worker that died (see the module doc); returns their indices."""
        with self._write_lock, self._lock:
            dead = [j for j, s in enumerate(self._servers) if not alive(s.ping.remote())]
            self._replace(dead)
        return dead

    def _replace(self, dead: list[int]) -> None:
        """New serving workers ``dead`` at ``self.version``, their caches rebuilt from the
        sampling workers. The caller holds both locks (no batch, no request in between)."""
        if not dead:
            return
        start = time.perf_counter()
        for j in dead:
            self._servers[j] = self._server(j)
        wait([w.connect.remote(self._samplers, self._servers) for w in self._samplers])
        wait(ray.get([w.resync.remote(j) for w in self._samplers for j in dead]))
        self.replaced += len(dead)
        log.warning(
            "DGS: serving worker(s) %s died and were replaced at batch %d in %.1f s",
            dead,
            self.version,
            time.perf_counter() - start,
        )

    def _server(self, j: int) -> Any:
        """A new serving worker j at the committed batch, with an empty cache."""
        return self._actor(ServingActor).remote(j, self.num_nodes, self.fanouts, self.version)

    def _rebuild(self, seq: int, num_nodes: int, tries: int = 3) -> None:
        """Rebuild the workers that died and bring every worker to batch ``seq``."""
        for attempt in range(tries):
            try:
                self._rebuild_once(seq, num_nodes)
                return
            except RayActorError as exc:
                log.warning("DGS: a worker died while rebuilding (try %d): %s", attempt + 1, exc)
        raise WorkerFailedError(f"DGS workers died {tries} times while recovering batch {seq}")

    def _rebuild_once(self, seq: int, num_nodes: int) -> None:
        """Sampling workers that died restart from their checkpoints and replay the log to
        ``seq`` (the others consume to it too); all counts are recounted in a new epoch, and
        every serving worker's cache is replaced by full copies at ``seq``."""
        start = time.perf_counter()
        dead = [i for i, w in enumerate(self._samplers) if not alive(w.pid.remote())]
        gone = {j for j, s in enumerate(self._servers) if not alive(s.ping.remote())}
        for i in dead:
            self._samplers[i] = self._sampler(i, self._seed, ckpt=self.checkpoints.load(i))
        for j in gone:
            self._servers[j] = self._server(j)
        self.epoch += 1
        wait([w.connect.remote(self._samplers, self._servers) for w in self._samplers])
        wait([s.reset.remote(self.epoch) for s in self._servers])
        wait([w.consume.remote(seq, replay=True) for w in self._samplers])
        wait([w.recount.remote(self.epoch) for w in self._samplers])
        self._settle()
        wait(ray.get([w.republish.remote(seq) for w in self._samplers]))
        self._commit(seq, num_nodes, set())
        self.rebuilt += len(dead)
        self.replaced += len(gone)
        log.warning(
            "DGS: sampling worker(s) %s rebuilt from their checkpoints at batch %d in %.1f s",
            dead,
            seq,
            time.perf_counter() - start,
        )


def alive(ref: Any) -> bool:
    """Wait for one actor call: False when its actor died (RayActorError), else True."""
    try:
        ray.get(ref)
    except RayActorError:
        return False
    return True


def wait(refs: list[Any]) -> None:
    """Wait for ObjectRefs, given flat or as lists of lists (acks returned by workers)."""
    flat = list(chain.from_iterable(r if isinstance(r, list) else [r] for r in refs))
    ray.get(flat)
