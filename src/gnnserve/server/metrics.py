"""Prometheus metrics of one server: request and stage latency, batch sizes, queue, errors."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, InfoMetricFamily, Metric

from gnnserve.engine.batcher import Batch

_LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.03, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)
_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
_PSGS_BUCKETS = tuple(float(4**k) for k in range(2, 12))  # 16 .. 4,194,304 sampled nodes


class ServerMetrics:
    """The collectors, in a registry of their own (several servers can live in one process)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self._extra: list[Callable[[], bytes]] = []
        r = self.registry
        self.request_latency = Histogram(
            "gnnserve_request_latency_seconds",
            "End-to-end request latency",
            ["endpoint", "model"],
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
            "gnnserve_requests_total", "Requests answered", ["endpoint", "model"], registry=r
        )
        self.errors = Counter("gnnserve_errors_total", "Errors by kind", ["kind"], registry=r)
        self.update_batches = Counter(
            "gnnserve_update_batches", "Update batches applied, by how the body was read: "
            "edges_scanned (JSON edge ops read without the GIL), json, arrow", ["form"],
            registry=r,
        )  # fmt: skip
        self.path_batches = Counter(
            "gnnserve_sampling_path_batches", "Batches by the sampling path they took", ["path"],
            registry=r,
        )  # fmt: skip
        self.path_seeds = Counter(
            "gnnserve_sampling_path_seeds", "Seeds (with duplicates) by sampling path", ["path"],
            registry=r,
        )  # fmt: skip
        self.path_seconds = Histogram(
            "gnnserve_sampling_path_batch_seconds",
            "Time of a batch in the stages (sample, fetch, compute), by sampling path",
            ["path"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.batch_psgs = Histogram(
            "gnnserve_batch_psgs",
            "Summed PSGS (expected sampled nodes) per default-fanout batch",
            buckets=_PSGS_BUCKETS,
            registry=r,
        )
        self.routing = Gauge(
            "gnnserve_routing_psgs",
            "Active points in summed PSGS: the routing point (inline below it) and the cap",
            ["point"],
            registry=r,
        )
        self.loop_lag = Histogram(
            "gnnserve_event_loop_lag_seconds",
            "How late the event loop woke a task (sampled every 5 ms)",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )

    def answered(self, endpoint: str, model: str, seconds: float | None = None) -> None:
        """Count a request answered at ``endpoint`` for ``model`` ("" for the graph's own
        endpoints) and, when given, its latency (seconds)."""
        self.requests.labels(endpoint, model).inc()
        if seconds is not None:
            self.request_latency.labels(endpoint, model).observe(seconds)

    def watch_executor(self, describe: Callable[[], dict[str, object]]) -> None:
        """Export the engine executor's ``describe()`` on every scrape: ``gnnserve_deploy_info``
        (the mode) and one ``gnnserve_deploy_<key>`` gauge per numeric entry."""
        self.registry.register(_ExecutorCollector(describe))

    def watch_stats(self, prefix: str, stats: Callable[[], dict[str, float]]) -> None:
        """Export ``stats()`` on every scrape, one ``gnnserve_<prefix>_<key>`` gauge per entry
        (counters that only grow, and levels such as bytes held)."""
        self.registry.register(_StatsCollector(prefix, stats))

    def observe_batch(self, batch: Batch) -> None:
        """Engine observer: record stage times and the batch size."""
        for stage, ms in batch.stage_ms.items():
            self.stage_latency.labels(stage).observe(ms / 1e3)
        if batch.num_seeds is not None:
            self.batch_size.observe(batch.num_seeds)
        if batch.path:
            self.path_batches.labels(batch.path).inc()
            self.path_seeds.labels(batch.path).inc(batch.seeds.size)
            self.path_seconds.labels(batch.path).observe(sum(batch.stage_ms.values()) / 1e3)
        if batch.cost is not None:
            self.batch_psgs.observe(batch.cost)

    def watch_routing(self, routing_point: float, cost_cap: float | None) -> None:
        """Export the routing point and the batch cost cap (summed PSGS; absent: no cap)."""
        self.routing.labels("route").set(routing_point)
        if cost_cap is not None:
            self.routing.labels("cap").set(cost_cap)

    def also_render(self, render: Callable[[], bytes]) -> None:
        """Append ``render()``'s exposition text (another registry, e.g. the current feature
        store's tier counters, which a re-placement replaces) to every scrape."""
        self._extra.append(render)

    def render(self) -> bytes:
        """The exposition text."""
        return generate_latest(self.registry) + b"".join(r() for r in self._extra)


class _ExecutorCollector:
    """Collects what the executor reports about itself at scrape time."""

    def __init__(self, describe: Callable[[], dict[str, object]]) -> None:
        self._about = describe  # not ``describe``: the registry would take it for its own hook

    def collect(self) -> Iterator[Metric]:
        about = self._about()
        yield InfoMetricFamily(
            "gnnserve_deploy", "How admitted work runs", value={"mode": str(about.get("deploy"))}
        )
        for key, value in about.items():
            if isinstance(value, int | float) and not isinstance(value, bool):
                yield GaugeMetricFamily(f"gnnserve_deploy_{key}", f"executor: {key}", value=value)


class _StatsCollector:
    """Collects a component's counters at scrape time (:meth:`ServerMetrics.watch_stats`)."""

    def __init__(self, prefix: str, stats: Callable[[], dict[str, float]]) -> None:
        self._prefix, self._stats = prefix, stats

    def collect(self) -> Iterator[Metric]:
        for key, value in self._stats().items():
            name = f"gnnserve_{self._prefix}_{key}"
            yield GaugeMetricFamily(name, f"{self._prefix}: {key}", value=float(value))
