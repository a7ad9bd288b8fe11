"""Prometheus metrics of one server: request and stage latency, batch sizes, queue, errors."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from gnnserve.engine.batcher import Batch

_LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.03, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)
_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)


class ServerMetrics:
    """The collectors, in a registry of their own (several servers can live in one process)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.request_latency = Histogram(
            "gnnserve_request_latency_seconds",
            "End-to-end request latency",
            ["endpoint"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.stage_latency = Histogram(
            "gnnserve_stage_latency_seconds",
            "Per-batch stage time",
            ["stage"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.batch_size = Histogram(
            "gnnserve_batch_size", "Unique seed nodes per batch", buckets=_BATCH_BUCKETS, registry=r
        )
        self.queue_depth = Gauge(
            "gnnserve_queue_depth", "Requests admitted, not answered", registry=r
        )
        self.requests = Counter(
            "gnnserve_requests_total", "Requests answered", ["endpoint"], registry=r
        )
        self.errors = Counter("gnnserve_errors_total", "Errors by kind", ["kind"], registry=r)

    def observe_batch(self, batch: Batch) -> None:
        """Engine observer: record stage times and the batch size."""
        for stage, ms in batch.stage_ms.items():
            self.stage_latency.labels(stage).observe(ms / 1e3)
        if batch.subgraph is not None:
            self.batch_size.observe(batch.subgraph.num_seeds)

    def render(self) -> bytes:
        """The exposition text."""
        return generate_latest(self.registry)
