"""The gloo rendezvous of Ray actors: rank 0 holds the port it reports from the moment it
reports it (no pick-then-bind race), and a group whose rank 0 runs on a second Ray node (on
127.0.0.2, tests/ray_cluster.py) forms over that node's address."""

from __future__ import annotations

import errno
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from gnnserve.deploy.rendezvous import GroupRendezvous

ROOT = Path(__file__).resolve().parents[2]


def test_the_reported_port_is_already_bound_and_serves_the_store() -> None:
    host = GroupRendezvous(0, 2)
    address, port = host.host(timeout_s=10)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as other:
        with pytest.raises(OSError) as exc:
            other.bind((address, port))
        assert exc.value.errno == errno.EADDRINUSE
    client = GroupRendezvous(1, 2).store(address, port, timeout_s=10)
    client.set("k", "v")
    assert host.store(address, port).get("k") == b"v"


def test_only_rank_zero_hosts_and_it_hosts_before_joining() -> None:
    with pytest.raises(RuntimeError, match="rank 1 cannot host"):
        GroupRendezvous(1, 2).host()
    with pytest.raises(RuntimeError, match="must host the rendezvous before"):
        GroupRendezvous(0, 2).store("127.0.0.1", 1)


DRIVER = """
import ray, torch, torch.distributed as dist
from gnnserve.deploy.rendezvous import GroupRendezvous, node_address
ray.init()

@ray.remote(num_cpus=0)
class Rank:
    def __init__(self, rank, world):
        self.group, self.rank = GroupRendezvous(rank, world), rank
    def host(self):
        return self.group.host(60)
    def join(self, address, port):
        self.group.join(address, port, 60)
        total = torch.tensor([float(self.rank + 1)])
        dist.all_reduce(total)
        return node_address(), float(total)

ranks = [Rank.options(resources={"far": 1}).remote(0, 3)] + [Rank.remote(r, 3) for r in (1, 2)]
address, port = ray.get(ranks[0].host.remote())
assert address == "127.0.0.2", address  # rank 0 runs on the second node
out = ray.get([r.join.remote(address, port) for r in ranks])
assert all(total == 6.0 for _, total in out), out
print("RENDEZVOUS-OK", sorted({a for a, _ in out}))
"""


@pytest.mark.slow
@pytest.mark.distributed
def test_a_group_forms_around_rank_zero_on_a_second_node(
    two_nodes: dict[str, str], tmp_path: Path
) -> None:
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    run = subprocess.run(
        [sys.executable, str(script)], env=two_nodes | {"PYTHONPATH": str(ROOT / "src")},
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert "RENDEZVOUS-OK" in run.stdout, run.stdout[-3000:] + run.stderr[-5000:]
