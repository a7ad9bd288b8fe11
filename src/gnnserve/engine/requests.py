"""Requests: what a caller sends, validated once, at admission.

:func:`validate_request` turns raw fields (JSON values, lists, arrays, tensors) into a
:class:`~gnnserve.types.Request` with one small check per field; each raises InvalidInputError
(TooManyNodesError past a limit) naming its field. ``Engine.request`` runs it for both kinds of
request, and the HTTP routes go through it; after it the batcher, planner, sampler, feature store
and new-node inference trust the request. Library entry points that take raw input
(``NewNodeInference.run``, ``CGPService.run``) call the same per-field checks.

Fields: ``nodes`` (existing node ids) or ``new_nodes`` (features and edges), exactly one;
``output``; ``fanouts`` (:func:`gnnserve.fanouts.check_fanouts`, one per model layer); new nodes
only: ``mode``, ``gamma``, ``policy`` (the server's defaults filled in); ``seed`` (new nodes:
mode ns and the random policy, default 0; existing nodes: the sampler's draws, so the same seed
gives the same answer; unset: fresh draws); ``timeout_ms``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from gnnserve.config import EmbeddingsConfig
from gnnserve.errors import InvalidInputError, TooManyNodesError, echo
from gnnserve.fanouts import check_fanouts
from gnnserve.graph.base import GraphStore
from gnnserve.newnodes.inference import check_mode
from gnnserve.newnodes.parse import parse_new_nodes
from gnnserve.newnodes.policies import check_gamma, check_policy
from gnnserve.newnodes.result import check_ns_fanouts, check_seed
from gnnserve.types import NewNodes, OutputKind, Request, RequestOptions

__all__ = [
    "MAX_TIMEOUT_MS",
    "RequestLimits",
    "check_new_node_only",
    "check_new_nodes_input",
    "check_nodes",
    "check_output",
    "check_request_fanouts",
    "check_target",
    "check_timeout_ms",
    "validate_request",
]

MAX_TIMEOUT_MS = 86_400_000.0  # one day
NEW_NODE_ONLY = ("mode", "gamma", "policy")  # options an existing-node request refuses
NEW_NODE_KEYS = ("features", "edges", "new_edges")  # fields of ``new_nodes``


@dataclass(frozen=True)
class RequestLimits:
    """What requests are checked against: the served graph and model, the configured limits."""

    graph: GraphStore  # node ids are checked against its current node count
    feature_dim: int  # F: the width of new-node features
    num_layers: int  # hops of every fanout list
    max_nodes: int  # existing nodes per request (admission.max_nodes_per_request)
    new_nodes: EmbeddingsConfig  # new-node defaults (mode, gamma, policy) and max_new_nodes


def check_target(nodes: object, new_nodes: object) -> bool:
    """True for a new-node request; InvalidInputError unless exactly one of the two is given."""
    if (nodes is None) == (new_nodes is None):
        both = nodes is not None
        raise InvalidInputError(
            "give exactly one of `nodes` (existing node ids) and `new_nodes` (features and "
            f"edges of new nodes), {'not both' if both else 'got neither'}",
            "new_nodes" if both else "nodes",
        )
    return new_nodes is not None


def check_output(output: object) -> OutputKind:
    """OutputKind from its name; unknown names raise InvalidInputError naming ``output``."""
    try:
        return OutputKind(output)
    except ValueError:
        kinds = [k.value for k in OutputKind]
        raise InvalidInputError(
            f"unknown output {echo(output)}; choose one of {kinds}", "output"
        ) from None


def check_nodes(nodes: object, graph: GraphStore, max_nodes: int) -> np.ndarray:
    """int64 [n] ids of existing nodes, 1 <= n <= ``max_nodes``; InvalidInputError naming
    ``nodes`` (TooManyNodesError past the limit)."""
    if isinstance(nodes, np.ndarray):
        arr = nodes
    else:
        if not isinstance(nodes, list | tuple) or any(
            isinstance(n, bool) or not isinstance(n, int | np.integer) for n in nodes
        ):
            raise InvalidInputError("nodes must be a list of integer node ids", "nodes")
        try:
            arr = np.asarray(nodes, dtype=np.int64) if nodes else np.empty(0, np.int64)
        except OverflowError:
            raise InvalidInputError("nodes holds an id beyond the int64 range", "nodes") from None
    if arr.size == 0:
        raise InvalidInputError("nodes must not be empty", "nodes")
    if arr.size > max_nodes:
        raise TooManyNodesError(f"{arr.size} nodes requested, the limit is {max_nodes}", "nodes")
    return graph.check_nodes(arr, "nodes")


def check_request_fanouts(fanouts: object, num_layers: int) -> tuple[int, ...] | None:
    """Sampling fanouts of an existing-node request: None (the server's) or one per layer."""
    return None if fanouts is None else tuple(check_fanouts(fanouts, hops=num_layers))


def check_new_node_only(**options: object) -> None:
    """InvalidInputError naming the first of ``options`` that is set: those apply to new-node
    requests only."""
    for name, value in options.items():
        if value is not None:
            raise InvalidInputError(f"{name} applies to new_nodes requests only", name)


def check_new_nodes_input(new_nodes: object, limits: RequestLimits) -> NewNodes:
    """The new nodes of a request, from a :class:`NewNodes` or a mapping with ``features``,
    ``edges`` and optionally ``new_edges`` (see :func:`gnnserve.newnodes.parse.parse_new_nodes`:
    errors name ``new_nodes.features`` / ``.edges`` / ``.new_edges``)."""
    if isinstance(new_nodes, NewNodes):
        parts: Mapping[object, object] = {
            "features": new_nodes.features,
            "edges": new_nodes.edges,
            "new_edges": new_nodes.new_edges,
        }
    elif isinstance(new_nodes, Mapping):
        parts = new_nodes
        unknown = [str(k)[:32] for k in parts if k not in NEW_NODE_KEYS]
        if unknown:
            raise InvalidInputError(
                f"new_nodes takes {list(NEW_NODE_KEYS)}, got {unknown[:4]}", "new_nodes"
            )
    else:
        raise InvalidInputError(
            f"new_nodes must be a mapping of {list(NEW_NODE_KEYS)}, got {type(new_nodes).__name__}",
            "new_nodes",
        )
    return parse_new_nodes(
        parts.get("features"),
        parts.get("edges"),
        parts.get("new_edges"),
        num_nodes=limits.graph.num_nodes,
        feature_dim=limits.feature_dim,
        max_new_nodes=limits.new_nodes.max_new_nodes,
    )


def check_timeout_ms(value: object, field: str = "timeout_ms") -> float:
    """A client's timeout in ms, > 0 and finite; InvalidInputError naming ``field`` otherwise."""
    try:
        ms = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        ms = math.nan
    if not (0 < ms <= MAX_TIMEOUT_MS):
        raise InvalidInputError(
            f"{field} must be a number of milliseconds in (0, {MAX_TIMEOUT_MS:.0f}], "
            f"got {str(value)[:40]!r}",
            field,
        )
    return ms


def validate_request(
    nodes: object = None,
    new_nodes: object = None,
    *,
    output: object = "label",
    fanouts: object = None,
    mode: object = None,
    gamma: object = None,
    policy: object = None,
    seed: object = None,
    timeout_ms: object = None,
    limits: RequestLimits,
) -> Request:
    """THE check of a request: raw fields in, a :class:`Request` marked checked by ``limits``.

    Existing nodes: ``nodes``, ``output``, ``fanouts`` (None: the server's); new nodes:
    ``new_nodes``, ``output``, ``mode``, ``gamma``, ``policy`` (None: ``limits.new_nodes``'s),
    ``fanouts`` (mode ns; None: its defaults), ``seed`` (None: 0). ``timeout_ms``: the
    client's deadline after admission (None: the server's timeout only). Raises
    InvalidInputError / TooManyNodesError naming the first bad field.
    """
    timeout = None if timeout_ms is None else check_timeout_ms(timeout_ms)
    if check_target(nodes, new_nodes):
        options = _new_node_options(output, fanouts, mode, gamma, policy, seed, timeout, limits)
        request = Request(new=check_new_nodes_input(new_nodes, limits), options=options)
    else:
        check_new_node_only(mode=mode, gamma=gamma, policy=policy)
        checked = check_request_fanouts(fanouts, limits.num_layers)
        kind = check_output(output)
        ids = check_nodes(nodes, limits.graph, limits.max_nodes)
        draws = None if seed is None else check_seed(seed)
        options = RequestOptions(kind, checked, seed=draws, timeout_ms=timeout)
        request = Request(nodes=ids, options=options)
    object.__setattr__(request, "checked_by", limits)  # frozen: the one place it is set
    return request


def _new_node_options(
    output: object,
    fanouts: object,
    mode: object,
    gamma: object,
    policy: object,
    seed: object,
    timeout_ms: float | None,
    limits: RequestLimits,
) -> RequestOptions:
    """The options of a new-node request, the server's defaults filled in."""
    cfg = limits.new_nodes
    kind = check_output(output)
    return RequestOptions(
        output=kind,
        mode=check_mode(cfg.mode if mode is None else mode),
        gamma=check_gamma(cfg.gamma if gamma is None else gamma),
        policy=check_policy(cfg.policy if policy is None else policy),
        fanouts=check_ns_fanouts(fanouts, limits.num_layers),
        seed=check_seed(0 if seed is None else seed),
        timeout_ms=timeout_ms,
    )


def request_fields(request: Request) -> dict[str, object]:
    """The fields of ``request`` as :func:`validate_request` takes them (to check a Request
    built without it)."""
    o = request.options
    return {
        "nodes": request.nodes,
        "new_nodes": request.new,
        "output": o.output,
        "fanouts": o.fanouts,
        "mode": o.mode,
        "gamma": o.gamma,
        "policy": o.policy,
        "seed": o.seed,
        "timeout_ms": o.timeout_ms,
    }
