"""The fog nodes file (``serve --deploy fog --nodes nodes.yaml``)::

nodes:
  - {name: weak, cores: 0.15, link: 4g}     # cores: CPU quota (omit: unthrottled)
  - {name: strong, cores: 0.6, link: 5g}    # link: 4g | 5g | wifi (the devices' uplink)
  - {name: edge, link: wifi, fog_link: wifi} # fog_link: lan (default) | wifi | 5g | 4g

On real machines every node names its ``host`` instead (a Ray node's address in the cluster of
``RAY_ADDRESS``) and no ``cores``: its actor runs there, at that machine's speed, over the real
network (no emulated links)::

nodes:
  - {name: gate1, host: 10.0.0.11}
  - {name: gate2, host: 10.0.0.12}
"""

from __future__ import annotations

from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gnnserve.deploy.fog.links import FOG_LINKS, PRESETS
from gnnserve.deploy.fog.service import NodeSpec
from gnnserve.errors import InvalidInputError

MAX_NODES = 24  # fog nodes per deployment (each has a device link in its testbed slot)


class _Node(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
    cores: float | None = Field(None, ge=0.01, le=1024)
    link: str = "wifi"
    fog_link: str = "lan"
    host: str | None = Field(None, pattern=r"^[0-9A-Za-z.:-]{1,255}$")  # a Ray node's address


class _File(BaseModel):
    model_config = ConfigDict(extra="forbid")
    nodes: list[_Node] = Field(min_length=1, max_length=MAX_NODES)


def load_nodes(path: str | Path) -> list[NodeSpec]:
    """The nodes of ``path``; InvalidInputError (field ``deploy.nodes``) naming what is wrong."""
    try:
        raw = yaml.safe_load(Path(path).read_text())
        parsed = _File.model_validate(raw)
    except (OSError, yaml.YAMLError) as exc:
        raise InvalidInputError(
            f"cannot read fog nodes file {path}: {exc}", "deploy.nodes"
        ) from exc
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise InvalidInputError(
            f"fog nodes file {path}: {where}: {first['msg']}", "deploy.nodes"
        ) from exc
    names = [n.name for n in parsed.nodes]
    if len(set(names)) != len(names):
        raise InvalidInputError(f"fog nodes file {path}: node names repeat", "deploy.nodes")
    for node in parsed.nodes:
        for field, value, known in (
            ("link", node.link, PRESETS),
            ("fog_link", node.fog_link, FOG_LINKS),
        ):
            if value not in known:
                raise InvalidInputError(
                    f"fog nodes file {path}: node {node.name}: {field} must be one of "
                    f"{sorted(known)}, got {value!r}",
                    "deploy.nodes",
                )
    return [NodeSpec(n.name, n.cores, n.link, n.fog_link, n.host) for n in parsed.nodes]
