"""A real two-node Ray cluster on one machine: two ``ray start`` processes on different
loopback addresses (head 127.0.0.1, second node 127.0.0.2 offering resource ``far``), and the
environment a driver process joins it with. Shared by the multi-node tests (DGS, fog)."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

RAY = str(Path(sys.executable).with_name("ray"))


def _ray(*args: str, env: dict[str, str]) -> None:
    subprocess.run([RAY, *args], check=True, env=env, capture_output=True, timeout=120)


@pytest.fixture(scope="session")  # one cluster for every multi-node test
def two_nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """A head on 127.0.0.1 and a second node on 127.0.0.2 offering resource ``far``; the
    environment a driver joins it with."""
    temp = Path(tempfile_dir := f"/tmp/rdgs{os.getpid()}")  # short: Ray's socket paths
    env = os.environ | {"RAY_AUTH_MODE": "disabled"}  # a throwaway cluster on loopback
    port = str(20000 + os.getpid() % 20000)
    common = ["--disable-usage-stats", "--temp-dir", tempfile_dir, "--num-cpus", "2"]
    try:
        _ray("start", "--head", "--node-ip-address", "127.0.0.1", "--port", port,
             "--include-dashboard", "false", *common, env=env)  # fmt: skip
        _ray("start", "--address", f"127.0.0.1:{port}", "--node-ip-address", "127.0.0.2",
             "--resources", '{"far": 4}', *common, env=env)  # fmt: skip
        yield env | {"RAY_ADDRESS": f"127.0.0.1:{port}"}
    finally:
        _stop(tempfile_dir)
        shutil.rmtree(temp, ignore_errors=True)


def _stop(temp_dir: str) -> None:
    """Kill this cluster's processes only (``ray stop`` would stop every Ray on the machine,
    the test session's own included): those started with its temp dir, and their children."""
    procs = []
    for p in psutil.process_iter(["cmdline"]):
        if any(temp_dir in arg for arg in p.info["cmdline"] or []):
            procs.append(p)
            procs.extend(p.children(recursive=True))
    for p in procs:
        with contextlib.suppress(psutil.Error):
            p.kill()
    psutil.wait_procs(procs, timeout=30)
