"""LocalExecutor: sample -> fetch -> compute in this process, in overlapping stage threads.

Batching and sampling share one thread, so a batch closes only when sampling can take it; at
most ``batcher.pipeline_depth`` batches per pipeline are between the batcher and their answers,
so while they are busy requests wait and the next batch grows (adaptive batching). The graph's
read version is pinned from sampling until the features are read.

``batcher.pipelines`` > 1 multiplexes pipelines (Quiver §4.3): each has its own sample, fetch
and compute threads, and all pull from the one batch queue, each only when it holds no batch, so
a slow batch (a straggler) holds its own pipeline only; the next batch goes to whichever
pipeline is free. The stages release the GIL (numba kernels, torch), so pipelines overlap one
another's work.

With ``compute.device: cuda`` the routed batches take the device path
(:mod:`gnnserve.engine.device_path`) through the same three stages.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable

import numpy as np
import torch

from gnnserve.engine.batcher import STOP, Batch, drop_expired
from gnnserve.engine.device_path import DEVICE_PATH, DevicePath
from gnnserve.engine.executor import BatchSource, ExecutionContext, Executor
from gnnserve.engine.pipeline import Stage, fail_batch, use_kernel_threads
from gnnserve.errors import GnnServeError
from gnnserve.models.runner import ModelRunner
from gnnserve.types import MiniBatch, Result, SampledSubgraph, StageTimings


class LocalExecutor(Executor):
    """The whole request path in this process (``deploy.mode: local``)."""

    name = "local"

    def __init__(self, context: ExecutionContext) -> None:
        super().__init__(context)
        self._threads: list[threading.Thread] = []
        self._source: BatchSource | None = None
        on_gpu = context.config.compute.device == DEVICE_PATH
        self.device_path = DevicePath(context) if on_gpu else None

    def start(self, batches: BatchSource) -> None:
        """Start each pipeline's sample, fetch and compute threads, pulling from ``batches``."""
        self._source = batches
        config = self.context.config.batcher
        self._take = threading.Lock()  # the batcher forms one batch at a time
        self._threads = []
        # several pipelines: each takes a batch only when idle, or a free slot behind a
        # straggler would pull the next batch into that straggler's pipeline
        depth = config.pipeline_depth if config.pipelines == 1 else 1
        for index in range(config.pipelines):
            self._threads += self._pipeline(index, depth)
        for t in self._threads:
            t.start()

    def _pipeline(self, index: int, depth: int) -> list[threading.Thread]:
        """One sample -> fetch -> compute chain with ``depth`` batches in flight."""
        slots = threading.Semaphore(depth)
        to_fetch: queue.Queue[object] = queue.Queue()
        to_compute: queue.Queue[object] = queue.Queue()

        def release(batch: Batch) -> None:
            assert self._source is not None
            self._source.finished(batch)  # trains admission's service-time model
            slots.release()

        suffix = f"-{index}" if index else ""
        threads = self.context.config.compute.kernel_threads
        return [
            threading.Thread(
                target=self._sample_loop,
                args=(slots, to_fetch, release),
                name=f"gnnserve-sample{suffix}",
                daemon=True,
            ),
            Stage("fetch", self._fetch, to_fetch, to_compute, release, suffix, threads),
            Stage("compute", self._compute, to_compute, None, release, suffix, threads),
        ]

    def warm_up(self) -> dict[str, float]:
        """Compile and run the device path once (ms), when there is one."""
        if self.device_path is None:
            return {}
        start = time.perf_counter()
        self.device_path.warm_up()
        return {"device_path": (time.perf_counter() - start) * 1e3}

    def describe(self) -> dict[str, object]:
        """The deploy mode, and where the device path keeps its rows when there is one."""
        about = super().describe()
        if self.device_path is not None:
            about.update(self.device_path.describe())
        return about

    def stop(self, timeout_s: float = 30.0) -> None:
        """Join the stage threads; the batcher's STOP drains them after the batches queued."""
        for t in self._threads:
            t.join(timeout_s)
        self._threads = []

    def sample(self, batch: Batch) -> SampledSubgraph:
        """The computation graph of ``batch`` (subclasses route it elsewhere). Its seeds were
        validated at admission: not checked again."""
        planner = self.context.planner
        batch.path = planner.path_of(batch.fanouts, batch.seeds, batch.rng_seed is not None)
        if batch.rng_seed is None:
            return planner.sampler_for(batch.fanouts).sample_valid(batch.seeds)
        return planner.on_demand_for(batch.fanouts).sample_valid(batch.seeds, batch.rng_seed)

    def _cost(self, batch: Batch) -> float | None:
        """The batch's summed PSGS when its fanouts are the default and PSGS is known."""
        planner = self.context.planner
        if planner.psgs is None or (batch.fanouts or planner.default) != planner.default:
            return None
        return float(planner.psgs[batch.seeds].sum())

    # stages --------------------------------------------------------------------------------
    def _sample_loop(
        self,
        slots: threading.Semaphore,
        outbox: queue.Queue[object],
        release: Callable[[Batch], None],
    ) -> None:
        assert self._source is not None
        graph = self.context.graph
        use_kernel_threads(self.context.config.compute.kernel_threads)
        while True:
            slots.acquire()
            with self._take:
                batch = self._source.next_batch()
            if batch is None:
                break
            start = time.perf_counter()
            batch.graph_version = graph.acquire_read()  # released once features are read
            batch.cost = self._cost(batch)
            try:
                if self.device_path is not None and self.device_path.takes(batch):
                    batch.path = DEVICE_PATH
                    batch.device = self.device_path.sample(batch)
                else:
                    batch.subgraph = self.sample(batch)
            except BaseException as exc:  # noqa: BLE001 - reported per request
                graph.release_read()
                fail_batch(batch, exc)
                release(batch)
                continue
            batch.read_pin = graph.detach_read()  # the fetch thread reads and releases it
            batch.stage_ms["sample"] = (time.perf_counter() - start) * 1e3
            outbox.put(batch)
        outbox.put(STOP)

    def _fetch(self, batch: Batch) -> None:
        graph = self.context.graph
        graph.attach_read(batch.read_pin)
        try:
            drop_expired(batch)  # 504 for requests past their deadline; none left: skip
            if batch.device is not None:
                assert self.device_path is not None
                return self.device_path.gather(batch.device)
            assert batch.subgraph is not None
            ids = batch.subgraph.input_nodes
            x = self.context.features.get_valid(ids)  # sampled from the graph: valid ids
            in_degree = torch.from_numpy(graph.gcn_degree(ids))  # full-graph, for GCN
        finally:
            graph.release_read()
        batch.minibatch = MiniBatch(batch.subgraph, x, in_degree)

    def _compute(self, batch: Batch) -> None:
        assert self._source is not None
        drop_expired(batch)
        start = time.perf_counter()
        if batch.device is not None:
            assert self.device_path is not None
            logits, embedding = self.device_path.forward(batch.device, self.context.runner)
        else:
            assert batch.minibatch is not None
            logits, embedding = self.context.runner.forward(batch.minibatch)
        batch.stage_ms["compute"] = (time.perf_counter() - start) * 1e3
        self._source.finished(batch)  # before the answers: a caller's next request finds it done
        self._resolve(batch, logits, embedding)
        for observe in self.context.observers:
            observe(batch)

    def _resolve(self, batch: Batch, logits: torch.Tensor, embedding: torch.Tensor) -> None:
        resolve_batch(batch, self.context.runner, logits, embedding)


def resolve_batch(
    batch: Batch, runner: ModelRunner, logits: torch.Tensor, embedding: torch.Tensor
) -> None:
    """Answer each request of ``batch`` from the unique seeds' ``logits`` / ``embedding``
    (rows ``batch.subgraph.seed_rows``; on the device path one row per requested seed), with
    its timings; a request whose output is not finite gets its error, the others their
    results."""
    if batch.subgraph is not None:
        rows = batch.subgraph.seed_rows
    else:  # the device path answered each requested seed, in request order
        rows = np.arange(batch.seeds.size, dtype=np.int64)
    offset = 0
    now = time.perf_counter()
    for ticket in batch.tickets:
        nodes, output = ticket.nodes, ticket.request.options.output
        mine = rows[offset : offset + nodes.size]
        offset += nodes.size
        try:
            values = runner.shape_output(output, logits, embedding, mine, nodes)
        except GnnServeError as exc:  # NaN/inf outputs: this request fails, not the batch
            if not ticket.future.done():
                ticket.future.set_exception(exc)
            continue
        timings = StageTimings(
            queue_ms=(batch.formed_s - ticket.arrival_s) * 1e3,
            sample_ms=batch.stage_ms.get("sample", 0.0),
            fetch_ms=batch.stage_ms.get("fetch", 0.0),
            compute_ms=batch.stage_ms.get("compute", 0.0),
            total_ms=(now - ticket.arrival_s) * 1e3,
            batch_size=batch.num_seeds or 0,
        )
        result = Result(
            ticket.request_id,
            nodes,
            output,
            values,
            runner.version,
            batch.graph_version,
            timings,
        )
        if not ticket.future.done():
            ticket.future.set_result(result)
