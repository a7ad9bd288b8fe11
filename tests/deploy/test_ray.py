"""deploy/ray.py: a local Ray instance started for a deployment, quietly, with token auth."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.distributed

_START_AND_STOP = (
    "import os, ray\n"
    "from gnnserve.deploy.ray import start_ray, stop_ray\n"
    "started = start_ray(1)\n"
    "print(started, os.environ.get('RAY_AUTH_MODE'), ray.is_initialized())\n"
    "stop_ray(started)\n"
)


def _run(script: str) -> subprocess.CompletedProcess[str]:
    """``script`` in a fresh interpreter, outside any Ray cluster of the environment."""
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_AUTH_MODE")}
    proc = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=180
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def test_a_local_instance_starts_with_token_auth_and_no_notice() -> None:
    """Ray's "Token authentication is enabled" notice, printed on every start of a local
    cluster, is not printed, and token auth stays on (Ray's default for a local cluster)."""
    proc = _run(_START_AND_STOP)
    assert proc.stdout.split() == ["True", "token", "True"]
    assert "Token authentication" not in proc.stderr, proc.stderr[-3000:]


_EARLY_START = (
    "import os, signal, time, ray\n"
    "from gnnserve.deploy.ray import start_ray, start_ray_early, stop_ray\n"
    "got = []\n"
    "signal.signal(signal.SIGTERM, lambda *_: got.append('python'))\n"
    "start_ray_early(1)\n"
    "started = start_ray(1)\n"
    "time.sleep(2)  # the early-start thread's children must outlive its start\n"
    "value = ray.get(ray.remote(lambda: 41 + 1).remote(), timeout=60)\n"
    "os.kill(os.getpid(), signal.SIGTERM); time.sleep(0.2)\n"
    "print(started, value, got)\n"
    "stop_ray(started)\n"
)


def test_an_early_start_is_owned_by_start_ray_and_keeps_the_signal_handlers() -> None:
    """start_ray_early begins Ray in a thread; start_ray takes that instance over (True: the
    caller stops it), it keeps running after the start (tasks run), and SIGTERM still reaches
    the Python handler (not Ray's native one, which dumps a stack)."""
    proc = _run(_EARLY_START)
    assert proc.stdout.split("\n")[0] == "True 42 ['python']", proc.stdout
    assert "SIGTERM" not in proc.stderr, proc.stderr[-3000:]
