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
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import ray
from ray.exceptions import RayActorError

log = logging.getLogger(__name__)


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
