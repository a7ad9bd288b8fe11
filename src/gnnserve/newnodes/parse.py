"""New nodes sent with a request: validation of their features and edges.

:func:`parse_new_nodes` turns caller input (lists, arrays or tensors) into a checked
:class:`~gnnserve.types.NewNodes` (at admission: ``engine.requests``). The graph G+ they form
with the stored graph is :class:`~gnnserve.newnodes.overlay.AdjacencyOverlay`.
"""

from __future__ import annotations

import numpy as np
import torch

from gnnserve.errors import InvalidInputError, TooManyNodesError
from gnnserve.types import NewNodes

__all__ = ["check_new_nodes", "parse_new_nodes"]

FEATURES_FIELD = "new_nodes.features"
EDGES_FIELD = "new_nodes.edges"
NEW_EDGES_FIELD = "new_nodes.new_edges"


def _as_array(value: object, field: str) -> np.ndarray:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().numpy()
    try:
        return np.asarray(value)
    except (ValueError, TypeError) as exc:  # ragged nested lists, odd objects
        raise InvalidInputError(f"{field} is not a rectangular array: {exc}", field) from None


def _check_features(features: object, feature_dim: int, max_new: int | None) -> torch.Tensor:
    arr = _as_array(features, FEATURES_FIELD)
    if arr.ndim != 2:
        raise InvalidInputError(
            f"new node features must be 2-D [m, F], got shape {list(arr.shape)}", FEATURES_FIELD
        )
    if arr.shape[0] == 0:
        raise InvalidInputError("a request must carry at least one new node", FEATURES_FIELD)
    if arr.shape[1] != feature_dim:
        raise InvalidInputError(
            f"new node features have {arr.shape[1]} columns, the graph's features have "
            f"{feature_dim}",
            FEATURES_FIELD,
        )
    if max_new is not None and arr.shape[0] > max_new:
        raise TooManyNodesError(
            f"{arr.shape[0]} new nodes exceed the limit of {max_new} per request", FEATURES_FIELD
        )
    if not np.issubdtype(arr.dtype, np.number) or np.issubdtype(arr.dtype, np.complexfloating):
        raise InvalidInputError(
            f"new node features must be real numbers, got {arr.dtype}", FEATURES_FIELD
        )
    with np.errstate(over="ignore", invalid="ignore"):
        out = arr.astype(np.float32)
    finite = np.isfinite(out)
    if not finite.all():
        row = int(np.argwhere(~finite)[0, 0])
        raise InvalidInputError(
            f"new node features hold NaN or inf or overflow float32 (first at new node {row})",
            FEATURES_FIELD,
        )
    return torch.from_numpy(np.ascontiguousarray(out))


def _check_pairs(value: object, field: str) -> np.ndarray:
    """``value`` as int64 [E, 2]; None and empty lists are [0, 2]."""
    if value is None:
        return np.empty((0, 2), np.int64)
    arr = _as_array(value, field)
    if arr.size == 0 and arr.ndim <= 2 and (arr.ndim < 2 or arr.shape[1] in (0, 2)):
        return np.empty((0, 2), np.int64)
    if arr.ndim != 2 or arr.shape[1] != 2:
        raise InvalidInputError(f"{field} must have shape [E, 2], got {list(arr.shape)}", field)
    if not np.issubdtype(arr.dtype, np.integer) or arr.dtype == np.bool_:
        integral = (
            np.issubdtype(arr.dtype, np.floating)
            and bool(np.isfinite(arr).all())
            and bool((arr == np.floor(arr)).all())
        )
        if not integral:
            raise InvalidInputError(f"{field} must hold integer ids, got {arr.dtype}", field)
    return np.ascontiguousarray(arr.astype(np.int64))


def _check_range(values: np.ndarray, hi: int, field: str, what: str) -> None:
    if values.size == 0:
        return
    bad = (values < 0) | (values >= hi)
    if bad.any():
        value = int(values[np.argmax(bad)])
        raise InvalidInputError(f"{field} holds {what} {value} outside [0, {hi})", field)


def parse_new_nodes(
    features: object,
    edges: object,
    new_edges: object = None,
    *,
    num_nodes: int,
    feature_dim: int,
    max_new_nodes: int | None = None,
) -> NewNodes:
    """Validate the new nodes of a request and return them as a :class:`NewNodes`.

    ``features``: [m, F] finite real numbers, m >= 1, F = ``feature_dim``; ``edges``: [E, 2]
    (new node index in [0, m), existing node id in [0, ``num_nodes``)); ``new_edges``: [E2, 2]
    pairs of distinct new node indices. Edge lists may be empty or None (an isolated new node is
    allowed) and may repeat an edge (each copy counts). Every failure raises InvalidInputError
    whose ``field`` is ``new_nodes.features``, ``new_nodes.edges`` or ``new_nodes.new_edges``
    (TooManyNodesError when m exceeds ``max_new_nodes``).
    """
    x = _check_features(features, feature_dim, max_new_nodes)
    m = int(x.shape[0])
    e = _check_pairs(edges, EDGES_FIELD)
    _check_range(e[:, 0], m, EDGES_FIELD, "new node index")
    _check_range(e[:, 1], num_nodes, EDGES_FIELD, "existing node id")
    ne = _check_pairs(new_edges, NEW_EDGES_FIELD)
    _check_range(ne.ravel(), m, NEW_EDGES_FIELD, "new node index")
    loops = ne[:, 0] == ne[:, 1]
    if loops.any():
        i = int(ne[np.argmax(loops), 0])
        raise InvalidInputError(
            f"{NEW_EDGES_FIELD} holds the self loop ({i}, {i}); every model already includes a "
            "node's own features",
            NEW_EDGES_FIELD,
        )
    return NewNodes(features=x, edges=e, new_edges=ne)


def check_new_nodes(new: NewNodes, num_nodes: int, feature_dim: int) -> NewNodes:
    """Re-validate a :class:`NewNodes` built elsewhere (same checks as :func:`parse_new_nodes`)."""
    if not isinstance(new, NewNodes):
        raise InvalidInputError("new_nodes must be a NewNodes", "new_nodes")
    return parse_new_nodes(
        new.features,
        new.edges,
        new.new_edges,
        num_nodes=num_nodes,
        feature_dim=feature_dim,
    )
