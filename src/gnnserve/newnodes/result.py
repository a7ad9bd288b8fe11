"""Options and results of a new-node request (see :mod:`gnnserve.newnodes.inference`)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np
import torch

from gnnserve.errors import InvalidInputError
from gnnserve.fanouts import check_fanouts
from gnnserve.newnodes.policies import POLICIES, check_gamma

DEFAULT_MODE = "srpe"
DEFAULT_GAMMA = 0.1


def default_fanouts(num_layers: int) -> tuple[int, ...]:
    """The ``ns`` fanouts when none are given: (25, 10) for 2 layers, (15, 10, 5) for 3."""
    known = {1: (25,), 2: (25, 10), 3: (15, 10, 5)}
    return known.get(num_layers, (10,) * num_layers)


@dataclass
class NewNodeTimings:
    """Where a new-node request spent its time, in milliseconds."""

    plan_ms: float = 0.0  # computation-graph construction (overlay patch, policy, blocks)
    fetch_ms: float = 0.0  # feature and PE gather
    compute_ms: float = 0.0  # model layers
    total_ms: float = 0.0  # whole ``run`` call

    def as_dict(self) -> dict[str, float]:
        """Plain dict for JSON responses."""
        return {k: round(float(v), 4) for k, v in asdict(self).items()}


@dataclass
class NewNodeSizes:
    """Size of the computation graph of a new-node request."""

    edges: list[int] = field(default_factory=list)  # edges per layer, layer 1 first
    input_rows: int = 0  # feature rows read by layer 1 (request rows included)
    pe_rows: int = 0  # precomputed-embedding rows read, all layers together
    computed: int = 0  # nodes computed at the hidden layers (|C| for srpe/pe, 0 otherwise)

    def as_dict(self) -> dict[str, object]:
        """Plain dict for JSON responses."""
        return asdict(self)


@dataclass
class NewNodeResult:
    """Predictions for the new nodes of one request, in request order."""

    logits: torch.Tensor  # float32 [m, C]: layer-k output of every new node
    embedding: torch.Tensor  # float32 [m, H]: layer-k input of every new node
    recomputed: np.ndarray  # int64 [s] existing ids whose PEs were recomputed (S), ascending
    num_candidates: int  # |R|
    mode: str  # the mode that produced it
    timings: NewNodeTimings = field(default_factory=NewNodeTimings)
    sizes: NewNodeSizes = field(default_factory=NewNodeSizes)


@dataclass(frozen=True)
class RunOptions:
    """Validated options of one ``run``."""

    gamma: float
    policy: str
    fanouts: tuple[int, ...]
    seed: int


def check_run_options(
    gamma: object, policy: object, fanouts: object, seed: object, num_layers: int
) -> RunOptions:
    """Validated options; InvalidInputError naming ``gamma``, ``policy``, ``fanouts`` or ``seed``.

    ``fanouts`` None means :func:`default_fanouts`; otherwise one int > 0 or -1 per layer.
    """
    g = check_gamma(gamma)
    if not isinstance(policy, str) or policy not in POLICIES.names():
        raise InvalidInputError(
            f"unknown policy {policy!r}; choose one of {POLICIES.names()}", "policy"
        )
    if fanouts is None:
        fo = default_fanouts(num_layers)
    else:
        fo = tuple(check_fanouts(fanouts, hops=num_layers))
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer):
        raise InvalidInputError(f"seed must be an int, got {seed!r}", "seed")
    return RunOptions(g, policy, fo, int(seed))
