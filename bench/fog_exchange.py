"""The fog boundary exchange two ways, on the same payloads: a gloo ``all_to_all_single`` (what
:class:`gnnserve.deploy.fog.node.FogNode` runs) against Ray object transfer (each fog hands its
rows for each other fog to that fog's actor, which waits until every sender's rows are in).

Payloads are the real ones of a 4-fog METIS placement of the graph: fog j sends each other fog
the rows of its halo owned by j, ``dim`` float32 values a row. Both run on loopback in the same
actors (no CPU quota, no shaped fabric: Ray's same-machine transfer goes through shared memory,
which no namespace can shape), interleaved round by round; a figure is the mean ms of one
exchange over ``repeats`` exchanges, the slowest fog's.
"""

from __future__ import annotations

import itertools
import threading
import time
from typing import Any

import numpy as np
import ray
import torch
import torch.distributed as dist

from common import median_range
from fog_data import BenchGraph
from gnnserve.deploy.fog.partition import build_fog_partitions
from gnnserve.deploy.fog.planner import metis_parts
from gnnserve.deploy.rendezvous import GroupRendezvous


@ray.remote(num_cpus=0, max_concurrency=2)
class Peer:
    """One fog's side of both exchanges; ``send_counts[r]``/``recv_counts[r]``: rows to/from r."""

    def __init__(self, rank: int, world: int, send_counts: list[int], recv_counts: list[int]):
        torch.set_num_threads(1)
        self.rank, self.world = rank, world
        self.group = GroupRendezvous(rank, world)
        self.send_counts, self.recv_counts = send_counts, recv_counts
        self.inbox: dict[tuple[int, int], np.ndarray] = {}
        self.ready = threading.Condition()
        self.steps = itertools.count()

    def host(self) -> tuple[str, int]:
        return self.group.host()

    def connect(self, address: str, port: int, peers: list[Any]) -> None:
        self.peers = peers
        self.group.join(address, port)

    def deliver(self, step: int, sender: int, rows: np.ndarray) -> None:
        with self.ready:
            self.inbox[(step, sender)] = rows
            self.ready.notify_all()

    def _gloo(self, send: torch.Tensor, dim: int) -> torch.Tensor:
        out = torch.empty((sum(self.recv_counts), dim))
        dist.all_to_all_single(out, send, self.recv_counts, self.send_counts)
        return out

    def _ray(self, send: torch.Tensor, dim: int) -> torch.Tensor:
        step = next(self.steps)
        blocks = torch.split(send, self.send_counts)
        for r, block in enumerate(blocks):
            if r != self.rank and self.send_counts[r]:
                self.peers[r].deliver.remote(step, self.rank, block.numpy())
        senders = [s for s in range(self.world) if s != self.rank and self.recv_counts[s]]
        with self.ready:
            self.ready.wait_for(lambda: all((step, s) in self.inbox for s in senders), 60)
            got = {s: self.inbox.pop((step, s)) for s in senders}
        parts = [
            torch.from_numpy(got[s]) if s in got else blocks[s] if s == self.rank else None
            for s in range(self.world)
        ]
        return torch.cat([p for p in parts if p is not None and p.shape[0]])

    def timed(self, how: str, dim: int, repeats: int) -> float:
        """Mean ms of one exchange of ``dim``-wide rows by ``how`` (gloo | ray)."""
        send = torch.randn((sum(self.send_counts), dim))
        swap = self._gloo if how == "gloo" else self._ray
        swap(send, dim)  # warm-up
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(repeats):
            swap(send, dim)
        return (time.perf_counter() - t0) * 1e3 / repeats


def run_exchange(
    bench: BenchGraph, dims: tuple[int, ...] = (16, 64, 256), rounds: int = 5, repeats: int = 20
) -> dict[str, Any]:
    """gloo vs Ray per exchange on ``bench``'s 4-fog METIS placement, for each row width."""
    indptr, indices = bench.graph.csr()
    world = 4
    member = metis_parts(indptr, indices, world)
    degree = np.asarray(bench.graph.gcn_degree(np.arange(bench.graph.num_nodes)), np.float32)
    parts = build_fog_partitions(indptr, indices, member, world, degree)
    sends = [[int(r.size) for r in p.send_rows] for p in parts]
    peers = [Peer.remote(j, world, sends[j], list(parts[j].halo_counts)) for j in range(world)]
    address, port = ray.get(peers[0].host.remote())
    ray.get([p.connect.remote(address, port, peers) for p in peers])
    rows_out = sum(sum(s) - s[j] for j, s in enumerate(sends))
    out: dict[str, Any] = {"graph": bench.name, "fogs": world, "rows_exchanged": rows_out}
    for dim in dims:
        ms: dict[str, list[float]] = {"gloo": [], "ray": []}
        for r in range(rounds):
            for how in ("gloo", "ray") if r % 2 == 0 else ("ray", "gloo"):
                ms[how].append(max(ray.get([p.timed.remote(how, dim, repeats) for p in peers])))
        ratio = [a / b for a, b in zip(ms["ray"], ms["gloo"], strict=True)]
        out[str(dim)] = {
            "bytes_per_exchange": rows_out * dim * 4,
            "gloo_ms": median_range(ms["gloo"]),
            "ray_ms": median_range(ms["ray"]),
            "ray_over_gloo": median_range(ratio),
        }
        print(
            f"[fog] exchange dim {dim} ({rows_out * dim * 4 / 1e6:.2f} MB): gloo "
            f"{np.median(ms['gloo']):.2f} ms, ray {np.median(ms['ray']):.2f} ms",
            flush=True,
        )
    for p in peers:
        ray.kill(p)
    return out
