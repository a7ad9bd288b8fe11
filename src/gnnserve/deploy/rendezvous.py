"""The rendezvous of a gloo process group whose ranks are Ray actors, possibly on several
machines.

Rank 0 hosts the group's ``TCPStore`` on its Ray node's routable address and on a port the
kernel picks as it binds (port 0), then reports that port. Picking a "free" port first and
binding it later races with every other process on the host (a Ray worker's outgoing
connection can take it in between: ``EADDRINUSE``); binding port 0 cannot.

Usage, driver side::

    address, port = ray.get(actors[0].host_rendezvous.remote())
    ray.get([a.join.remote(address, port) for a in actors])

where each actor holds a :class:`GroupRendezvous` and forwards to it.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import subprocess
from collections.abc import Iterator
from datetime import timedelta

import ray
import torch.distributed as dist

__all__ = ["GroupRendezvous", "interface_of", "node_address", "set_env"]


def node_address() -> str:
    """The address of the Ray node this process runs on."""
    return str(ray.util.get_node_ip_address())


def interface_of(address: str) -> str | None:
    """The network interface whose IPv4 network holds ``address`` here (None: not found), for
    gloo's ``GLOO_SOCKET_IFNAME`` (127.0.0.2 is on ``lo``, whose network is 127.0.0.0/8)."""
    out = subprocess.run(
        ["ip", "-o", "-4", "addr", "show"], capture_output=True, text=True, timeout=10
    ).stdout
    wanted = ipaddress.ip_address(address)
    for line in out.splitlines():
        fields = line.split()
        if len(fields) >= 4 and wanted in ipaddress.ip_interface(fields[3]).network:
            return fields[1]
    return None


@contextlib.contextmanager
def set_env(name: str, value: str) -> Iterator[None]:
    """``os.environ[name] = value`` for the duration of the block."""
    old = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            del os.environ[name]
        else:
            os.environ[name] = old


class GroupRendezvous:
    """One rank's way into a gloo group of ``world`` ranks: rank 0 calls :meth:`host` (once,
    before any rank joins), then every rank calls :meth:`store` and initialises its group on
    it (:meth:`join` does both with gloo bound to this node's interface)."""

    def __init__(self, rank: int, world: int) -> None:
        self.rank, self.world = int(rank), int(world)
        self._hosted: dist.TCPStore | None = None

    def host(self, timeout_s: float = 60.0) -> tuple[str, int]:
        """Rank 0 only: open the store on this node's address; returns (address, port)."""
        if self.rank != 0:
            raise RuntimeError(f"rank {self.rank} cannot host the rendezvous: rank 0 does")
        address = node_address()
        self._hosted = dist.TCPStore(
            address,
            0,
            self.world,
            True,
            timeout=timedelta(seconds=timeout_s),
            wait_for_workers=False,
        )
        return address, int(self._hosted.port)

    def store(self, address: str, port: int, timeout_s: float = 60.0) -> dist.TCPStore:
        """The group's store: the hosted one on rank 0, a client of ``address:port`` elsewhere."""
        if self.rank == 0:
            if self._hosted is None:
                raise RuntimeError("rank 0 must host the rendezvous before joining it")
            return self._hosted
        return dist.TCPStore(address, port, self.world, False, timeout=timedelta(seconds=timeout_s))

    def join(
        self,
        address: str,
        port: int,
        timeout_s: float = 60.0,
        *,
        inside: contextlib.AbstractContextManager[object] | None = None,
        ifname: str | None = None,
    ) -> int:
        """Join the gloo group at ``address:port``; returns the rank. gloo binds ``ifname``, by
        default the interface of this node's address (when found); with ``inside`` (e.g. a
        network namespace entered) the group's sockets are opened within it. The store is
        reached from where the process stands before."""
        store = self.store(address, port, timeout_s)
        with contextlib.ExitStack() as stack:
            if inside is not None:
                stack.enter_context(inside)
            if ifname is None:
                ifname = interface_of(node_address())
            if ifname is not None:
                stack.enter_context(set_env("GLOO_SOCKET_IFNAME", ifname))
            dist.init_process_group(
                "gloo",
                store=store,
                rank=self.rank,
                world_size=self.world,
                timeout=timedelta(seconds=timeout_s),
            )
        return self.rank
