"""A fog cluster on Ray: one :class:`~.node.FogNode` actor per fog node, one gloo group, BSP
rounds of full-graph inference over a placement (Fograph §III-E).

The driver (the metadata server's role) holds the graph topology and the placement; it builds
every fog's partition, starts the actors, and per round asks all of them to run and assembles
their outputs into one [N, C] array in vertex order. :meth:`FogCluster.apply` installs a new
placement (diffusion or re-plan) between rounds: rounds and re-placements are serialised by one
lock, so a round never sees half a placement.
"""

from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np
import ray

from gnnserve.deploy.fog.hosts import placement_options
from gnnserve.deploy.fog.links import FABRIC_IFNAME, FogFabric
from gnnserve.deploy.fog.node import FabricSeat, FogNode, NodeRound
from gnnserve.deploy.fog.partition import build_fog_partitions, check_membership, local_rows
from gnnserve.deploy.ray import start_ray, stop_ray
from gnnserve.errors import InvalidInputError
from gnnserve.graph.base import GraphStore
from gnnserve.models.zoo import GNN

_NodeActor = ray.remote(num_cpus=0)(FogNode)


@dataclass
class ClusterRound:
    """One BSP round: every vertex's output and each fog's report."""

    logits: np.ndarray  # float32 [N, C] in vertex order
    nodes: list[NodeRound]  # by fog rank
    plan_version: int  # placement version the round ran on
    embedding: np.ndarray | None = None  # float32 [N, H]: every vertex's last-layer input


def _seat(fabric: FogFabric | None, fog: int) -> FabricSeat | None:
    if fabric is None:
        return None
    return FabricSeat(fabric.namespaces[fog], FABRIC_IFNAME, fabric.sender_delay_ms(fog))


class FogCluster:
    """``len(set(membership))`` fog actors serving ``model`` on ``graph``.

    ``features``: float32 [N, F], the vertices' first readings (each fog keeps its own rows;
    :meth:`collect` updates them). ``actor_options``: per-fog Ray options (e.g. a
    ``runtime_env``); ``fabric``: the fog <-> fog network the boundary exchange crosses (None:
    loopback). Uses the running Ray instance or starts a local one. Close with
    :meth:`close` or use as a context manager.
    """

    def __init__(
        self,
        model: GNN,
        graph: GraphStore,
        features: np.ndarray,
        membership: np.ndarray,
        world: int,
        *,
        threads_per_node: int = 1,
        timeout_s: float = 120.0,
        actor_options: list[dict[str, Any]] | None = None,
        fabric: FogFabric | None = None,
        hosts: list[str | None] | None = None,
    ) -> None:
        self.model, self.world = model.eval(), int(world)
        self.indptr, self.indices = graph.csr()
        self.num_nodes = graph.num_nodes
        self.gcn_degree = np.asarray(graph.gcn_degree(np.arange(self.num_nodes)), np.float32)
        self.features = np.asarray(features, np.float32)
        if self.features.shape != (self.num_nodes, model.config.in_dim):
            raise InvalidInputError(
                f"features must be [{self.num_nodes}, {model.config.in_dim}]", "features"
            )
        self.membership = check_membership(membership, self.num_nodes, self.world)
        self._local = local_rows(self.membership, self.world)
        self.version = 0
        self._lock = threading.Lock()
        self._owns_ray = start_ray(max(2, self.world))
        parts = self._partitions(self.membership)
        pinned = placement_options(hosts or [None] * self.world)
        given = actor_options or [{} for _ in parts]
        self._nodes: list[Any] = [
            _NodeActor.options(**pin, **opt).remote(
                p, self.model, self.features[p.owned], threads_per_node
            )
            for p, pin, opt in zip(parts, pinned, given, strict=True)
        ]
        try:
            address, port = ray.get(self._nodes[0].rendezvous.remote(timeout_s))
            seats = [_seat(fabric, j) for j in range(self.world)]
            ray.get(
                [
                    n.connect.remote(address, port, timeout_s, s)
                    for n, s in zip(self._nodes, seats, strict=True)
                ]
            )
        except BaseException:
            self.close()
            raise

    def _partitions(self, membership: np.ndarray) -> list[Any]:
        return build_fog_partitions(
            self.indptr, self.indices, membership, self.world, self.gcn_degree
        )

    def addresses(self) -> list[str]:
        """The address of the machine each fog runs on (its Ray node's)."""
        return ray.get([n.address.remote() for n in self._nodes])

    def listen(self, hosts: list[str], strict: bool = True) -> list[int]:
        """Every fog receives uploads on its address ``hosts[j]``; returns the ports.
        ``strict``: a refused upload fails the round (see :class:`FogNode.listen`)."""
        return ray.get(
            [n.listen.remote(h, strict) for n, h in zip(self._nodes, hosts, strict=True)]
        )

    def expect_uploads(self, groups: list[dict[int, tuple[int, int]]]) -> None:
        """Fog ``j`` takes device groups ``groups[j]`` (group -> (first row, rows))."""
        ray.get([n.expect_uploads.remote(g) for n, g in zip(self._nodes, groups, strict=True)])

    def time_subgraph(
        self, part: Any, features: np.ndarray, repeats: int = 1, together: bool = False
    ) -> list[float]:
        """ms of the model on calibration subgraph ``part`` on every fog: one fog at a time (so
        each is timed alone, under its own CPU quota), or all at once with ``together`` (where
        that changes no fog's time: ``profiler.time_together``)."""
        with self._lock:
            if together:
                calls = [n.time_subgraph.remote(part, features, repeats) for n in self._nodes]
                return [float(ms) for ms in ray.get(calls)]
            return [
                float(ray.get(n.time_subgraph.remote(part, features, repeats))) for n in self._nodes
            ]

    def pids(self) -> list[int]:
        """Process id of every fog node (for CPU quotas)."""
        return ray.get([n.pid.remote() for n in self._nodes])

    def arrived(self, round_id: int, wait_s: float) -> bool:
        """Whether every fog holds all uploads of round ``round_id`` (each waits up to
        ``wait_s``): a round that has arrived everywhere runs without waiting in a collective."""
        return all(ray.get([n.arrived.remote(round_id, wait_s) for n in self._nodes]))

    def run(self, round_id: int | None = None, wait_s: float = 120.0) -> ClusterRound:
        """One BSP round on the current placement: with ``round_id``, each fog first waits for
        that round's uploads; without, it runs on the features it holds."""
        with self._lock:
            reports: list[NodeRound] = ray.get(
                [n.run.remote(round_id, wait_s) for n in self._nodes]
            )
            logits = np.empty((self.num_nodes, reports[0].logits.shape[1]), np.float32)
            embedding = np.empty((self.num_nodes, reports[0].embedding.shape[1]), np.float32)
            for r in reports:
                mine = self.membership == r.rank
                logits[mine], embedding[mine] = r.logits, r.embedding
            return ClusterRound(logits, reports, self.version, embedding)

    def collect(self, vertices: np.ndarray, values: np.ndarray) -> None:
        """New readings of ``vertices`` (int64 ids) -> their fogs, before the next round."""
        vertices = np.asarray(vertices, np.int64)
        with self._lock:
            self.features[vertices] = values
            owner, local = self.membership[vertices], self._local[vertices]
            ray.get(
                [
                    n.collect.remote(local[owner == j], self.features[vertices[owner == j]])
                    for j, n in enumerate(self._nodes)
                ]
            )

    def apply(self, membership: np.ndarray, model: GNN | None = None) -> int:
        """Install a new placement (and optionally a new model) between rounds; returns the new
        plan version. Each fog receives its new partition and its vertices' latest features."""
        member = check_membership(membership, self.num_nodes, self.world)
        parts = self._partitions(member)
        with self._lock:
            ray.get(
                [
                    n.load.remote(p, model, self.features[p.owned])
                    for p, n in zip(parts, self._nodes, strict=True)
                ]
            )
            self.membership, self._local = member, local_rows(member, self.world)
            if model is not None:
                self.model = model.eval()
            self.version += 1
            return self.version

    def close(self) -> None:
        """Stop the actors (and a Ray instance started here)."""
        for node in getattr(self, "_nodes", []):
            with contextlib.suppress(Exception):  # a dead actor has nothing to close
                ray.get(node.close.remote(), timeout=30)
            ray.kill(node)
        self._nodes = []
        stop_ray(getattr(self, "_owns_ray", False))

    def __enter__(self) -> FogCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
