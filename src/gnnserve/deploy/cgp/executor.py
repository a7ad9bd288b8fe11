"""CGPExecutor (``deploy.mode: cgp``): new-node SRPE requests run on CGP workers.

Existing-node batches run on the local pipeline (:class:`~gnnserve.engine.local.LocalExecutor`).
A new-node request in mode ``srpe`` is answered by
:class:`~gnnserve.deploy.cgp.service.CGPService`: ``deploy.workers`` Ray actors, each holding one
hash partition of the graph, features and PEs, build and run the SRPE computation graph with
computation graph parallelism (OMEGA §6); the answer is the single-process SRPE one up to float
summation order. Other modes (``full``, ``ns``, ``pe``) run locally. The ``oracle`` policy is
refused by CGP (400).

The partitions are copied at start-up, so CGP serves a static graph: a store served with an
update log is refused. Without precomputed embeddings no worker starts (new-node requests are
refused with 409 as on ``local``).
"""

from __future__ import annotations

import logging
import threading
import time

import numpy as np
import torch

from gnnserve.config import ServeConfig
from gnnserve.deploy.cgp.service import CGPService
from gnnserve.engine.executor import BatchSource, ExecutionContext
from gnnserve.engine.local import LocalExecutor
from gnnserve.errors import InvalidInputError
from gnnserve.newnodes.inference import NewNodeInference
from gnnserve.newnodes.result import NewNodeResult, RunOptions
from gnnserve.types import NewNodes

log = logging.getLogger(__name__)


class CGPExecutor(LocalExecutor):
    """LocalExecutor whose new-node SRPE requests run on CGP workers."""

    name = "cgp"

    @classmethod
    def check_config(cls, config: ServeConfig) -> None:
        """Refuse an update log: the workers hold a copy of the graph taken at start-up."""
        if config.store.update_log:
            raise InvalidInputError(
                "deploy mode cgp serves a static graph (its workers hold a copy taken at "
                "start-up): serve without an update log, or use deploy mode local or dgs",
                "deploy.mode",
            )

    def __init__(self, context: ExecutionContext) -> None:
        self.check_config(context.config)
        super().__init__(context)
        self.service: CGPService | None = None
        self._lock = threading.Lock()
        self.requests = 0  # new-node requests answered by the workers
        self.bytes_sent = 0  # bytes the workers sent each other, all requests

    def start(self, batches: BatchSource) -> None:
        """Start the CGP workers (when there are PEs to serve from), then the local stages."""
        ctx = self.context
        deploy = ctx.config.deploy
        if ctx.embeddings is not None:
            start = time.perf_counter()
            self.service = CGPService(
                ctx.runner.model,
                ctx.graph,
                ctx.features,
                ctx.embeddings,
                deploy.workers,
                threads_per_worker=deploy.threads_per_worker,
                timeout_s=deploy.timeout_s,
            )
            log.info("CGP: %d workers ready in %.1f s", deploy.workers, time.perf_counter() - start)
        else:
            log.warning("CGP: no precomputed embeddings, no worker started")
        super().start(batches)

    def stop(self, timeout_s: float = 30.0) -> None:
        """Drain the local stages, then stop the workers."""
        super().stop(timeout_s)
        service, self.service = self.service, None
        if service is not None:
            service.close()

    def run_new_nodes(
        self, local: NewNodeInference, new: NewNodes, mode: str, options: RunOptions
    ) -> NewNodeResult:
        """SRPE on the CGP workers (validated at admission: not checked again); other modes
        with ``local``."""
        if mode != "srpe" or self.service is None:
            return super().run_new_nodes(local, new, mode, options)
        out = self.service.infer(new, options)
        with self._lock:
            self.requests += 1
            self.bytes_sent += out.traffic.bytes_sent if out.traffic is not None else 0
        return out

    def warm_up(self) -> dict[str, float]:
        """One one-node SRPE request on the workers (their first collective and forward)."""
        ctx = self.context
        if self.service is None or ctx.graph.num_nodes == 0:
            return {}
        new = NewNodes(
            torch.zeros(1, ctx.features.dim),
            np.zeros((1, 2), dtype=np.int64),  # new node 0 -> existing node 0
            np.zeros((0, 2), dtype=np.int64),
        )
        cfg = ctx.config.embeddings
        policy = "query_edges_ratio" if cfg.policy == "oracle" else cfg.policy
        start = time.perf_counter()
        self.service.run(new, cfg.gamma, policy, 0)
        return {"new_nodes": (time.perf_counter() - start) * 1e3}

    def describe(self) -> dict[str, object]:
        """Workers, requests they answered and the bytes they exchanged."""
        return {
            "deploy": self.name,
            "workers": self.context.config.deploy.workers if self.service else 0,
            "cgp_requests": self.requests,
            "cgp_bytes_sent": self.bytes_sent,
        }
