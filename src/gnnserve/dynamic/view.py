"""The read side of a changing graph and its features: one version per read, no waiting.

Readers of any GraphStore bracket what must see one graph version with ``acquire_read`` (which
returns that version) and ``release_read``; on a static store both are no-ops. A changing graph
is served through ``VersionedGraph`` and ``VersionedFeatures``: ``acquire_read`` pins the copy of
the store that is current (``dynamic.leftright``: readers never wait for a batch being applied)
and attaches it to the calling thread, so every read that thread makes (the kernels'
``adjacency()``, ``gcn_degree``, feature rows) comes from the version it pinned. The engine samples
in one thread and reads features in another: ``detach_read`` hands the pin over and
``attach_read`` takes it; ``release_read`` may then come from the receiving thread.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from gnnserve.dynamic.features import DynamicFeatures
from gnnserve.dynamic.graph import DynamicGraph
from gnnserve.dynamic.leftright import LeftRight, ReadPin
from gnnserve.features.base import FeatureStore
from gnnserve.graph.base import GraphStore
from gnnserve.graph.events import ReplicatedListener


@dataclass
class GraphReplica:
    """One copy of a changing store: its graph, features and the copies of the replicated
    listeners (``graph.events.ReplicatedListener``), always at the same version."""

    graph: DynamicGraph
    features: DynamicFeatures
    listeners: list[ReplicatedListener] = field(default_factory=list)

    def clone(self) -> GraphReplica:
        """An independent copy of all three."""
        twins = [listener.clone() for listener in self.listeners]
        return GraphReplica(self.graph.clone(), self.features.clone(), twins)


class VersionedGraph(GraphStore):
    """A changing graph as readers see it: each read goes to the thread's pinned version."""

    mutable = True

    def __init__(self, replicas: LeftRight[GraphReplica]) -> None:
        super().__init__(replicas.active.graph.meta)
        self._replicas = replicas

    def _graph(self) -> DynamicGraph:
        return self._replicas.reading().graph

    @property
    def num_nodes(self) -> int:
        return self._graph().num_nodes

    @property
    def num_edges(self) -> int:
        return self._graph().num_edges

    @property
    def version(self) -> str:
        """``<base checksum>.<batches applied>`` of the pinned (or else the current) version."""
        return self._graph().version

    def _adjacency(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return self._graph()._adjacency()

    def gcn_degree(self, ids: np.ndarray) -> np.ndarray:
        return self._graph().gcn_degree(ids)

    def acquire_read(self) -> str:
        """Pin the current version (never waits for a writer) for this thread; returns it."""
        return self._replicas.enter().graph.version

    def release_read(self) -> None:
        """End the read attached last to this thread."""
        self._replicas.leave()

    def detach_read(self) -> ReadPin:
        """Take this thread's last pin off it, still held, for ``attach_read`` elsewhere."""
        return self._replicas.detach()

    def attach_read(self, pin: object) -> None:
        """Read the version of ``pin`` (from ``detach_read``) in this thread."""
        assert isinstance(pin, ReadPin)
        self._replicas.attach(pin)


class VersionedFeatures(FeatureStore):
    """The features of a changing store, read at the version the thread pinned."""

    def __init__(self, replicas: LeftRight[GraphReplica]) -> None:
        self._replicas = replicas

    def _features(self) -> DynamicFeatures:
        return self._replicas.reading().features

    @property
    def num_nodes(self) -> int:
        return self._features().num_nodes

    @property
    def dim(self) -> int:
        return self._features().dim

    def _read(self, ids: np.ndarray) -> torch.Tensor:
        return self._features()._read(ids)
