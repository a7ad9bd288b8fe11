"""Consistent (graph version, PE version) pairs for new-node requests while the graph changes
(issue 29, part 3).

With a :class:`~gnnserve.embeddings.refresher.PeRefresher` behind the server, a new-node request
pins the graph's current version ``v`` (``seq`` batches) and reads the newest published PE
version ``p``. ``lag = seq(v) - seq(p)`` batches; with ``staleness`` N the request is answered
when ``lag <= N`` and the PEs hold every node of ``v`` (nodes added after ``p`` have no PE yet);
otherwise it waits (unpinned, so writers and the refresher go on) for the refresher to publish
``seq(v) - N``, up to its deadline, then answers 503 naming the lag. The answer reports both
versions and the lag. ``staleness`` 0 (the default) answers exactly as a full precompute at
``v`` would.

The inference (:class:`NewNodeInference`) copies the graph's adjacency when built, so one is
built per (graph version, PE version) pair, under the request's pin, and reused until either
changes.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from gnnserve.dynamic.graph import version_seq
from gnnserve.embeddings.base import EmbeddingStore
from gnnserve.embeddings.refresher import PeRefresher, Published
from gnnserve.errors import UnavailableError
from gnnserve.newnodes.inference import NewNodeInference

Build = Callable[[EmbeddingStore], NewNodeInference]


@dataclass(frozen=True)
class Pinned:
    """A request's pair: the graph version it reads (pinned) and the PE version it uses."""

    graph_version: str
    published: Published
    lag: int  # batches the PEs are behind the graph


class ReadLock(Protocol):
    """Pins the graph's content while a request reads it (the graph itself, or its read view)."""

    def acquire_read(self) -> str:
        """Pin the current version; returns it."""

    def release_read(self) -> None:
        """End a read started with ``acquire_read``."""


class FreshEmbeddings:
    """Pairs each request's pinned graph version with a PE version (module doc)."""

    def __init__(
        self,
        refresher: PeRefresher,
        reads: ReadLock,
        num_nodes: Callable[[], int],
        staleness: int,
    ) -> None:
        if staleness < 0:
            raise ValueError(f"staleness must be >= 0, got {staleness}")
        self.refresher, self.reads, self.staleness = refresher, reads, staleness
        self._num_nodes = num_nodes  # the pinned graph's node count
        self._cached: tuple[str, str, NewNodeInference] | None = None
        self._lock = threading.Lock()

    def pin(self, deadline_s: float | None, default_wait_s: float = 30.0) -> Pinned:
        """Pin the graph (the caller releases it) with PEs within the staleness bound; waits for
        the refresher up to ``deadline_s`` (perf_counter; None: ``default_wait_s``), then
        UnavailableError (503)."""
        end = deadline_s if deadline_s is not None else time.perf_counter() + default_wait_s
        while True:
            version = self.reads.acquire_read()
            published = self.refresher.current()
            seq = version_seq(version)
            lag = seq - published.seq
            complete = published.pes.meta.num_nodes == self._num_nodes()
            if lag <= self.staleness and complete:
                return Pinned(version, published, max(lag, 0))
            self.reads.release_read()
            # nodes without PEs (added since): the version that has them; else the oldest allowed
            need = seq if not complete else seq - self.staleness
            left = end - time.perf_counter()
            if left <= 0 or self.refresher.wait_for(need, left) is None:
                raise UnavailableError(
                    f"the precomputed embeddings are {lag} batches behind the graph "
                    f"(--pe-staleness {self.staleness}) and the refresher did not catch up "
                    "before the request's deadline: retry, or allow staler embeddings",
                    "pe_staleness",
                )

    def inference(self, pinned: Pinned, build: Build) -> NewNodeInference:
        """The inference for ``pinned`` (built by ``build(pes)`` under the caller's pin when
        the pair changed)."""
        key = (pinned.graph_version, pinned.published.graph_version)
        with self._lock:
            if self._cached is None or self._cached[:2] != key:
                self._cached = (*key, build(pinned.published.pes))
            return self._cached[2]
