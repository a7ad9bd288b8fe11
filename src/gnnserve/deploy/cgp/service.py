"""CGPService: SRPE new-node inference with computation graph parallelism on a local Ray cluster.

The master (this object) hash-partitions the stored graph, features and PEs over P workers once
(:mod:`~gnnserve.deploy.cgp.partition`), starts one :class:`~.worker.CGPWorker` actor per
partition and has them join a gloo process group. Per request it only validates and splits the
request (query features to the query's owner, edges to their source's owner) and collects each
worker's query rows; the computation graph is built and executed by the workers, which exchange
candidate statistics and per-layer partial aggregations among themselves (OMEGA §6.1).

The answer is the one ``NewNodeInference.run(new, "srpe", gamma, policy, seed=seed)`` gives,
up to float summation order. The ``oracle`` policy is refused: it needs exact embeddings of
every candidate, which CGP never builds.
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import TYPE_CHECKING, Any

import numpy as np
import ray
import torch

from gnnserve.deploy.cgp.partition import build_partitions, split_request
from gnnserve.deploy.cgp.worker import CGPWorker, RunSpec, WorkerOutput
from gnnserve.deploy.ray import start_ray, stop_ray
from gnnserve.embeddings.base import EmbeddingStore, check_importance, check_serving_stores
from gnnserve.errors import InvalidInputError
from gnnserve.features.base import FeatureStore
from gnnserve.graph.base import GraphStore
from gnnserve.newnodes.parse import check_new_nodes
from gnnserve.newnodes.policies import DEFAULT_POLICY, importance_scores
from gnnserve.newnodes.result import (
    NewNodeResult,
    NewNodeTimings,
    RunOptions,
    Traffic,
    check_run_options,
)
from gnnserve.types import NewNodes

if TYPE_CHECKING:  # the workers import this module: keep torch_geometric out of them
    from gnnserve.models.zoo import GNN

__all__ = ["CGPService"]

_WorkerActor = ray.remote(num_cpus=0)(CGPWorker)
_DENSE = "feature rows if dense"  # a plain_by entry for comparison only


def _count(value: object, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
        raise InvalidInputError(f"{field} must be an int >= 1, got {value!r}", field)
    return int(value)


def _sum_counts(counts: list[dict[str, int]]) -> dict[str, int]:
    """Per key, the sum over every worker's counts (keys in first-seen order)."""
    out: dict[str, int] = {}
    for one in counts:
        for key, value in one.items():
            out[key] = out.get(key, 0) + value
    return out


class CGPService:
    """P workers answering new-node requests with SRPE + computation graph parallelism.

    ``embeddings`` must hold layers 1..k-1 of ``model`` on ``graph``; ``importance`` (float64
    [N]) defaults to :func:`importance_scores` of the graph. Uses the running Ray instance or
    starts a local one (``num_cpus`` logical CPUs; the workers reserve none). Each worker runs
    ``threads_per_worker`` torch threads; collectives time out after ``timeout_s`` seconds.
    Requests are served one at a time (they share the process group). Close with ``close()``
    or use as a context manager.
    """

    def __init__(
        self,
        model: GNN,
        graph: GraphStore,
        features: FeatureStore,
        embeddings: EmbeddingStore,
        num_workers: int = 2,
        *,
        importance: np.ndarray | None = None,
        threads_per_worker: int = 1,
        num_cpus: int | None = None,
        timeout_s: float = 120.0,
    ) -> None:
        self.num_workers = _count(num_workers, "num_workers")
        threads = _count(threads_per_worker, "threads_per_worker")
        self.model = model.eval()
        check_serving_stores(model.config, graph.num_nodes, features, embeddings)
        layers = model.cgp_layers()  # plain tensors: the workers never import torch_geometric
        self.num_nodes, self.num_layers = graph.num_nodes, model.config.num_layers
        if importance is None:
            importance = importance_scores(graph.in_degree(), *graph.csr())
        importance = check_importance(importance, self.num_nodes)
        parts = build_partitions(
            graph, features, embeddings, self.num_workers, self.num_layers, importance
        )
        self._lock = threading.Lock()
        self._owns_ray = start_ray(num_cpus or self.num_workers)
        self._workers: list[Any] = [_WorkerActor.remote(p, layers, threads) for p in parts]
        try:
            address, port = ray.get(self._workers[0].rendezvous.remote(timeout_s))
            ray.get([w.connect.remote(address, port, timeout_s) for w in self._workers])
        except BaseException:
            self.close()
            raise

    def run(
        self, new: NewNodes, gamma: float, policy: str = DEFAULT_POLICY, seed: int = 0
    ) -> NewNodeResult:
        """Logits and embeddings of the new nodes of ``new`` (SRPE with budget ``gamma``), with
        the workers' traffic (``result.traffic``).

        Checks ``new`` and the options (InvalidInputError naming the field), then :meth:`infer`.
        """
        new = check_new_nodes(new, self.num_nodes, self.model.config.in_dim)
        return self.infer(new, check_run_options(gamma, policy, None, seed, self.num_layers))

    def infer(self, new: NewNodes, options: RunOptions) -> NewNodeResult:
        """:meth:`run` for input already validated (at admission, ``engine.requests``). The
        ``oracle`` policy is refused (400 naming ``policy``)."""
        start = time.perf_counter()
        if options.policy == "oracle":
            raise InvalidInputError(
                "oracle policy is not supported by CGP: it needs the exact embeddings of every "
                "candidate, which CGP never builds",
                "policy",
            )
        if not self._workers:
            raise RuntimeError("CGPService is closed (by the caller, or after a worker failed)")
        spec = RunSpec(options.gamma, options.policy, options.seed)
        parts = split_request(new, self.num_nodes, self.num_workers)
        with self._lock:
            refs = [w.run.remote(p, spec) for w, p in zip(self._workers, parts, strict=True)]
            outs = self._gather(refs)
        return self._assemble(new.count, outs, sum(p.nbytes() for p in parts), start)

    def _gather(self, refs: list[Any]) -> list[WorkerOutput]:
        """Every worker's output; on the first failure the service is closed (the others may be
        blocked in a collective, the group is out of step) and the error re-raised."""
        pending = list(refs)
        try:
            while pending:
                ready, pending = ray.wait(pending, num_returns=1)
                ray.get(ready)
        except BaseException:
            self.close()
            raise
        return ray.get(refs)  # type: ignore[no-any-return]

    def _assemble(
        self, m: int, outs: list[WorkerOutput], request_bytes: int, start: float
    ) -> NewNodeResult:
        logits = torch.empty(m, outs[0].logits.size(1))
        embedding = torch.empty(m, outs[0].embedding.size(1))
        for out in outs:
            rows = torch.as_tensor(np.array(out.queries))  # Ray hands back read-only arrays
            logits[rows] = out.logits
            embedding[rows] = out.embedding
        plain_by = _sum_counts([o.plain_by for o in outs])
        worker_ms = [o.compute_ms for o in outs]
        traffic = Traffic(
            bytes_sent=sum(o.bytes_sent for o in outs),
            bytes_by=_sum_counts([o.bytes_by for o in outs]),
            plain_bytes=sum(v for k, v in plain_by.items() if k != _DENSE),
            plain_by=plain_by,
            request_bytes=request_bytes,
            worker_ms=worker_ms,
        )
        timings = NewNodeTimings(
            compute_ms=max(worker_ms), total_ms=(time.perf_counter() - start) * 1e3
        )
        return NewNodeResult(
            logits,
            embedding,
            np.asarray(outs[0].recomputed, dtype=np.int64),
            outs[0].num_candidates,
            "srpe",
            timings,
            traffic=traffic,
        )

    def close(self) -> None:
        """Leave the process group, stop the workers, and Ray if this service started it."""
        workers, self._workers = self._workers, []
        if workers:
            # a dead or hung worker is killed below anyway
            with contextlib.suppress(Exception):
                ray.get([w.close.remote() for w in workers], timeout=30)
            for actor in workers:
                ray.kill(actor)
        owned, self._owns_ray = self._owns_ray, False
        stop_ray(owned)

    def __enter__(self) -> CGPService:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
