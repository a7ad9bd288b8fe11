"""Executor: how the work admission let in is run, behind one interface.

The engine admits requests and forms batches (admission -> batcher); an :class:`Executor` runs
them and resolves each request's future. One executor serves an engine, chosen by name from
:data:`EXECUTORS` with ``ServeConfig.deploy.mode``:

- ``local`` (:class:`gnnserve.engine.local.LocalExecutor`): sample, gather and compute in
  this process, in overlapping stage threads;
- ``dgs`` (``gnnserve.deploy.dgs.executor``): batches sample from DGS serving workers;
- ``cgp`` (``gnnserve.deploy.cgp.executor``): new-node SRPE requests run on CGP workers;
- ``faas`` (``gnnserve.deploy.faas.executor``): serverless function instances (FaaS-GNN).

Deployment packages sit above the engine: the registry names them by import path and imports
them on first use, so the engine never imports a deployment. A new deployment mode is a
package with an Executor subclass plus one :func:`register_lazy` line here.

Contract. ``start(batches)`` begins pulling batches from ``batches.next_batch()`` (None: stop)
and must call ``batches.finished(batch)`` once per batch when its work is done or failed (the
admission's service-time model learns from it); every request of a batch is answered (result
or error) exactly once. ``stop(timeout_s)`` returns after every batch pulled was answered.
``run_new_nodes`` answers one admitted new-node request (the new-node service calls it on its
worker thread, under the graph's read lock).
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar, Protocol

from gnnserve.errors import InvalidInputError
from gnnserve.registry import Registry

if TYPE_CHECKING:
    from gnnserve.config import ServeConfig
    from gnnserve.dynamic.store import DynamicStore
    from gnnserve.embeddings.base import EmbeddingStore
    from gnnserve.engine.batcher import Batch
    from gnnserve.engine.planner import Planner
    from gnnserve.features.base import FeatureStore
    from gnnserve.graph.base import GraphStore
    from gnnserve.models.runner import ModelRunner
    from gnnserve.newnodes.inference import NewNodeInference
    from gnnserve.newnodes.result import NewNodeResult, RunOptions
    from gnnserve.types import NewNodes

__all__ = [
    "EXECUTORS",
    "BatchSource",
    "ExecutionContext",
    "Executor",
    "check_deploy",
    "register_lazy",
]


class BatchSource(Protocol):
    """Where an executor pulls batches from (the engine's batcher)."""

    def next_batch(self) -> Batch | None:
        """The next batch, blocking until one forms; None once the engine stops."""

    def finished(self, batch: Batch) -> None:
        """``batch`` left the executor (answered or failed): trains the service-time model."""


@dataclass
class ExecutionContext:
    """What the engine hands its executor: the served stores and model, and how to sample."""

    graph: GraphStore  # read side (acquire_read / release_read pin a version)
    features: FeatureStore
    runner: ModelRunner  # the served model, its version and output shaping
    planner: Planner  # fanouts -> sampler (pre-sampler or on-demand)
    config: ServeConfig
    updates: DynamicStore | None = None  # the changing graph, when it has an update log
    embeddings: EmbeddingStore | None = None  # PEs for new-node requests, when loaded
    observers: list[Callable[[Batch], None]] = field(default_factory=list)  # after each batch


class Executor(ABC):
    """Runs admitted batches of existing-node requests, and new-node requests."""

    name: ClassVar[str]  # the EXECUTORS name, also ServeConfig.deploy.mode
    # logged at start-up when neither this process nor the executor had anything to warm up
    cold_start_note: ClassVar[str] = "requests run elsewhere"

    def __init__(self, context: ExecutionContext) -> None:
        self.context = context

    @abstractmethod
    def start(self, batches: BatchSource) -> None:
        """Start running batches pulled from ``batches`` (workers, threads)."""

    @abstractmethod
    def stop(self, timeout_s: float = 30.0) -> None:
        """Answer every batch already pulled, then release threads and workers."""

    @classmethod  # noqa: B027 - an optional hook, not abstract
    def check_config(cls, config: ServeConfig) -> None:
        """Refuse (InvalidInputError naming the field) a configuration this executor cannot
        serve, before anything is loaded; default: every configuration."""

    @classmethod  # noqa: B027 - an optional hook, not abstract
    def start_early(cls, config: ServeConfig) -> None:
        """Begin, in the background, what takes long and needs no store (e.g. Ray's start),
        after ``check_config`` passed and before the store loads; default nothing."""

    def warm_up(self) -> dict[str, float]:
        """Run what this executor adds to the local path once (ms per step); default none."""
        return {}

    def run_new_nodes(
        self, local: NewNodeInference, new: NewNodes, mode: str, options: RunOptions
    ) -> NewNodeResult:
        """Answer one new-node request, validated at admission (``mode`` and ``options``
        resolved: no check is repeated); default: ``local`` (the single-process inference)."""
        return local.infer(new, mode, options)

    def describe(self) -> dict[str, object]:
        """What runs where, for logs and health answers."""
        return {"deploy": self.name}


EXECUTORS: Registry[Executor] = Registry("deploy.mode")


_LAZY: dict[str, tuple[str, str]] = {}  # name -> (module, class) of register_lazy


def register_lazy(name: str, module: str, cls: str) -> None:
    """Register executor ``name`` as class ``cls`` of ``module``, imported on first use (the
    deployment packages sit above the engine and pull in Ray)."""

    def create(context: ExecutionContext) -> Executor:
        executor_cls = getattr(importlib.import_module(module), cls)
        return executor_cls(context)  # type: ignore[no-any-return]

    EXECUTORS.register(name)(create)
    _LAZY[name] = (module, cls)


def check_deploy(config: ServeConfig) -> None:
    """Refuse an unknown ``deploy.mode``, or a configuration its executor cannot serve
    (``Executor.check_config``), before the store and model are loaded; then let the executor
    begin its slow start-up steps in the background (``Executor.start_early``)."""
    from gnnserve.engine.device_path import check_device

    check_device(config)
    mode = config.deploy.mode
    if mode not in EXECUTORS.names():
        raise InvalidInputError(
            f"unknown deploy mode {mode!r}; choose one of {EXECUTORS.names()}", "deploy.mode"
        )
    if mode in _LAZY:
        module, cls = _LAZY[mode]
        executor_cls = getattr(importlib.import_module(module), cls)
        executor_cls.check_config(config)
        executor_cls.start_early(config)


register_lazy("local", "gnnserve.engine.local", "LocalExecutor")
register_lazy("dgs", "gnnserve.deploy.dgs.executor", "DGSExecutor")
register_lazy("cgp", "gnnserve.deploy.cgp.executor", "CGPExecutor")
register_lazy("faas", "gnnserve.deploy.faas.executor", "FaaSExecutor")
register_lazy("fog", "gnnserve.deploy.fog.executor", "FogExecutor")
