"""Features placed across P servers (Quiver §5.2, inter-server), each server a Ray actor.

A placement gives every node an owner: ``-1`` replicated on every server (the hottest), else
the server that holds it. Server ``p`` serves its requests from a :class:`PartitionedFeatures`
store: its own rows (replicated and owned) in its memory, the others read from their owners'
:class:`FeatureServer` actors, one call per owner per read, issued together. Quiver reads remote
rows one-sided over InfiniBand; here a read is a Ray object transfer (plasma store on one
machine, TCP across machines) — the bytes counted are the same.

:class:`RoutedFeatures` is a client of the cluster that holds no rows (``serve
--feature-servers``): each read goes to the server holding most of its rows. Counters
(:class:`PlacementStats`) record local and remote rows and bytes, so a benchmark can report the
share of feature bytes read remotely for a placement.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from gnnserve.errors import InvalidInputError
from gnnserve.features.base import FeatureStore, open_feature_store

REPLICATED = -1


@dataclass
class PlacementStats:
    """Rows and bytes a server's reads found locally or fetched from other servers."""

    local_rows: int = 0
    remote_rows: int = 0
    remote_bytes: int = 0
    remote_calls: int = 0  # actor calls (one per owner per read that needed it)

    @property
    def remote_share(self) -> float:
        """Share of rows (= of feature bytes) read from other servers."""
        total = self.local_rows + self.remote_rows
        return self.remote_rows / total if total else 0.0


class FeatureServer:
    """One server's rows: ``rows`` (sorted int64 ids) of the store at ``store_dir``."""

    def __init__(self, store_dir: str, rows: np.ndarray) -> None:
        self.rows = np.sort(np.asarray(rows, dtype=np.int64))
        self.x = open_feature_store(store_dir, "mmap", check_structure=False).get_valid(self.rows)

    def read(self, ids: np.ndarray) -> np.ndarray:
        """float32 [len(ids), F] rows of ``ids`` (ids this server holds)."""
        pos = np.searchsorted(self.rows, ids)
        if pos.size and (pos.max() >= self.rows.size or (self.rows[pos] != ids).any()):
            raise InvalidInputError("ids not held by this feature server", "ids")
        return self.x[torch.from_numpy(pos)].numpy()

    def nbytes(self) -> int:
        """Feature bytes held."""
        return int(self.x.numel() * self.x.element_size())


def check_owner(owner: np.ndarray, num_nodes: int, servers: int) -> np.ndarray:
    """``owner`` as int64 [num_nodes] with values in [-1, servers); InvalidInputError if not."""
    owner = np.asarray(owner)
    if owner.shape != (num_nodes,) or not np.issubdtype(owner.dtype, np.integer):
        raise InvalidInputError(f"owner must be an int array of shape ({num_nodes},)", "owner")
    if owner.size and (owner.min() < REPLICATED or owner.max() >= servers):
        raise InvalidInputError(f"owner values must be in [-1, {servers})", "owner")
    return owner.astype(np.int64)


def held_rows(owner: np.ndarray, server: int) -> np.ndarray:
    """Node ids server ``server`` holds: the replicated ones and its own (sorted)."""
    return np.flatnonzero((owner == REPLICATED) | (owner == server)).astype(np.int64)


class FeatureCluster:
    """P feature-server actors over the store at ``store_dir`` placed by ``owner``; needs Ray
    initialised (see ``gnnserve.deploy.ray.start_ray``)."""

    def __init__(self, store_dir: str | Path, owner: np.ndarray, servers: int) -> None:
        import ray

        if servers < 1:
            raise InvalidInputError(f"servers must be >= 1, got {servers}", "servers")
        self.store_dir = str(store_dir)
        local = open_feature_store(self.store_dir, "mmap", check_structure=False)
        self.num_nodes, self.dim = local.num_nodes, local.dim
        self.owner = check_owner(owner, self.num_nodes, servers)
        actor: Any = ray.remote(num_cpus=0)(FeatureServer)
        self.actors: list[Any] = [
            actor.remote(self.store_dir, held_rows(self.owner, p)) for p in range(servers)
        ]
        ray.get([a.nbytes.remote() for a in self.actors])  # loaded

    def store(self, server: int) -> PartitionedFeatures:
        """The FeatureStore server ``server`` reads through."""
        if not 0 <= server < len(self.actors):
            raise InvalidInputError(f"server must be in [0, {len(self.actors)})", "server")
        return PartitionedFeatures(self, server)

    def shutdown(self) -> None:
        """Stop the actors."""
        import ray

        for a in self.actors:
            ray.kill(a)
        self.actors = []


class _ClusterView(FeatureStore):
    """A feature store reading a :class:`FeatureCluster` (``self.cluster``): its node count and
    width are the cluster's."""

    cluster: FeatureCluster

    @property
    def num_nodes(self) -> int:
        return self.cluster.num_nodes

    @property
    def dim(self) -> int:
        return self.cluster.dim


class PartitionedFeatures(_ClusterView):
    """Server ``server``'s view of a :class:`FeatureCluster`: its rows local, others remote."""

    def __init__(self, cluster: FeatureCluster, server: int) -> None:
        self.cluster = cluster
        self.server = server
        rows = held_rows(cluster.owner, server)
        self._slot = np.full(cluster.num_nodes, -1, dtype=np.int64)  # node -> local row
        self._slot[rows] = np.arange(rows.size)
        store = open_feature_store(cluster.store_dir, "mmap", check_structure=False)
        self._local = store.get_valid(rows)
        self.stats = PlacementStats()
        self._lock = threading.Lock()

    def _read(self, ids: np.ndarray) -> torch.Tensor:
        import ray

        out = torch.empty(ids.size, self.dim)
        slot = self._slot[ids]
        here = slot >= 0
        out[torch.from_numpy(here)] = self._local[torch.from_numpy(slot[here])]
        away = np.flatnonzero(~here)
        owners = self.cluster.owner[ids[away]]
        pending: list[tuple[np.ndarray, Any]] = []
        for p in np.unique(owners):
            at = away[owners == p]
            pending.append((at, self.cluster.actors[int(p)].read.remote(ids[at])))
        for at, rows in zip((a for a, _ in pending), ray.get([r for _, r in pending]), strict=True):
            out.numpy()[at] = rows  # Ray hands back a read-only array: numpy copies it in
        with self._lock:
            self.stats.local_rows += int(here.sum())
            self.stats.remote_rows += int(away.size)
            self.stats.remote_bytes += int(away.size) * self.dim * 4
            self.stats.remote_calls += len(pending)
        return out


class RoutedFeatures(_ClusterView):
    """A client of a :class:`FeatureCluster` holding no rows itself (``serve --feature-servers``).

    Locality-aware routing: a read goes to the server that holds most of its rows (replicated
    rows count for every server, so the owners of the rest decide; ties to the lowest index),
    which returns every row it holds; the rows it lacks come from their owners, in calls issued
    together. ``stats``: rows served by the chosen server (``local_rows``) and by the others
    (``remote_rows``), and the calls made.
    """

    def __init__(self, cluster: FeatureCluster) -> None:
        self.cluster = cluster
        self.servers = len(cluster.actors)
        self.stats = PlacementStats()
        self.routed = np.zeros(self.servers, dtype=np.int64)  # reads sent to each server first
        self._lock = threading.Lock()

    def route(self, ids: np.ndarray) -> int:
        """The server holding most of ``ids``."""
        owners = self.cluster.owner[ids]
        counts = np.bincount(owners[owners >= 0], minlength=self.servers)
        return int(np.argmax(counts))

    def _read(self, ids: np.ndarray) -> torch.Tensor:
        import ray

        out = torch.empty(ids.size, self.dim)
        if ids.size == 0:
            return out
        first = self.route(ids)
        owners = self.cluster.owner[ids].copy()
        owners[owners == REPLICATED] = first  # the chosen server has every replicated row
        calls = [(first, np.flatnonzero(owners == first))]
        calls += [(int(p), np.flatnonzero(owners == p)) for p in np.unique(owners) if p != first]
        refs = [self.cluster.actors[p].read.remote(ids[at]) for p, at in calls]
        for (_, at), rows in zip(calls, ray.get(refs), strict=True):
            out.numpy()[at] = rows  # Ray hands back a read-only array: numpy copies it in
        with self._lock:
            self.routed[first] += 1
            self.stats.local_rows += int(calls[0][1].size)
            self.stats.remote_rows += int(ids.size - calls[0][1].size)
            self.stats.remote_bytes += int(ids.size - calls[0][1].size) * self.dim * 4
            self.stats.remote_calls += len(calls) - 1
        return out

    def close(self) -> None:
        """Stop the cluster's actors."""
        self.cluster.shutdown()
