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


def test_a_local_instance_starts_with_token_auth_and_no_notice() -> None:
    """Ray's "Token authentication is enabled" notice, printed on every start of a local
    cluster, is not printed, and token auth stays on (Ray's default for a local cluster)."""
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_AUTH_MODE")}
    proc = subprocess.run(
        [sys.executable, "-c", _START_AND_STOP], env=env, capture_output=True, text=True,
        timeout=180,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["True", "token", "True"]
    assert "Token authentication" not in proc.stderr, proc.stderr[-3000:]
