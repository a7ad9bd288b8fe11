"""DGS on a two-node Ray cluster: workers on the second node read the log through the feed.

A real cluster of two ``ray start`` processes on different loopback addresses (127.0.0.1 head,
127.0.0.2 second node). The workers are placed on the second node (a resource only it offers);
the log, its feed actor and the checkpoints stay on the driver's node. A sampling worker is
killed mid-stream; its rebuilt copy must equal the reference pre-sampler, as in
``test_log_feed``. The driver runs in its own process (a pytest process holds a local Ray).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.distributed]
ROOT = Path(__file__).resolve().parents[3]

DRIVER = """
import os, signal, sys
import numpy as np, ray
from gnnserve.deploy.dgs import DGSService
from tests.deploy.dgs.test_dgs import Graph
from tests.deploy.dgs.test_log_feed import assert_reservoirs_equal, grow
ray.init()
head = ray.get_runtime_context().get_node_id()
g = Graph(800, 6000, [4, 3], seed=3)
svc = DGSService(g.indptr, g.indices, [4, 3], 2, 2, seed=3, checkpoint_every=2,
                 worker_options={"resources": {"far": 0.01}})
nodes = {ray.get(w.node.remote()) for w in svc._samplers}
assert head not in nodes and len(nodes) == 1, (head, nodes)
assert ray.get(svc._feed.node.remote()) == head  # the log is a file of the driver's node
for t in range(1, 5):
    grow(g, 2 if t == 3 else 0)
    svc.apply_events(*g.batch(200), add_nodes=2 if t == 3 else 0)
svc.checkpoints.flush()
os.kill(ray.get(svc._samplers[0].pid.remote()), signal.SIGKILL)
for t in range(5, 7):
    svc.apply_events(*g.batch(200))
assert svc.rebuilt == 1, svc.rebuilt
assert ray.get(svc._samplers[0].node.remote()) in nodes  # rebuilt where the resource is
assert_reservoirs_equal(svc, g)
for seeds in (np.arange(802), np.array([801])):
    got, want = svc.sample(seeds), g.ref.sample(seeds)
    np.testing.assert_array_equal(got.nodes, want.nodes)
svc.shutdown()
print("DGS-MULTINODE-OK")
"""


def test_dgs_workers_on_a_second_node_rebuild_and_equal_the_reference(
    two_nodes: dict[str, str], tmp_path: Path
) -> None:
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    env = two_nodes | {"PYTHONPATH": str(ROOT)}
    run = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300
    )
    assert "DGS-MULTINODE-OK" in run.stdout, run.stdout[-3000:] + run.stderr[-5000:]
