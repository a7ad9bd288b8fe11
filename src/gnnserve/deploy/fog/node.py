"""One fog node of a BSP full-graph inference round (Fograph §III-E): a Ray actor's body.

Per layer the node computes its owned rows from ``owned ++ halo`` inputs, then swaps boundary
rows with the other fogs in one gloo ``all_to_all_single`` (every fog sends each other fog the
rows of its halo), which is also the layer's barrier. Layer 0's halo rows are the neighbours'
collected features, exchanged the same way.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.distributed as dist

from gnnserve.deploy.cgp.exchange import Exchange
from gnnserve.deploy.fog.links import entered
from gnnserve.deploy.fog.partition import FogPartition
from gnnserve.deploy.fog.receiver import Receiver
from gnnserve.deploy.rendezvous import GroupRendezvous, node_address
from gnnserve.errors import InvalidInputError
from gnnserve.models.zoo import GNN


@dataclass
class NodeRound:
    """What one fog node reports of one round."""

    rank: int
    logits: np.ndarray  # float32 [n_own, C]: its owned vertices' outputs, ascending ids
    embedding: np.ndarray  # float32 [n_own, H]: their last layer's input
    collect_ms: float  # waiting for this round's uploads (0 without a round id)
    compute_ms: float  # layer computation
    exchange_ms: float  # boundary exchange and barrier waits
    total_ms: float  # the whole round on this node, collection included
    bytes_sent: int  # boundary rows sent to other fogs
    vertices: int  # |V| of its partition
    halo: int  # |N_V| of its partition
    layer_ms: list[float] = field(default_factory=list)  # compute per layer


@dataclass(frozen=True)
class FabricSeat:
    """Where a fog node sits on a :class:`~.links.FogFabric`: its namespace, the interface gloo
    binds to there, and the one-way delay it adds per exchange (ms; 0 where netem delays)."""

    namespace: str
    ifname: str
    delay_ms: float


class FogNode:
    """Holds a :class:`FogPartition`, its vertices' latest features and the model; runs its
    part of each round. ``threads``: torch intra-op threads of the process."""

    def __init__(self, part: FogPartition, model: GNN, features: np.ndarray, threads: int = 1):
        torch.set_num_threads(max(1, int(threads)))
        self.comm = Exchange(part.rank, part.world)
        self._group = GroupRendezvous(part.rank, part.world)
        self.exchange_delay_s = 0.0
        self.load(part, model, features)

    def load(self, part: FogPartition, model: GNN | None, features: np.ndarray) -> int:
        """Take a new partition (a migration or re-plan), its features and, when given, a new
        model; between rounds only. Returns the number of owned vertices."""
        if features.shape[0] != part.owned.size:
            raise InvalidInputError(
                f"fog {part.rank}: {features.shape[0]} feature rows for {part.owned.size} vertices",
                "features",
            )
        self.part = part
        self._send = torch.from_numpy(np.concatenate(part.send_rows))  # rows for the others
        self._send_counts = [int(r.size) for r in part.send_rows]
        if model is not None:
            self.model = model.eval()
        # a copy: Ray hands large arrays over read-only, and uploads write into these rows
        self.features = torch.from_numpy(np.array(features, np.float32))
        return int(part.owned.size)

    def listen(self, host: str, strict: bool = True) -> int:
        """Receive device uploads on ``host`` (any free port, returned); which groups upload
        what comes with :meth:`expect_uploads`. ``strict``: a refused upload fails the round
        (the server's own device groups; gateways are only told)."""
        width = int(self.features.shape[1])
        self.receiver = Receiver(host, self._apply, width=width, strict=strict)
        return self.receiver.port

    def expect_uploads(self, groups: dict[int, tuple[int, int]]) -> None:
        """The device groups that upload to this fog: group -> (first row, rows), ranges within
        its owned vertices (a new placement: new ranges)."""
        owned = int(self.part.owned.size)
        for group, (first, rows) in groups.items():
            if first < 0 or rows < 0 or first + rows > owned:
                raise InvalidInputError(
                    f"fog {self.part.rank}: group {group}'s rows [{first}, {first + rows}) "
                    f"exceed its {owned} vertices",
                    "groups",
                )
        self.receiver.expect(groups)

    def _apply(self, start: int, values: np.ndarray) -> None:
        # the receiver's own gathered rows (writable, never reused): no copy needed
        self.features[start : start + values.shape[0]] = torch.from_numpy(values)

    def pid(self) -> int:
        """This node's process id (for its CPU quota)."""
        return os.getpid()

    def rendezvous(self, timeout_s: float = 60.0) -> tuple[str, int]:
        """Rank 0 only: host the group's rendezvous store on this node's routable address;
        returns (address, port)."""
        return self._group.host(timeout_s)

    def address(self) -> str:
        """The address of the machine (Ray node) this fog runs on."""
        return node_address()

    def connect(
        self, address: str, port: int, timeout_s: float = 60.0, fabric: FabricSeat | None = None
    ) -> int:
        """Join the gloo group rendezvousing at ``address:port`` (rank 0's node); returns the
        rank. Without a ``fabric`` seat gloo uses the interface of this node's address; with
        one, the group's sockets are opened in the seat's namespace (so the boundary exchange
        crosses its shaped link) and each exchange first waits the seat's delay."""
        self.exchange_delay_s = 0.0 if fabric is None else fabric.delay_ms / 1e3
        if fabric is None:
            return self._group.join(address, port, timeout_s)
        seat = entered(fabric.namespace)
        return self._group.join(address, port, timeout_s, inside=seat, ifname=fabric.ifname)

    def close(self) -> None:
        """Leave the process group."""
        if dist.is_initialized():
            dist.destroy_process_group()

    def collect(self, rows: np.ndarray, values: np.ndarray) -> int:
        """Store uploaded features: ``values`` [m, F] for local owned ``rows`` [m]."""
        index = torch.from_numpy(np.array(rows, np.int64))  # copies: Ray's arrays are read-only
        self.features[index] = torch.from_numpy(np.array(values, np.float32))
        return int(len(rows))

    def arrived(self, round_id: int, wait_s: float) -> bool:
        """Whether this fog holds every upload of round ``round_id`` (waits up to ``wait_s``)."""
        return self.receiver.arrived(round_id, wait_s)

    def run(self, round_id: int | None = None, wait_s: float = 120.0) -> NodeRound:
        """This fog's part of one round; every fog of the group must be called. With
        ``round_id``, first wait until that round's uploads have arrived (``collect_ms``)."""
        start = time.perf_counter()
        if round_id is not None:
            self.receiver.wait(round_id, wait_s)
        collected = time.perf_counter()
        self.comm.reset()
        part, exchange_s, layer_ms = self.part, 0.0, []
        h = self.features
        with torch.inference_mode():
            for index in range(self.model.config.num_layers):
                embedding = h  # the input of the last layer, once the loop ends
                t0 = time.perf_counter()
                halo = self._swap(h, f"layer{index}")
                t1 = time.perf_counter()
                h = self.model.layer_forward(index, torch.cat([h, halo]), part.block, part.degree)
                exchange_s += t1 - t0
                layer_ms.append((time.perf_counter() - t1) * 1e3)
        total = (time.perf_counter() - start) * 1e3
        return NodeRound(
            part.rank,
            h.numpy(),
            embedding.numpy(),
            collect_ms=(collected - start) * 1e3,
            compute_ms=float(sum(layer_ms)),
            exchange_ms=exchange_s * 1e3,
            total_ms=total,
            bytes_sent=self.comm.bytes_sent,
            vertices=int(part.owned.size),
            halo=int(part.halo.size),
            layer_ms=layer_ms,
        )

    def time_subgraph(self, part: FogPartition, features: np.ndarray, repeats: int = 1) -> float:
        """Mean ms of the model's layers over calibration subgraph ``part`` (its halo inputs
        given in ``features``, owned then halo rows; later layers' halo rows are zeros): the
        profiler's measurement, no exchange."""
        x = torch.from_numpy(np.array(features, np.float32))
        times = []
        with torch.inference_mode():
            for _ in range(max(1, repeats)):
                t0 = time.perf_counter()
                h = x
                for index in range(self.model.config.num_layers):
                    y = self.model.layer_forward(index, h, part.block, part.degree)
                    h = torch.cat([y, y.new_zeros((part.halo.size, y.shape[1]))])
                times.append((time.perf_counter() - t0) * 1e3)
        return float(np.mean(times))

    def _swap(self, h: torch.Tensor, tag: str) -> torch.Tensor:
        """Rows of this fog's halo, from their owners (grouped by owner rank)."""
        send = h.index_select(0, self._send)
        if self.exchange_delay_s:
            time.sleep(self.exchange_delay_s)  # the fabric's one-way delay (no netem here)
        return self.comm.all_to_all(send, self._send_counts, self.part.halo_counts, tag)
