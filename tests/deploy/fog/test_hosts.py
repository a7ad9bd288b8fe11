"""Fog nodes on real machines: a two-node Ray cluster (two ``ray start`` processes on 127.0.0.1
and 127.0.0.2, tests/ray_cluster.py); each fog named by ``host`` runs on that node, the gloo
rendezvous and the upload receivers use the nodes' own addresses, and a round equals plain
full-graph inference. The driver runs in its own process (a pytest process holds a local Ray).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from gnnserve.deploy.fog.hosts import real_hosts
from gnnserve.deploy.fog.nodes import load_nodes
from gnnserve.deploy.fog.service import NodeSpec
from gnnserve.errors import InvalidInputError

ROOT = Path(__file__).resolve().parents[3]

DRIVER = """
import numpy as np, ray
ray.init()
from gnnserve.deploy.fog.hosts import ray_nodes_by_address
from gnnserve.deploy.fog.service import FogService, NodeSpec
from gnnserve.errors import InvalidInputError
from tests.deploy.fog.test_service import N, _model, _readings, _reference, sbm_graph
graph, model = sbm_graph(sys.argv[1]), _model()
head = next(a for a in ray_nodes_by_address() if a != "127.0.0.2")  # Ray may name it otherwise
nodes = [NodeSpec("far", None, "wifi", host="127.0.0.2"),
         NodeSpec("near", None, "wifi", host=head)]
with FogService(model, graph, _readings(1), nodes, "strawman") as svc:
    assert svc.addresses == ["127.0.0.2", head], svc.addresses  # where each actor runs
    assert svc.slot is None and all(link is None for link in svc.links)  # nothing emulated
    report = svc.round(_readings(2))
    np.testing.assert_allclose(report.logits, _reference(model, graph, _readings(2)), atol=1e-5)
    assert report.bytes_uploaded >= report.raw_bytes  # every reading crossed to its fog
try:
    unknown = NodeSpec("x", None, "wifi", host="127.0.0.9")
    FogService(model, graph, _readings(1), [nodes[0], unknown], "strawman")
    raise SystemExit("an unknown host was accepted")
except InvalidInputError as exc:
    assert "127.0.0.9" in str(exc) and "127.0.0.2" in str(exc), exc
print("FOG-HOSTS-OK")
"""


@pytest.mark.slow
@pytest.mark.distributed
def test_fogs_on_two_ray_nodes_answer_exactly(two_nodes: dict[str, str], tmp_path: Path) -> None:
    script = tmp_path / "driver.py"
    script.write_text("import sys\n" + DRIVER)
    env = two_nodes | {"PYTHONPATH": str(ROOT)}
    run = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "store")],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert "FOG-HOSTS-OK" in run.stdout, run.stdout[-3000:] + run.stderr[-5000:]


def test_hosts_are_all_or_none_and_never_with_cores(tmp_path: Path) -> None:
    assert real_hosts([NodeSpec("a", 0.5, "wifi"), NodeSpec("b", None, "4g")]) is None
    hosted = [NodeSpec("a", None, "wifi", host="10.0.0.1"), NodeSpec("b", None, "4g", "lan", "h")]
    assert real_hosts(hosted) == ["10.0.0.1", "h"]
    with pytest.raises(InvalidInputError, match=r"\['b'\] have no host"):
        real_hosts([hosted[0], NodeSpec("b", None, "4g")])
    with pytest.raises(InvalidInputError, match=r"\['a'\] set cores and a host"):
        real_hosts([NodeSpec("a", 0.5, "wifi", host="10.0.0.1"), hosted[1]])
    path = tmp_path / "nodes.yaml"
    path.write_text("nodes:\n  - {name: g1, host: 10.0.0.11}\n  - {name: g2, host: 10.0.0.12}\n")
    assert [n.host for n in load_nodes(path)] == ["10.0.0.11", "10.0.0.12"]
    path.write_text("nodes:\n  - {name: g1, host: 'a b'}\n")
    with pytest.raises(InvalidInputError, match="host"):
        load_nodes(path)
