"""Fog start-up profiles kept between runs: a restart with the same graph, model and nodes reuses
the measured latency models and uplink rates instead of timing calibration subgraphs and
probing links again (most of a fog start-up).

A profile is keyed by what it measured: the graph (a digest of its CSR), the model's
configuration and weights, and every node's spec (name, cores, links, host). It lives in
``<dir>/<key>.json`` (default directory ``$GNNSERVE_CACHE_DIR/fog``, else
``$XDG_CACHE_HOME/gnnserve/fog`` or ``~/.cache/gnnserve/fog``), written atomically; a file
that cannot be read is measured again.
``serve --reprofile`` measures anyway and replaces it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from dataclasses import asdict, dataclass, is_dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from gnnserve.deploy.fog.profiler import LatencyModel

log = logging.getLogger(__name__)


def default_dir() -> Path:
    """Where profiles are kept by default: under ``GNNSERVE_CACHE_DIR`` when it is set (the
    test suite's own directory, never the user's), else the user's cache directory."""
    if own := os.environ.get("GNNSERVE_CACHE_DIR"):
        return Path(own) / "fog"
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "gnnserve" / "fog"


@dataclass(frozen=True)
class Profile:
    """What start-up measured: each node's latency model, compute ms per vertex and uplink."""

    models: list[LatencyModel]
    vertex_ms: list[float]
    uplinks: list[float]  # bytes/s


def profile_key(
    indptr: np.ndarray, indices: np.ndarray, model: torch.nn.Module, specs: list[Any]
) -> str:
    """A digest of the graph, the model (configuration and weights) and ``specs`` (the nodes'
    dataclasses and any JSON-able settings the measurement depends on)."""
    digest = hashlib.sha256()
    for array in (indptr, indices):
        digest.update(np.ascontiguousarray(array).tobytes())
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    plain = [asdict(s) if is_dataclass(s) and not isinstance(s, type) else s for s in specs]
    digest.update(json.dumps(plain, sort_keys=True).encode())
    return digest.hexdigest()[:32]


class ProfileCache:
    """Profiles under ``directory`` (see the module doc)."""

    def __init__(self, directory: str | Path | None = None) -> None:
        self.directory = Path(directory) if directory is not None else default_dir()

    def __str__(self) -> str:
        return str(self.directory)

    def load(self, key: str, nodes: int) -> Profile | None:
        """The profile stored under ``key`` for ``nodes`` nodes, or None (absent, unreadable)."""
        path = self.directory / f"{key}.json"
        try:
            raw: dict[str, Any] = json.loads(path.read_text())
            profile = Profile(
                [LatencyModel(**m) for m in raw["models"]],
                [float(v) for v in raw["vertex_ms"]],
                [float(v) for v in raw["uplinks"]],
            )
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("fog profile %s unreadable (%s): measuring again", path, exc)
            return None
        if not len(profile.models) == len(profile.vertex_ms) == len(profile.uplinks) == nodes:
            log.warning("fog profile %s is for another node count: measuring again", path)
            return None
        return profile

    def save(self, key: str, profile: Profile) -> Path:
        """Store ``profile`` under ``key`` (atomically: a reader sees the old file or the new)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.directory / f"{key}.json"
        body = {
            "models": [asdict(m) for m in profile.models],
            "vertex_ms": profile.vertex_ms,
            "uplinks": profile.uplinks,
        }
        fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=f".{key}-", suffix=".json")
        with os.fdopen(fd, "w") as out:
            json.dump(body, out)
        os.replace(tmp, path)
        return path
