"""Graph update operations: parsing and validation of a batch, before anything is applied.

A batch is a list of JSON-like operations, applied in order and all-or-nothing:

- ``{"op": "add_edge", "src": u, "dst": v}``: a directed edge u -> v (send both for undirected)
- ``{"op": "delete_edge", "src": u, "dst": v}``: removes one u -> v edge; it must exist
- ``{"op": "add_node", "features": [...]}``: a node with the next free id (N, N+1, ...)
- ``{"op": "upsert_features", "node": v, "features": [...]}``: replaces v's features
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gnnserve.errors import InvalidInputError

OPS = ("add_edge", "delete_edge", "add_node", "upsert_features")


class UpdateRejectedError(InvalidInputError):
    """A batch with invalid operations; ``errors`` lists each one. Nothing was applied."""

    kind = "update_rejected"

    def __init__(self, errors: list[dict[str, Any]]) -> None:
        first = errors[0]
        super().__init__(
            f"{len(errors)} invalid operation(s); first: {first['message']}", first["field"]
        )
        self.errors = errors

    def to_json(self) -> dict[str, object]:
        body = super().to_json()
        body["errors"] = self.errors
        return body


@dataclass
class ParsedBatch:
    """A validated batch: the normalised operations and the node ids ``add_node`` will create."""

    ops: list[dict[str, Any]]  # normalised copies (ints, float lists), as written to the log
    new_nodes: list[int] = field(default_factory=list)  # ids assigned to add_node ops, in order


def _int_field(op: dict[str, Any], key: str, limit: int, path: str) -> int:
    value = op.get(key)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{path}.{key} must be an integer node id")
    if not 0 <= value < limit:
        raise ValueError(f"{path}.{key}: node {value} does not exist (nodes: {limit})")
    return value


_NUMBERS = (int, float, np.integer, np.floating)


def _not_a_number(x: object) -> bool:
    return isinstance(x, (bool, np.bool_)) or not isinstance(x, _NUMBERS)


def _features(op: dict[str, Any], width: int, path: str) -> list[float]:
    """``op["features"]`` as floats, checked finite after the cast to the table's float32."""
    values = op.get("features")
    if not isinstance(values, list) or len(values) != width:
        got = len(values) if isinstance(values, list) else type(values).__name__
        raise ValueError(f"{path}.features must be a list of {width} numbers, got {got}")
    if not {type(x) for x in values} <= {int, float}:  # JSON gives exactly these
        for i, x in enumerate(values):
            if _not_a_number(x):
                raise ValueError(f"{path}.features must hold numbers, features[{i}] is {x!r:.40}")
    try:
        exact = np.array(values, dtype=np.float64)
    except OverflowError:  # an int beyond float64
        exact = np.array([float(x) if abs(x) < 2**1000 else np.inf for x in values])
    with np.errstate(over="ignore", invalid="ignore"):
        finite = np.isfinite(exact.astype(np.float32))
    if not finite.all():
        i = int(np.argmin(finite))
        raise ValueError(
            f"{path}.features must be finite in float32 (the feature table's type, largest "
            f"{np.finfo(np.float32).max:.7g}): features[{i}] is {values[i]!r:.40}"
        )
    return exact.tolist()


def error_entry(index: int, message: str) -> dict[str, Any]:
    """One invalid operation in an UpdateRejectedError: the field is the message's leading
    path (``ops[3].dst: node ...`` -> ``ops[3].dst``)."""
    return {"index": index, "field": message.split(" ", 1)[0].rstrip(":"), "message": message}


def parse_batch(
    raw: Any, num_nodes: int, feature_dim: int, edge_count: Callable[[int, int], int]
) -> ParsedBatch:
    """Validate ``raw`` against the current graph; raise UpdateRejectedError listing every problem.

    ``edge_count(u, v)`` counts u -> v edges now; deletes are checked against it plus the batch's
    own earlier operations.
    """
    if not isinstance(raw, list) or not raw:
        raise InvalidInputError("ops must be a non-empty list of operations", "ops")
    batch = ParsedBatch(ops=[])
    errors: list[dict[str, Any]] = []
    pending: Counter[tuple[int, int]] = Counter()  # net edges added by this batch so far
    n = num_nodes
    for i, op in enumerate(raw):
        path = f"ops[{i}]"
        try:
            if not isinstance(op, dict) or op.get("op") not in OPS:
                raise ValueError(f"{path}.op must be one of {list(OPS)}")
            kind = op["op"]
            if kind in ("add_edge", "delete_edge"):
                u, v = _int_field(op, "src", n, path), _int_field(op, "dst", n, path)
                if kind == "delete_edge" and edge_count(u, v) + pending[(u, v)] <= 0:
                    raise ValueError(f"{path}: edge {u} -> {v} does not exist")
                pending[(u, v)] += 1 if kind == "add_edge" else -1
                batch.ops.append({"op": kind, "src": u, "dst": v})
            elif kind == "add_node":
                batch.ops.append({"op": kind, "features": _features(op, feature_dim, path)})
                batch.new_nodes.append(n)
                n += 1
            else:
                node = _int_field(op, "node", n, path)
                values = _features(op, feature_dim, path)
                batch.ops.append({"op": kind, "node": node, "features": values})
        except ValueError as exc:
            errors.append(error_entry(i, str(exc)))
    if errors:
        raise UpdateRejectedError(errors)
    return batch
