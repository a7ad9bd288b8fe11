"""``serve --workers N``: N server processes answering on one port, one store in the page cache.

The supervisor (the ``gnnserve serve`` process) binds the port once and starts N workers, each
a ``gnnserve serve`` of the same flags that accepts on the inherited socket (the kernel spreads
connections over them, as gunicorn's workers share theirs). Each worker loads its own engine
and model; the graph and features are memory-mapped, so the page cache holds one copy of the
store for all of them. Each worker also listens on a private loopback port of its own, through
which any worker reads its peers:

- ``GET /metrics`` answers every worker's samples, each with a ``worker`` label (``?local=1``:
  this worker's only);
- ``GET /v2/health/ready`` is 200 only when every worker is ready (``?local=1``: this one).

SIGTERM or SIGINT to the supervisor reaches every worker, each drains its admitted requests,
and the supervisor exits 0 when they all did. A worker that dies is started again in its slot
(not after a start-up refusal: exit code 2 stops the others and is the supervisor's code).
With ``--update-log`` the workers share one log (``dynamic.shared_log``): the supervisor holds
its writer lock, whichever worker receives a batch appends it under the append lock once it has
applied the others' batches, and every worker applies every batch by offset; a request's
``min_version`` (the seq or graph_version a write returned) reads it from any worker. The local
deployment only: feature servers and the other deployments are refused with the reason.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass

import httpx
from prometheus_client.core import Metric
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector, CollectorRegistry

from gnnserve.config import ServeConfig
from gnnserve.dynamic.shared_log import SHARED_LOG_ENV, hold_writer_lock
from gnnserve.errors import InvalidInputError
from gnnserve.ports import free_port
from gnnserve.urls import local_path

log = logging.getLogger(__name__)

SLOT_ENV = "GNNSERVE_WORKER_SLOT"  # "<index>/<count>" in a worker's environment
FD_ENV = "GNNSERVE_WORKER_FD"  # the inherited listening socket
PEERS_ENV = "GNNSERVE_WORKER_PEERS"  # private ports of every worker, in slot order
PEER_TIMEOUT_S = 2.0
MAX_RESTARTS = 5  # per slot: a worker that keeps dying is not restarted for ever


@dataclass(frozen=True)
class WorkerSlot:
    """What a worker process knows of its place: index, count, socket, peers' private ports."""

    index: int
    count: int
    listen_fd: int
    peers: tuple[int, ...]

    @property
    def private_port(self) -> int:
        """This worker's own loopback port."""
        return self.peers[self.index]

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> WorkerSlot | None:
        """The slot the supervisor gave this process; None outside a worker."""
        env = dict(os.environ) if env is None else env
        if SLOT_ENV not in env:
            return None
        index, count = (int(v) for v in env[SLOT_ENV].split("/"))
        peers = tuple(int(p) for p in env[PEERS_ENV].split(","))
        return cls(index, count, int(env[FD_ENV]), peers)

    def sockets(self) -> list[socket.socket]:
        """The shared listening socket and this worker's private one (bound here)."""
        shared = socket.socket(fileno=self.listen_fd)
        private = socket.socket()
        private.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        private.bind(("127.0.0.1", self.private_port))
        return [shared, private]


def check_workers(config: ServeConfig) -> ServeConfig:
    """The config each worker serves; InvalidInputError naming why several cannot."""
    s = config.server
    if s.workers == 1:
        return config
    reasons = [
        (config.deploy.mode != "local", "deploy.mode", f"the {config.deploy.mode} deployment runs"
         " its own workers behind one front process"),
        (bool(config.store.feature_servers), "store.feature_servers", "feature servers are Ray "
         "actors of one front process"),
        (s.port == 0, "server.port", "the workers share one port: give --port"),
    ]  # fmt: skip
    for refused, field, why in reasons:
        if refused:
            raise InvalidInputError(f"--workers {s.workers}: {why}", field)
    shared = config.model_copy(deep=True)
    for field in ("graph_backend", "feature_backend"):  # one copy in the page cache, not N
        if getattr(shared.store, field) == "memory":
            setattr(shared.store, field, "mmap")
    return shared


def _listen(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


class Supervisor:
    """Starts the workers on one socket, restarts those that die, stops them on a signal."""

    def __init__(self, argv: Sequence[str], config: ServeConfig) -> None:
        self.argv = [sys.executable, "-m", "gnnserve.cli", *argv]
        self.count = config.server.workers
        self.sock = _listen(config.server.host, config.server.port)
        ports: list[int] = []
        while len(ports) < self.count:
            if (port := free_port()) not in ports and port != config.server.port:
                ports.append(port)
        self.peers = ",".join(map(str, ports))
        self.procs: list[subprocess.Popen[bytes]] = []
        self.restarts = [0] * self.count
        self.stopping = False
        # the log's writer lock for the deployment's life: no other server or repair beside it
        log = config.store.update_log
        self.log_lock = None if not log else hold_writer_lock(local_path(log, "store.update_log"))

    def _start(self, index: int) -> subprocess.Popen[bytes]:
        env = {
            **os.environ,
            SLOT_ENV: f"{index}/{self.count}",
            FD_ENV: str(self.sock.fileno()),
            PEERS_ENV: self.peers,
            SHARED_LOG_ENV: "1" if self.log_lock is not None else "0",
        }
        return subprocess.Popen(self.argv, env=env, pass_fds=(self.sock.fileno(),))

    def run(self) -> int:
        """Serve until a signal; the exit code (0: every worker stopped cleanly)."""
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_signal)
        self.procs = [self._start(i) for i in range(self.count)]
        code = 0
        while True:
            alive = [p for p in self.procs if p.poll() is None]
            if not alive:
                break
            for i, proc in enumerate(self.procs):
                if proc.poll() is None or self.stopping:
                    continue
                code = self._on_exit(i, proc.returncode)
                if code:
                    self._stop_all()
            time.sleep(0.2)
        # a worker still starting when the signal came dies of it: nothing was accepted there
        clean = (0, -signal.SIGTERM, -signal.SIGINT)
        codes = [p.returncode for p in self.procs]
        self.sock.close()
        if self.log_lock is not None:
            os.close(self.log_lock)
        return code or (0 if all(c in clean for c in codes) else 1)

    def _on_exit(self, index: int, returncode: int) -> int:
        """A worker exited unasked: restart it, or give the exit code that stops them all."""
        if returncode == 2:
            log.error("worker %d refused to start (exit 2); stopping", index)
            return 2
        if self.restarts[index] >= MAX_RESTARTS:
            log.error("worker %d died %d times; stopping", index, MAX_RESTARTS + 1)
            return 1
        self.restarts[index] += 1
        log.warning("worker %d exited with %s; starting it again", index, returncode)
        self.procs[index] = self._start(index)
        return 0

    def _on_signal(self, signum: int, _frame: object) -> None:
        self.stopping = True
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signum)

    def _stop_all(self) -> None:
        self.stopping = True
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()


# peers -------------------------------------------------------------------------------------
async def peer_texts(slot: WorkerSlot, path: str) -> list[tuple[int, httpx.Response | None]]:
    """``GET path?local=1`` on every other worker's private port: (index, answer or None)."""

    async def one(client: httpx.AsyncClient, index: int) -> tuple[int, httpx.Response | None]:
        try:
            url = f"http://127.0.0.1:{slot.peers[index]}{path}"
            return index, await client.get(url, params={"local": "1"})
        except httpx.HTTPError:
            return index, None  # starting again, or gone

    others = [i for i in range(slot.count) if i != slot.index]
    async with httpx.AsyncClient(timeout=PEER_TIMEOUT_S) as client:
        return list(await asyncio.gather(*(one(client, i) for i in others)))


async def peers_ready(slot: WorkerSlot) -> bool:
    """Every other worker answers its own readiness with 200."""
    answers = await peer_texts(slot, "/v2/health/ready")
    return all(r is not None and r.status_code == 200 for _, r in answers)


async def all_metrics(slot: WorkerSlot, own: bytes) -> bytes:
    """Every worker's exposition merged, each sample labelled with its ``worker``."""
    texts = [(slot.index, own.decode())]
    for index, answer in await peer_texts(slot, "/metrics"):
        if answer is not None and answer.status_code == 200:
            texts.append((index, answer.text))
    return merge_expositions(texts)


class _Families(Collector):
    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> list[Metric]:  # type: ignore[override]
        return self.families


def merge_expositions(texts: list[tuple[int, str]]) -> bytes:
    """One exposition of several workers' (index, text): a family once, every sample with a
    ``worker`` label (sum over it for the server's totals)."""
    merged: dict[str, Metric] = {}
    for index, text in sorted(texts):
        for family in text_string_to_metric_families(text):
            into = merged.setdefault(
                family.name, Metric(family.name, family.documentation, family.type, family.unit)
            )
            for sample in family.samples:
                labels = {**sample.labels, "worker": str(index)}
                into.add_sample(sample.name, labels, sample.value, sample.timestamp)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(list(merged.values())))
    return generate_latest(registry)
