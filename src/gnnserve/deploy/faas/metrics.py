"""FaaSMetrics: what the serverless deployment reports on /metrics (gnnserve_deploy_* gauges).

Per pool (``sample``, ``infer``): instances by state, cold starts, mean cold-start seconds,
requests queued on instances and in the temporary queue, steals, instance failures, requests
retried after their instance died, GB·s.
Per request, accumulated: cache hits and misses (hit rate), bytes fetched (topology and
features), predicted and measured peak inference memory (last, and the mean relative error),
requests before which a prediction above the free budget cleared the cache.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gnnserve.deploy.faas.pool import FunctionPool
    from gnnserve.deploy.faas.service import FaaSResult, FaaSService


class FaaSMetrics:
    """Counters fed by every answered request; :meth:`snapshot` adds the pools' state."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.requests = 0
        self.cache_hits = 0
        self.cache_misses = 0
        self.topology_bytes = 0
        self.feature_bytes = 0
        self.fetch_requests = 0
        self.clears = 0  # requests that cleared the cache first
        self.predicted_bytes = 0  # last request's prediction
        self.measured_bytes = 0  # last request's measured peak
        self._rel_error_sum = 0.0
        self._predicted = 0  # requests with a prediction

    def record(self, result: FaaSResult) -> None:
        """Add one answered request."""
        out, sample = result.output, result.sample
        with self._lock:
            self.requests += 1
            self.cache_hits += out.hits
            self.cache_misses += out.misses
            self.topology_bytes += sample.bytes_read
            self.feature_bytes += out.bytes_read
            self.fetch_requests += sample.requests
            self.clears += int(out.cleared)
            self.predicted_bytes, self.measured_bytes = out.predicted_bytes, out.measured_bytes
            if out.predicted_bytes and out.measured_bytes:
                error = abs(out.predicted_bytes - out.measured_bytes) / out.measured_bytes
                self._rel_error_sum += error
                self._predicted += 1

    def snapshot(self, service: FaaSService) -> dict[str, object]:
        """Numeric gauges, flat (``/metrics`` turns each into ``gnnserve_deploy_<key>``)."""
        with self._lock:
            looked_up = self.cache_hits + self.cache_misses
            about: dict[str, object] = {
                "faas_requests": self.requests,
                "faas_cache_hit_rate": self.cache_hits / looked_up if looked_up else 0.0,
                "faas_cache_hits": self.cache_hits,
                "faas_cache_misses": self.cache_misses,
                "faas_topology_bytes": self.topology_bytes,
                "faas_feature_bytes": self.feature_bytes,
                "faas_fetch_requests": self.fetch_requests,
                "faas_cache_clears": self.clears,
                "faas_predicted_memory_bytes": self.predicted_bytes,
                "faas_measured_memory_bytes": self.measured_bytes,
                "faas_memory_mean_rel_error": (
                    self._rel_error_sum / self._predicted if self._predicted else 0.0
                ),
            }
        for pool in (service.sampler, service.inference):
            about.update(pool_gauges(pool))
        about["faas_gb_seconds"] = service.gb_seconds()
        return about


def pool_gauges(pool: FunctionPool) -> dict[str, object]:
    """Instances by state, cold starts, queues and steals of one pool, keys prefixed by it."""
    view = pool.scheduler.view()
    stats = pool.stats
    prefix = f"faas_{pool.name}"
    gauges: dict[str, object] = {
        f"{prefix}_instances_{state}": count for state, count in view.instances.items()
    }
    cold = stats.cold_start_s
    gauges.update(
        {
            f"{prefix}_cold_starts": stats.cold_starts,
            f"{prefix}_cold_start_mean_s": sum(cold) / len(cold) if cold else 0.0,
            f"{prefix}_queued": sum(view.queue_lengths.values()),
            f"{prefix}_temporary_queue": view.temporary,
            f"{prefix}_steals": view.steals,
            f"{prefix}_failures": stats.failures,
            f"{prefix}_retries": stats.retries,
        }
    )
    return gauges
