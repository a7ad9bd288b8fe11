"""Fograph end to end: a fog cluster on the testbed, profiled, planned, fed by device groups,
adapted between rounds. Three modes share it, as in Fograph's evaluation:

- ``fograph``: IEP placement on the profiled nodes (METIS parts sized so that each node's
  upload + compute time per part is equal, unless ``weighted_parts=False``), DAQ + LZ4 uploads,
  the adaptive scheduler
  (``assign`` and ``adaptive`` override the mapping and the scheduler for ablations);
- ``strawman``: METIS + a random mapping, raw float32 uploads, no scheduler;
- ``cloud``: one unthrottled node; every device group uploads raw over one shared path to the
  cloud (:func:`~.links.cloud_path`).

On the testbed each device group uploads over its node's shaped ``link`` and the fogs swap
boundary rows over a :class:`~.links.FogFabric` with each node's ``fog_link``.

A round (:meth:`FogService.round`) hands each device group its sensors' readings, waits for
every fog to collect and compute (BSP), and reports the latency from the hand-over to the last
output, per-node times and the bytes uploaded.
"""

from __future__ import annotations

import logging
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np

from gnnserve.deploy.fog.cluster import ClusterRound, FogCluster
from gnnserve.deploy.fog.devices import DeviceFleet, regions
from gnnserve.deploy.fog.hosts import real_hosts
from gnnserve.deploy.fog.links import (
    FOG_LINKS,
    PRESETS,
    FogFabric,
    Link,
    cloud_path,
    measure_rate,
)
from gnnserve.deploy.fog.partition import build_fog_partitions, symmetric_adjacency
from gnnserve.deploy.fog.placement import FogPlacement
from gnnserve.deploy.fog.profile_cache import ProfileCache, profile_key
from gnnserve.deploy.fog.profiler import time_together
from gnnserve.deploy.fog.quantizer import FLOAT32_DAQ_BITS, upload_widths
from gnnserve.deploy.fog.scheduler import Decision, schedule
from gnnserve.deploy.fog.slots import Slot, claim_slot
from gnnserve.deploy.fog.testbed import CpuQuota, probe
from gnnserve.errors import InvalidInputError
from gnnserve.graph.base import GraphStore
from gnnserve.models.zoo import GNN
from gnnserve.phases import Phases

log = logging.getLogger(__name__)
MODES = ("fograph", "strawman", "cloud")
# fograph uploads: DAQ + LZ4 (binary readings), every row float32 + LZ4 (exact), or the column
# codec at widths chosen by a measured accuracy budget (continuous readings)
CODECS = ("daq", "lossless", "column")
SLOW_ROUND = 3.0  # a round this many times the plan's prediction is logged as a warning


@dataclass(frozen=True)
class NodeSpec:
    """One fog node of the deployment."""

    name: str
    cores: float | None  # CPU quota in cores (None: unthrottled)
    link: str  # preset of its devices' uplink: 4g | 5g | wifi
    fog_link: str = "lan"  # preset of its side of the fog <-> fog network (FOG_LINKS)
    host: str | None = None  # a Ray node's address: the machine it runs on (None: emulated)


@dataclass
class RoundReport:
    """One round of the service."""

    logits: np.ndarray  # float32 [N, C]
    latency_ms: float  # hand-over of the readings to the last fog's output
    node_ms: list[float]  # per fog: compute time (the scheduler's T_j)
    collect_ms: list[float]  # per fog: waiting for its uploads
    bytes_uploaded: int  # on the wire, all device groups
    raw_bytes: int  # float32 readings uploaded
    plan_version: int
    embedding: np.ndarray | None = None  # float32 [N, H]: the last layer's input per vertex
    decision: Decision | None = None  # the scheduler's after this round (fograph mode)


class FogService:
    """A running deployment (see the module doc). ``testbed``: use cgroup quotas and network
    namespaces where :func:`~.testbed.probe` allows (else loopback, unthrottled, with a
    warning); nodes with a ``host`` run on those Ray nodes instead (:mod:`.hosts`).
    ``compress``: upload with the codec (default: in fograph mode only; True gives the cloud
    the same codec). ``gateways``: readings come from ``gnnserve fog upload`` gateways
    (:meth:`gateway_plan`), not from device groups the service starts. Close with
    :meth:`close` or use as a context manager."""

    def __init__(
        self,
        model: GNN,
        graph: GraphStore,
        features: np.ndarray,
        nodes: list[NodeSpec],
        mode: str = "fograph",
        *,
        daq_bits: tuple[int, int, int, int] = FLOAT32_DAQ_BITS,
        slack: float = 1.2,
        skew_threshold: float = 0.5,
        min_excess_ms: float = 5.0,
        chunks: int = 4,
        testbed: bool = True,
        seed: int = 0,
        assign: str | None = None,
        adaptive: bool | None = None,
        weighted_parts: bool = True,
        codec: str = "daq",
        gateways: bool = False,
        compress: bool | None = None,
        profiles: ProfileCache | None = None,
        reprofile: bool = False,
        accuracy_budget_pts: float = 0.1,
    ) -> None:
        if mode not in MODES:
            raise InvalidInputError(f"mode must be one of {MODES}, got {mode!r}", "mode")
        if codec not in CODECS:
            raise InvalidInputError(f"codec must be one of {CODECS}, got {codec!r}", "codec")
        if not nodes or any(n.link not in PRESETS for n in nodes):
            raise InvalidInputError(f"nodes need a link from {sorted(PRESETS)}", "nodes")
        if any(n.fog_link not in FOG_LINKS for n in nodes):
            raise InvalidInputError(f"nodes need a fog_link from {sorted(FOG_LINKS)}", "nodes")
        self.mode, self.nodes, self.model, self.graph = mode, nodes, model, graph
        self.slack, self.skew_threshold, self.min_excess_ms = slack, skew_threshold, min_excess_ms
        self.chunks, self.seed = chunks, seed
        # the mapping (iep | greedy | random) and the scheduler default to the mode's
        self.assign = assign or ("iep" if mode == "fograph" else "random")
        self.adaptive = (mode == "fograph" and not gateways) if adaptive is None else adaptive
        if gateways and self.adaptive:
            raise InvalidInputError(
                "gateways upload to a fixed placement: the adaptive scheduler would move "
                "vertices under them (adaptive=False)",
                "adaptive",
            )
        self.gateways = gateways  # readings come from `gnnserve fog upload`, not device groups
        self.profiles, self.reprofile = profiles, reprofile
        self.profile_reused = False  # the start-up plan used a cached profile
        self.startup = Phases("fog start-up", log)  # seconds per step, logged as each ends
        self.indptr, self.indices = graph.csr()
        self.features = np.array(features, np.float32)
        self.world = 1 if mode == "cloud" else len(nodes)
        self.hosts = real_hosts(nodes) if mode != "cloud" else None
        support = probe()
        testbed = testbed and self.hosts is None  # real machines have real links and speeds
        self.shaped = testbed and support.netns is None
        self.quotas_on = testbed and support.cpu_quota is None and mode != "cloud"
        if testbed and not (self.shaped and (self.quotas_on or mode == "cloud")):
            log.warning("testbed incomplete: %s", support)
        # the codec: fograph's by default; compress=True gives another mode (the cloud) the
        # same codec, so a comparison isolates the placement from the collection gain
        compress = (mode == "fograph") if compress is None else compress
        chunk_rows = -(-graph.num_nodes // (self.world * max(1, chunks)))  # a device chunk's
        with self.startup("codec widths"):
            widths = upload_widths(
                model, self.indptr, self.indices, self.features, compress, codec, daq_bits,
                accuracy_budget_pts, chunk_rows=chunk_rows,
            )  # fmt: skip
        # the per-vertex widths, what the device groups pack with (daq | column) and the
        # column codec's calibration
        self.bits, self.wire_codec, self.quantizer = widths.bits, widths.codec, widths.quantizer
        self._warned_plan = -1  # plan version of the last slow-round warning
        self.placement = FogPlacement(
            self.indptr,
            self.indices,
            self.features,
            self.bits,
            model.config.num_layers,
            self.assign,
            mode == "fograph" and weighted_parts,
            seed,
            self.wire_codec,
        )
        self.version, self._round = 0, 0
        self.slow_rounds = 0  # rounds that took SLOW_ROUND x the prediction or more
        self._over = np.zeros(len(nodes), bool)  # fogs past the slack in the last round
        self.fleet: DeviceFleet | None = None
        # contiguous blocks until the plan (the profile runs the same subgraphs on every node)
        blocks = np.arange(graph.num_nodes) * self.world // graph.num_nodes
        self.slot: Slot | None = None  # this deployment's testbed names and subnets
        try:  # close() undoes whatever part of the set-up was done
            with self.startup("links"):
                if self.shaped or self.quotas_on:
                    self.slot = claim_slot()
                self._open_links(support.netem)
                self.fabric = self._fabric(support.netem)
                self._plan_exchange(model)
            with self.startup("fog processes"):
                self.cluster = FogCluster(
                    model, graph, self.features, blocks, self.world, fabric=self.fabric,
                    hosts=self.hosts,
                )  # fmt: skip
                self.addresses = self.cluster.addresses()
                self.quotas = self._quotas()
            self.membership = self._initial_plan(blocks)
            with self.startup("device groups"):
                hosts = [self._host(j) for j in range(self.world)]
                self.ports = self.cluster.listen(hosts, strict=not gateways)
                self._start_groups()
            self.adjacency = symmetric_adjacency(self.indptr, self.indices)
            self.work = np.diff(self.indptr).astype(float) + 1.0  # aggregation: an edge each
            # a warm-up round starts the processes and connections (gateways: their first)
            with self.startup("warm-up round"):
                self.warm_up_ms = 0.0 if gateways else self._collect_and_run().latency_ms
        except BaseException:
            self.close()
            raise
        log.info("fog: started in %s", self.startup.summary())

    # ------------------------------------------------------------------ set-up

    def _open_links(self, netem: bool) -> None:
        """``self.links``: one per device group's path (kept as each opens, for close())."""
        presets = [PRESETS[n.link] for n in self.nodes]
        if self.mode == "cloud":  # every device group over one path to the cloud
            presets = [cloud_path(self.nodes[0].link)]
        shaped = self.shaped and not self.gateways  # gateways send over the real network
        self.links: list[Link | None] = []
        for i, preset in enumerate(presets):
            self.links.append(Link(self._slot(), i, preset, netem) if shaped else None)

    def _fabric(self, netem: bool) -> FogFabric | None:
        if not self.shaped or self.world == 1:
            return None
        return FogFabric(self._slot(), [FOG_LINKS[n.fog_link] for n in self.nodes], netem)

    def _plan_exchange(self, model: GNN) -> None:
        """What the planner needs to predict the boundary exchange: the layers' input widths
        and, where a fabric shapes the fog links, their rates (bytes/s) and delays (ms)."""
        config = model.config
        self.placement.widths = [config.in_dim] + [config.hidden_dim] * (config.num_layers - 1)
        if self.fabric is not None:
            presets = [FOG_LINKS[n.fog_link] for n in self.nodes]
            self.placement.fog_links = [(p.rate_mbit * 1e6 / 8, p.delay_ms) for p in presets]

    def _slot(self) -> int:
        assert self.slot is not None  # claimed whenever the testbed is on
        return self.slot.index

    def _quotas(self) -> list[CpuQuota | None]:
        if not self.quotas_on:
            return [None] * self.world
        quotas: list[CpuQuota | None] = []
        for pid, node in zip(self.cluster.pids(), self.nodes, strict=True):
            if node.cores is None:
                quotas.append(None)
                continue
            assert self.slot is not None
            quota = CpuQuota(node.name, node.cores, group=self.slot.cgroup_parent)
            quota.add(pid)
            quotas.append(quota)
        return quotas

    def _time_all(self, vertices: np.ndarray, together: bool) -> list[float]:
        """ms of the model on the calibration subgraph ``vertices`` on every node (the
        profiler's measurement): all at once with ``together``, else one at a time."""
        member = np.ones(self.graph.num_nodes, np.int64)
        member[vertices] = 0
        degree = self.cluster.gcn_degree
        part = build_fog_partitions(self.indptr, self.indices, member, 2, degree)[0]
        rows = np.concatenate([part.owned, part.halo])
        return self.cluster.time_subgraph(part, self.features[rows], 2, together)

    def _time_together(self) -> bool:
        """Whether timing every node at once changes no node's time (``time_together``)."""
        quotas = zip(self.nodes, self.quotas, strict=True)  # cores count where a quota holds them
        cores = [n.cores if q is not None else None for n, q in quotas]
        return time_together(cores, self.hosts, len(os.sched_getaffinity(0)))

    def _uplink_rates(self) -> list[float]:
        """Each node's device uplink in bytes/s: measured over its shaped link (all links at
        once; each has its own shaper), the preset's rate without a testbed."""
        shaped = [link for link in self.links if link is not None]
        if len(shaped) == len(self.nodes):
            with ThreadPoolExecutor(len(shaped)) as pool:
                return list(pool.map(measure_rate, shaped))
        return [PRESETS[node.link].rate_mbit * 1e6 / 8 for node in self.nodes]

    def _initial_plan(self, blocks: np.ndarray) -> np.ndarray:
        if self.mode == "cloud":
            return blocks  # one node: every vertex on it
        names = [node.name for node in self.nodes]
        key = self._profile_key()
        cached = None
        if self.profiles is not None and not self.reprofile:
            cached = self.profiles.load(key, len(names))
        if cached is not None:
            self.placement.install(names, cached)
            self.profile_reused = True
            log.info("fog: profile reused from %s (--reprofile measures again)", self.profiles)
        else:
            with self.startup("rate probes"):
                rates = self._uplink_rates()
            with self.startup("profile"):
                time_all = partial(self._time_all, together=self._time_together())
                measured = self.placement.profile(names, time_all, rates)
            if self.profiles is not None:
                self.profiles.save(key, measured)
        with self.startup("plan"):
            membership = self.placement.initial()
            self.version = self.cluster.apply(membership)
        return membership

    def _profile_key(self) -> str:
        """What the start-up profile depends on: graph, model, nodes and testbed."""
        testbed = {"shaped": self.shaped, "quotas": self.quotas_on, "seed": self.seed}
        nodes = [*self.nodes, testbed]
        return profile_key(self.indptr, self.indices, self.model, nodes)

    def _host(self, fog: int) -> str:
        """Where fog ``fog`` receives uploads: its machine's address on real hosts, its link's
        host side on the testbed, else loopback."""
        if self.hosts is not None or self.gateways:
            return self.addresses[fog]
        link = self.links[fog]  # the cloud (one fog) has one link, shared by every group
        return link.host_ip if link is not None else "127.0.0.1"

    def _regions(self) -> list[tuple[int, np.ndarray, int]]:
        groups = len(self.nodes) if self.mode == "cloud" else None
        return regions(self.membership, self.world, groups)

    def _start_groups(self) -> None:
        """Tell every fog which groups upload which rows, then start (or re-aim) the device
        groups (none with gateways: :meth:`gateway_plan` says what they upload, where)."""
        where = self._regions()
        expected: list[dict[int, tuple[int, int]]] = [{} for _ in range(self.world)]
        for group, (fog, vertices, offset) in enumerate(where):
            expected[fog][group] = (offset, int(vertices.size))
        self.cluster.expect_uploads(expected)
        if self.gateways:
            return
        if self.fleet is not None:  # a re-placement
            self.fleet.replace(where)
            return
        links = [self.links[fog] for fog, _, _ in where]
        hosts = [self._host(fog) for fog, _, _ in where]
        self.fleet = DeviceFleet(
            where, hosts, self.ports, links, self.bits, self.chunks, self.wire_codec
        )

    # ------------------------------------------------------------------ serving

    def gateway_plan(self) -> list[dict[str, Any]]:
        """Per device group, what a gateway uploads: ``group`` (its number on the wire),
        ``fog``, ``to`` (HOST:PORT of its receiver), ``vertices`` (int64, ascending: the rows
        of its readings), ``offset`` (fog row of the first), ``bits`` (per-row widths, or
        None: raw) and ``codec`` (what the widths are for: ``gnnserve fog upload --codec``)."""
        return [
            {
                "group": group,
                "fog": fog,
                "to": f"{self._host(fog)}:{self.ports[fog]}",
                "vertices": vertices,
                "offset": offset,
                "bits": None if self.bits is None else self.bits[vertices],
                "codec": self.wire_codec,
            }
            for group, (fog, vertices, offset) in enumerate(self._regions())
        ]

    def round(self, readings: np.ndarray | None = None) -> RoundReport:
        """One round on ``readings`` (float32 [N, F]; None: the last ones again); in fograph
        mode the scheduler then decides on this round's times (``report.decision``). With
        gateways, readings must be None: the round waits for the next round's uploads."""
        if readings is not None and self.gateways:
            raise InvalidInputError("with gateways the readings come from the gateways", "readings")
        if readings is not None:
            self.features[:] = readings
        report = self._collect_and_run()
        self._check_prediction(report.latency_ms)
        if self.adaptive:
            report.decision = self._adapt(report)
        return report

    def gateway_round(self, wait_s: float = 1.0) -> RoundReport | None:
        """With gateways: the next round once its uploads have reached every fog (waiting up to
        ``wait_s``), else None and nothing changed (call again). A fog never enters a round's
        collectives before the others have their uploads."""
        if not self.gateways:
            raise InvalidInputError("gateway_round needs gateways=True", "gateways")
        if not self.cluster.arrived(self._round + 1, wait_s):
            return None
        report = self._collect_and_run()
        self._check_prediction(report.latency_ms)
        return report

    def _collect_and_run(self) -> RoundReport:
        self._round += 1
        start = time.perf_counter()
        if self.fleet is not None:
            self.fleet.start_round(self._round, self.features)
        result: ClusterRound = self.cluster.run(self._round)
        latency = (time.perf_counter() - start) * 1e3
        sent = self.fleet.finish_round() if self.fleet is not None else 0  # gateways: unknown
        return RoundReport(
            result.logits,
            latency,
            [n.compute_ms for n in result.nodes],
            [n.collect_ms for n in result.nodes],
            sent,
            self.features.nbytes,
            result.plan_version,
            result.embedding,
        )

    def _check_prediction(self, latency_ms: float) -> None:
        """Warn (once per plan) when a round takes ``SLOW_ROUND`` x the plan's prediction."""
        predicted = None if self.mode == "cloud" else self.placement.predicted_round_ms
        if predicted is None or latency_ms < SLOW_ROUND * predicted:
            return
        self.slow_rounds += 1
        if self._warned_plan != self.version:
            self._warned_plan = self.version
            log.warning(
                "fog round took %.0f ms, %.1fx the %.0f ms the start-up plan predicted: the "
                "nodes or links are slower than profiled (background load, a weaker link)%s",
                latency_ms,
                latency_ms / predicted,
                predicted,
                "; the scheduler adapts" if self.adaptive else "",
            )

    def _adapt(self, report: RoundReport) -> Decision:
        """Algorithm 2 on this round's compute times; a changed placement is installed before
        the next round (new partitions, new device groups)."""
        times = np.asarray(report.node_ms)
        decision = schedule(
            self.adjacency,
            self.membership,
            times,
            self._replan,
            self.slack,
            self.skew_threshold,
            self.min_excess_ms,
            work=self.work,
            previous=self._over,
        )
        self._over = decision.over if decision.over is not None else self._over
        if decision.mode != "keep" and decision.moved.size:
            self.membership = decision.membership
            self.version = self.cluster.apply(self.membership)
            self._start_groups()
            log.info(
                "scheduler: %s moved %d vertices (plan %d)",
                decision.mode,
                decision.moved.size,
                self.version,
            )
        return decision

    def _replan(self, times: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """IEP with every node's model rescaled by this round's load factor."""
        return self.placement.replan(self.membership, times)

    def set_cores(self, node: int, cores: float) -> None:
        """Change node ``node``'s CPU quota (a background-load change) at once."""
        quota = self.quotas[node]
        if quota is None:
            raise InvalidInputError(f"node {node} has no CPU quota on this testbed", "node")
        quota.set_cores(cores)

    def close(self) -> None:
        """Stop device groups, the cluster, quotas and links."""
        fleet: DeviceFleet | None = getattr(self, "fleet", None)
        if fleet is not None:
            fleet.close()
        if hasattr(self, "cluster"):
            self.cluster.close()
        for quota in getattr(self, "quotas", []):
            if quota is not None:
                quota.close()
        for link in getattr(self, "links", []):
            if link is not None:
                link.close()
        fabric: FogFabric | None = getattr(self, "fabric", None)
        if fabric is not None:
            fabric.close()
        slot: Slot | None = getattr(self, "slot", None)
        if slot is not None:
            slot.release()

    def __enter__(self) -> FogService:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
