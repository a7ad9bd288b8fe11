"""FogExecutor (``deploy.mode: fog``): every batch is answered by one round on the fog nodes.

The engine in front (admission, batcher, HTTP) is unchanged. At start the executor starts a
:class:`~gnnserve.deploy.fog.service.FogService` over the nodes of ``deploy.nodes`` (profiled,
planned, one device group per node uploading over its testbed link) in ``deploy.fog_mode``.
Each batch then runs one round: the device groups upload the vertices' current readings (the
served feature store's rows), the fogs run full-graph inference (BSP), and the batch's
requests are answered from their vertices' rows. Answers are full-graph (every in-neighbour):
request fanouts do not apply and are refused. The graph must not change (no update log).

With ``deploy.fog_gateways`` the readings come from sensor gateways instead: the executor writes
their plan to that directory (:func:`~.gateway.write_plan`), rounds run as the gateways' uploads
complete (:class:`~.gateway.GatewayRounds`), and each batch is answered from the latest round.
"""

from __future__ import annotations

import logging
import threading
import time

import numpy as np
import torch

from gnnserve.config import ServeConfig
from gnnserve.deploy.fog.gateway import GatewayRounds, write_plan
from gnnserve.deploy.fog.nodes import load_nodes
from gnnserve.deploy.fog.profile_cache import ProfileCache
from gnnserve.deploy.fog.service import FogService, RoundReport
from gnnserve.deploy.ray import start_ray_early
from gnnserve.engine.batcher import Batch
from gnnserve.engine.executor import BatchSource, ExecutionContext, Executor
from gnnserve.engine.local import resolve_batch
from gnnserve.engine.pipeline import check_default_fanouts, fail_batch
from gnnserve.errors import InvalidInputError
from gnnserve.types import SampledSubgraph

log = logging.getLogger(__name__)


class FogExecutor(Executor):
    """Runs each batch as one round of a fog deployment."""

    name = "fog"

    @classmethod
    def check_config(cls, config: ServeConfig) -> None:
        """Refuse an update log, sampled fanouts and a missing or bad nodes file."""
        fanouts = config.sampler.fanouts
        if any(f != -1 for f in fanouts):
            given = ",".join(str(f) for f in fanouts)
            raise InvalidInputError(
                "deploy mode fog answers with full-graph inference (every neighbour at every "
                f"layer), not with sampled fanouts {given}: serve it with --fanouts=-1,-1 (one "
                "-1 per model layer)",
                "sampler.fanouts",
            )
        if config.store.update_log:
            raise InvalidInputError(
                "deploy mode fog serves a fixed sensor graph (its nodes hold partitions taken "
                "at start-up): serve without an update log",
                "deploy.mode",
            )
        if not config.deploy.nodes:
            raise InvalidInputError(
                "deploy mode fog needs --nodes (a YAML file of the fog nodes)", "deploy.nodes"
            )
        load_nodes(config.deploy.nodes)

    @classmethod
    def start_early(cls, config: ServeConfig) -> None:
        """Start Ray (as FogCluster would: a CPU per fog node, at least 2) while the store
        loads."""
        world = 1 if config.deploy.fog_mode == "cloud" else len(load_nodes(config.deploy.nodes))
        start_ray_early(max(2, world))

    def __init__(self, context: ExecutionContext) -> None:
        self.check_config(context.config)
        super().__init__(context)
        self.nodes = load_nodes(context.config.deploy.nodes)
        self.service: FogService | None = None
        self._source: BatchSource | None = None
        self._thread: threading.Thread | None = None
        self.last: RoundReport | None = None
        self.rounds = 0
        self.bytes_uploaded = 0
        self.raw_bytes = 0
        self.gateway_rounds: GatewayRounds | None = None

    def start(self, batches: BatchSource) -> None:
        """Start the fog nodes (profile, plan, warm-up round), then the dispatch thread."""
        ctx = self.context
        started = time.perf_counter()
        readings = ctx.features.get_valid(np.arange(ctx.graph.num_nodes)).numpy()
        mode, codec = (
            ctx.config.deploy.fog_mode,
            upload_codec(ctx.config.deploy.fog_codec, readings),
        )
        gateways = ctx.config.deploy.fog_gateways
        self.service = FogService(
            ctx.runner.model, ctx.graph, readings, self.nodes, mode, codec=codec,
            profiles=ProfileCache(), reprofile=ctx.config.deploy.fog_reprofile,
            accuracy_budget_pts=ctx.config.deploy.fog_accuracy_budget,
            gateways=bool(gateways), adaptive=False if gateways else None,
        )  # fmt: skip
        if gateways:
            plan = write_plan(self.service.gateway_plan(), gateways)
            log.info("fog: sensor gateways upload by the plan in %s", plan)
            self.gateway_rounds = GatewayRounds(self.service)
        log.info(
            "fog: %d nodes (%s%s) ready in %.1f s",
            len(self.nodes),
            mode,
            f", {codec} uploads" if mode == "fograph" else ", raw uploads",
            time.perf_counter() - started,
        )
        self._source = batches
        self._thread = threading.Thread(target=self._dispatch, name="fog-dispatch", daemon=True)
        self._thread.start()

    def _dispatch(self) -> None:
        assert self._source is not None and self.service is not None
        while True:
            batch = self._source.next_batch()
            if batch is None:
                return
            try:
                report = self._round(batch)
            except Exception as exc:  # noqa: BLE001 - the batch's callers get the error
                self._source.finished(batch)
                fail_batch(batch, exc)
                continue
            self._answer(batch, report)

    def _round(self, batch: Batch) -> RoundReport:
        """One round for ``batch`` (InvalidInputError for per-request fanouts)."""
        assert self.service is not None
        layers = self.context.runner.model.config.num_layers
        if batch.fanouts != (-1,) * layers:  # every neighbour, every layer: what a round computes
            check_default_fanouts(
                batch,
                self.context.planner.default,
                "the fog deployment: it answers with full-graph inference (fanouts "
                f"{[-1] * layers}, or none)",
            )
        batch.graph_version = self.context.graph.version
        if self.gateway_rounds is not None:  # the latest round the gateways fed
            deadlines = [t.deadline_s for t in batch.tickets if t.deadline_s is not None]
            wait_s = min(deadlines) - time.perf_counter() if deadlines else 30.0
            report, self.rounds = self.gateway_rounds.latest(wait_s)
            self.last = report
            return report
        report = self.service.round()
        self.last, self.rounds = report, self.rounds + 1
        return report

    def _answer(self, batch: Batch, report: RoundReport) -> None:
        """Answer ``batch``'s requests from the round's rows of their vertices."""
        assert self._source is not None
        self.bytes_uploaded += report.bytes_uploaded
        self.raw_bytes += report.raw_bytes
        seeds, rows = np.unique(batch.seeds, return_inverse=True)
        batch.subgraph = SampledSubgraph(seeds, [], int(seeds.size), rows.astype(np.int64))
        batch.stage_ms.update(
            sample=0.0,
            fetch=max(report.collect_ms),
            compute=report.latency_ms - max(report.collect_ms),
        )
        self._source.finished(batch)
        assert report.embedding is not None
        logits = torch.from_numpy(report.logits[seeds])
        embedding = torch.from_numpy(report.embedding[seeds])
        resolve_batch(batch, self.context.runner, logits, embedding)
        for observe in self.context.observers:
            observe(batch)

    def stop(self, timeout_s: float = 30.0) -> None:
        """Answer the batch in flight, then stop the nodes, links and quotas."""
        if self._thread is not None:
            self._thread.join(timeout_s)
        if self.gateway_rounds is not None:
            self.gateway_rounds.stop()
        service, self.service = self.service, None
        if service is not None:
            service.close()

    def describe(self) -> dict[str, object]:
        """Rounds, bytes uploaded and their compression, plan version, per-node time and mu."""
        about: dict[str, object] = {"deploy": self.name, "fog_rounds": self.rounds}
        about["fog_bytes_uploaded"] = self.bytes_uploaded
        if self.service is not None:
            about["fog_slow_rounds"] = self.service.slow_rounds
        if self.bytes_uploaded:
            about["fog_compression_ratio"] = self.raw_bytes / self.bytes_uploaded
        last = self.last
        if last is not None:
            about["fog_plan_version"] = last.plan_version
            about["fog_round_ms"] = last.latency_ms
            times = np.asarray(last.node_ms)
            mu = times / times.mean() if times.mean() > 0 else np.ones_like(times)
            for node, ms, skew in zip(self.nodes_served(), times, mu, strict=False):
                about[f"fog_node_{node}_compute_ms"] = float(ms)
                about[f"fog_node_{node}_mu"] = float(skew)
        return about

    def nodes_served(self) -> list[str]:
        """Names of the nodes computing (one ``cloud`` node in cloud mode)."""
        if self.service is not None and self.service.mode == "cloud":
            return ["cloud"]
        return [n.name for n in self.nodes]


def upload_codec(setting: str, readings: np.ndarray) -> str:
    """The fograph upload codec for ``deploy.fog_codec``: ``auto`` is lossless when every
    reading is integer-valued (counts, states: quantized codes would round them), else the
    column codec (continuous readings, widths by the accuracy budget)."""
    if setting != "auto":
        return setting
    return "lossless" if bool(np.all(readings == np.round(readings))) else "column"
