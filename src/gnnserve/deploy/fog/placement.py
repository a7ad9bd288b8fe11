"""What a fog deployment plans with, the metadata server's part of Fograph (§III-B, §III-C):
every node's profile, the bytes one vertex uploads, and the placements IEP makes from them.

:class:`FogPlacement` holds each node's :class:`~.planner.FogSpec` (its Eq. 3 latency model
and measured uplink) and compute ms per vertex; it makes the first plan and, for the adaptive
scheduler, re-plans on models rescaled by each node's load factor. Beyond Fograph, in fograph
mode the METIS parts are sized so that every node's upload + compute per part is equal (with
equal parts, as in the paper, no mapping can balance unequal nodes).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import numpy as np

from gnnserve.deploy.fog.planner import ExecutionPlan, FogSpec, metis_parts, plan
from gnnserve.deploy.fog.profile_cache import Profile
from gnnserve.deploy.fog.profiler import halo_sizes, profile_cluster, rows_sent
from gnnserve.deploy.fog.upload import PACKERS, codec_id

log = logging.getLogger(__name__)
CALIBRATION_SIZES = (0.05, 0.1, 0.2, 0.3)  # calibration subgraph sizes, shares of |V|
CALIBRATION_PER_SIZE = 4  # subgraphs per size (Fograph: 20; 4 keeps start-up short)


class FogPlacement:
    """Planning state of ``len(names)`` fog nodes on the graph ``indptr``/``indices`` (CSR of
    in-neighbours). ``features``: float32 [N, F] readings (their packed size is phi);
    ``bits``: per-vertex widths for ``codec`` (None: raw uploads); ``assign``: iep | greedy |
    random; ``weighted_parts``: size the parts by the nodes' times (else equal, as in Fograph)."""

    def __init__(
        self,
        indptr: np.ndarray,
        indices: np.ndarray,
        features: np.ndarray,
        bits: np.ndarray | None,
        layers: int,
        assign: str,
        weighted_parts: bool,
        seed: int = 0,
        codec: str = "daq",
    ) -> None:
        self.indptr, self.indices, self.features, self.bits = indptr, indices, features, bits
        self.codec = codec
        self.layers, self.assign, self.weighted, self.seed = layers, assign, weighted_parts, seed
        self.specs: list[FogSpec] = []
        self.vertex_ms = np.empty(0)  # each node's compute ms per vertex
        self.predicted_round_ms: float | None = None  # the start-up plan's round time
        # the boundary exchange: each layer's input width, and each node's fog link (bytes/s,
        # one-way ms) where links carry it (None: loopback, not predicted)
        self.widths: list[int] = []
        self.fog_links: list[tuple[float, float]] | None = None

    def profile(
        self,
        names: list[str],
        time_all: Callable[[np.ndarray], list[float]],
        uplinks: list[float],
    ) -> Profile:
        """Offline profile: ``time_all(vertices)`` times the model on that calibration subgraph
        on every node (Eq. 3 fit per node); ``uplinks``: each node's device uplink, bytes/s.
        Installs it and returns it (for the profile cache)."""
        n = self.indptr.size - 1
        rng = np.random.default_rng(self.seed)
        counts = [max(1, int(s * n)) for s in CALIBRATION_SIZES]
        models, vertex_ms = profile_cluster(
            time_all, self.indptr, self.indices, counts, rng, CALIBRATION_PER_SIZE
        )
        measured = Profile(models, [float(v) for v in vertex_ms], [float(r) for r in uplinks])
        self.install(names, measured)
        return measured

    def install(self, names: list[str], profile: Profile) -> None:
        """Plan with ``profile`` (measured now or reused from the cache)."""
        self.vertex_ms = np.asarray(profile.vertex_ms, float)
        for name, model, rate in zip(names, profile.models, profile.uplinks, strict=True):
            log.info(
                "fog %s: omega = %.2e |V| + %.2e |N| + %.2f ms; uplink %.1f Mbit/s",
                name,
                model.beta_v,
                model.beta_n,
                model.eps,
                rate * 8 / 1e6,
            )
        self.specs = [
            FogSpec(name, rate, model)
            for name, rate, model in zip(names, profile.uplinks, profile.models, strict=True)
        ]

    def phi(self) -> float:
        """Bytes one vertex uploads (Eq. 5's phi) as the devices send it: the codec measured on
        up to 2,000 rows, or raw float32."""
        if self.bits is None:
            return self.features.shape[1] * 4.0
        rng = np.random.default_rng(self.seed)
        rows = np.sort(rng.permutation(self.features.shape[0])[:2000])
        packer = PACKERS[codec_id(self.codec)]
        return len(packer(self.features[rows], self.bits[rows])) / rows.size

    def parts(self, phi: float) -> np.ndarray:
        """METIS parts for the mapping: sized so that every node's upload + compute per vertex
        (Eq. 8's ``phi / b_j`` and the profiled ms per vertex) sums to the same time when
        ``weighted_parts``; equal otherwise."""
        weights = None
        if self.weighted:
            upload_ms = np.array([phi / s.bandwidth * 1e3 for s in self.specs])
            weights = np.sort(1.0 / (self.vertex_ms + upload_ms))  # the mapping picks the node
        return metis_parts(self.indptr, self.indices, len(self.specs), self.seed, weights)

    def _plan(self) -> ExecutionPlan:
        """Algorithm 1 on the current specs: METIS parts sized by :meth:`parts`, then the
        mapping by ``assign``."""
        phi = self.phi()
        return plan(
            self.indptr,
            self.indices,
            self.specs,
            phi,
            self.layers,
            assign=self.assign,
            seed=self.seed,
            parts=self.parts(phi),
        )

    def exchange_ms(self, membership: np.ndarray) -> float:
        """ms of a round's boundary exchanges on ``membership``, which Eq. 8 leaves out: in
        each layer every node sends the rows other nodes hold as halo (the layer's input width
        x 4 bytes each) over its fog link, and the layer goes on once the slowest sender is
        done. 0 without fog links (loopback)."""
        if self.fog_links is None or not self.widths:
            return 0.0
        sent = rows_sent(self.indptr, self.indices, membership, len(self.fog_links))
        rate = np.array([r for r, _ in self.fog_links], float)
        delay = np.array([d for _, d in self.fog_links], float)
        return float(sum(np.max(sent * (4.0 * w) / rate * 1e3 + delay) for w in self.widths))

    def initial(self) -> np.ndarray:
        """Algorithm 1 on the profiled nodes: the membership (fog of each vertex). The
        predicted round adds the boundary exchange (:meth:`exchange_ms`) to Eq. 8's
        bottleneck of upload + compute."""
        placed = self._plan()
        exchange = self.exchange_ms(placed.membership)
        self.predicted_round_ms = placed.bottleneck_ms + exchange
        predicted = np.round(placed.predicted_ms, 1).tolist()
        log.info(
            "fog plan (%s): predicted %s ms upload + compute per node, %.1f ms of boundary "
            "exchange: a round of %.1f ms",
            self.assign,
            predicted,
            exchange,
            self.predicted_round_ms,
        )
        return placed.membership

    def replan(self, membership: np.ndarray, times: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """IEP with every node's model rescaled by its load factor in a round that took
        ``times`` ms per node on ``membership``: (new membership, predicted ms per node)."""
        world = len(self.specs)
        sizes = np.bincount(membership, minlength=world)
        halos = halo_sizes(self.indptr, self.indices, membership, world)
        self.specs = [
            FogSpec(
                s.name, s.bandwidth, s.model.observed(int(sizes[j]), int(halos[j]), float(times[j]))
            )
            for j, s in enumerate(self.specs)
        ]
        mean_size, mean_halo = sizes.mean(), halos.mean()
        self.vertex_ms = np.array(
            [max(float(s.model.predict(mean_size, mean_halo)), 1e-6) for s in self.specs]
        ) / max(mean_size, 1.0)
        placed = self._plan()
        return placed.membership, placed.predicted_ms
