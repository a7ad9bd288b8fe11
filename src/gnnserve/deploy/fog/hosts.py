"""Fog nodes on real machines: each node named by ``host`` in nodes.yaml is a Ray node of the
cluster (``RAY_ADDRESS``), its actor pinned there with Ray's node affinity; the gloo rendezvous
and the upload receivers use that node's own routable address.

A host is the address Ray knows the node by (``ray start --node-ip-address``). Nodes without a
host run wherever Ray places them (one machine: the emulated testbed of ``testbed`` and
``links``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from gnnserve.errors import InvalidInputError

if TYPE_CHECKING:
    from gnnserve.deploy.fog.service import NodeSpec


def ray_nodes_by_address() -> dict[str, str]:
    """Alive Ray nodes of the connected cluster: address -> node id."""
    return {n["NodeManagerAddress"]: n["NodeID"] for n in ray.nodes() if n.get("Alive")}


def placement_options(hosts: list[str | None]) -> list[dict[str, Any]]:
    """Per fog node, the Ray actor options that pin it to its host's node ({} for no host);
    InvalidInputError naming a host no alive Ray node has, and the addresses that exist."""
    if not any(hosts):
        return [{} for _ in hosts]
    known = ray_nodes_by_address()
    options: list[dict[str, Any]] = []
    for host in hosts:
        if host is None:
            options.append({})
            continue
        if host not in known:
            raise InvalidInputError(
                f"fog node host {host} is not an alive Ray node of this cluster (its nodes: "
                f"{', '.join(sorted(known))}); start it with `ray start --address ... "
                f"--node-ip-address {host}`",
                "deploy.nodes",
            )
        options.append(
            {"scheduling_strategy": NodeAffinitySchedulingStrategy(known[host], soft=False)}
        )
    return options


def real_hosts(nodes: list[NodeSpec]) -> list[str | None] | None:
    """Each node's host when the deployment runs on real machines (None: emulated on this
    one); InvalidInputError when only some nodes name a host or a hosted node sets cores."""
    hosted = [n.host is not None for n in nodes]
    if not any(hosted):
        return None
    if not all(hosted):
        missing = [n.name for n in nodes if n.host is None]
        raise InvalidInputError(
            f"fog nodes {missing} have no host while others do: give every node a host "
            "(real machines) or none (emulated on this one)",
            "deploy.nodes",
        )
    throttled = [n.name for n in nodes if n.cores is not None]
    if throttled:
        raise InvalidInputError(
            f"fog nodes {throttled} set cores and a host: cores emulates a node's speed on one "
            "machine; a node on its own host runs at that machine's speed (the profiler "
            "measures it)",
            "deploy.nodes",
        )
    return [n.host for n in nodes]
