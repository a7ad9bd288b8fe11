"""Options and results of a new-node run (see :mod:`gnnserve.newnodes.inference`).

One check per option (:func:`check_seed`, :func:`check_ns_fanouts`; mode, gamma and policy are
checked next to their registries), used both at admission (``engine.requests``) and by the
public entry points that take raw options (:func:`check_run_options`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np
import torch

from gnnserve.errors import InvalidInputError, echo
from gnnserve.fanouts import check_fanouts
from gnnserve.newnodes.policies import SEED_MAX, SEED_MIN, check_gamma, check_policy
from gnnserve.types import RequestOptions

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
class Traffic:
    """What the CGP workers exchanged to answer one request (``deploy.cgp``), in bytes."""

    bytes_sent: int  # bytes the workers sent each other (request payload excluded), all workers
    bytes_by: dict[str, int]  # bytes_sent per step ("candidates", "layer 1 partials", ...)
    plain_bytes: int  # bytes one worker (0) would fetch to build the same SRPE graph itself
    plain_by: dict[str, int]  # by kind: feature rows (dense or sparse), PE rows, adjacency;
    # "feature rows if dense" (float32) for comparison, not part of plain_bytes
    request_bytes: int  # payload the master sent the workers (features and edge ids)
    worker_ms: list[float]  # wall time of each worker's part, milliseconds


@dataclass
class NewNodeResult:
    """Predictions for the new nodes of one request, in request order (``traffic``: set when
    CGP workers computed them)."""

    logits: torch.Tensor  # float32 [m, C]: layer-k output of every new node
    embedding: torch.Tensor  # float32 [m, H]: layer-k input of every new node
    recomputed: np.ndarray  # int64 [s] existing ids whose PEs were recomputed (S), ascending
    num_candidates: int  # |R|
    mode: str  # the mode that produced it
    timings: NewNodeTimings = field(default_factory=NewNodeTimings)
    sizes: NewNodeSizes = field(default_factory=NewNodeSizes)
    traffic: Traffic | None = None


@dataclass(frozen=True)
class RunOptions:
    """Validated options of one run, the server's defaults filled in."""

    gamma: float
    policy: str
    fanouts: tuple[int, ...]
    seed: int


def check_seed(seed: object) -> int:
    """The seed as a Python int in [-2^63, 2^64); InvalidInputError naming ``seed`` otherwise.

    A seed is 64 bits: a negative one stands for its two's complement (-1 draws as 2^64 - 1,
    see :func:`gnnserve.sampling.sampler.seed_bits`)."""
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer):
        raise InvalidInputError(f"seed must be an int, got {echo(seed)}", "seed")
    if not SEED_MIN <= int(seed) <= SEED_MAX:
        raise InvalidInputError(
            f"seed must be a 64-bit integer in [{SEED_MIN}, {SEED_MAX}], got {echo(seed)}", "seed"
        )
    return int(seed)


def check_ns_fanouts(fanouts: object, num_layers: int) -> tuple[int, ...]:
    """Fanouts of mode ``ns``: :func:`default_fanouts` for None, else one per layer
    (:func:`gnnserve.fanouts.check_fanouts`)."""
    if fanouts is None:
        return default_fanouts(num_layers)
    return tuple(check_fanouts(fanouts, hops=num_layers))


def check_run_options(
    gamma: object, policy: object, fanouts: object, seed: object, num_layers: int
) -> RunOptions:
    """Validated options; InvalidInputError naming ``gamma``, ``policy``, ``fanouts`` or ``seed``.

    ``fanouts`` None means :func:`default_fanouts`; otherwise one int > 0 or -1 per layer.
    """
    g = check_gamma(gamma)
    p = check_policy(policy)
    fo = check_ns_fanouts(fanouts, num_layers)
    return RunOptions(g, p, fo, check_seed(seed))


def run_options(options: RequestOptions) -> tuple[str, RunOptions]:
    """(mode, options) of a validated new-node request (``engine.requests.validate_request``
    filled in every default): no check is repeated."""
    o = options
    if o.mode is None or o.gamma is None or o.policy is None or o.fanouts is None:
        raise ValueError(f"new-node options not validated at admission: {o}")
    return o.mode, RunOptions(o.gamma, o.policy, o.fanouts, o.seed or 0)
