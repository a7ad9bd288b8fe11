"""Columnar update batches: a batch of graph updates as arrays, validated without a Python loop.

The bulk form of the operations in ``dynamic.updates`` (same meaning, same order, all or
nothing): row i is operation i, with

- ``op``: int8 code, :data:`OP_CODES` (0 add_edge, 1 delete_edge, 2 add_node, 3 upsert_features);
- ``src``, ``dst``: int64 edge endpoints (add_edge, delete_edge);
- ``node``: int64 node whose features an upsert replaces;
- ``features``: float32 [rows with features, F], the add_node and upsert rows in row order.

An id a row does not use is ignored; a null where one is needed is :data:`MISSING`.

``check_columns`` validates a batch against the current graph with numpy and one numba pass,
and reports every invalid row exactly as ``parse_batch`` reports an invalid JSON operation
(``{"index", "field", "message"}``). JSON batches are turned into columns after ``parse_batch``
(``from_ops``), so the store applies one form. ``encode``/``decode`` are the payload of a binary
update-log record (``dynamic.wal``): little-endian arrays behind a small header.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from itertools import chain, compress
from operator import itemgetter
from typing import Any

import numba
import numpy as np

from gnnserve.dynamic.updates import OPS, UpdateRejectedError, error_entry
from gnnserve.errors import InvalidInputError

OP_CODES = {name: code for code, name in enumerate(OPS)}
ADD_EDGE, DELETE_EDGE, ADD_NODE, UPSERT = range(4)
_HEADER = struct.Struct("<II")  # rows, feature width
MISSING = np.iinfo(np.int64).min  # an id column's null (a bulk reader's missing value)


@dataclass
class ColumnBatch:
    """One batch of updates as columns (see the module docstring); ``len()`` = operations."""

    op: np.ndarray  # int8 [k]
    src: np.ndarray  # int64 [k]
    dst: np.ndarray  # int64 [k]
    node: np.ndarray  # int64 [k]
    features: np.ndarray  # float32 [rows with op add_node or upsert_features, F]
    features_missing: np.ndarray | None = None  # bool [feature rows]: null in the input

    def __len__(self) -> int:
        return int(self.op.size)

    @cached_property
    def edge_rows(self) -> np.ndarray:
        """Indices of the edge operations, in order."""
        return np.flatnonzero(self.op <= DELETE_EDGE)

    @property
    def added(self) -> int:
        """Number of add_node operations (the nodes the batch creates)."""
        return int(np.count_nonzero(self.op == ADD_NODE))

    @cached_property
    def feature_rows(self) -> np.ndarray:
        """Indices of the operations that carry features (add_node, upsert), in order."""
        return np.flatnonzero(self.op >= ADD_NODE)

    @cached_property
    def upserted_nodes(self) -> np.ndarray:
        """int64 ids of the existing nodes whose features the batch rewrites (repeats
        possible; added nodes not included)."""
        rows = self.feature_rows[self.op[self.feature_rows] != ADD_NODE]
        return np.asarray(self.node[rows], np.int64)

    def edge_events(self) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """(inserts bool, srcs, dsts) of the edge operations in order; None when none."""
        rows = self.edge_rows
        if rows.size == 0:
            return None
        return self.op[rows] == ADD_EDGE, self.src[rows], self.dst[rows]


def from_ops(ops: list[dict[str, Any]], dim: int) -> ColumnBatch:
    """Columns of a batch already normalised by ``parse_batch``."""
    k = len(ops)
    op = np.array([OP_CODES[o["op"]] for o in ops], dtype=np.int8)
    src = np.array([o.get("src", -1) for o in ops], dtype=np.int64).reshape(k)
    dst = np.array([o.get("dst", -1) for o in ops], dtype=np.int64).reshape(k)
    node = np.array([o.get("node", -1) for o in ops], dtype=np.int64).reshape(k)
    rows = [o["features"] for o in ops if "features" in o]
    features = np.array(rows, dtype=np.float32).reshape(len(rows), dim)
    return ColumnBatch(op, src, dst, node, features)


def from_json(raw: Any, dim: int) -> ColumnBatch | None:
    """Columns straight from JSON-decoded operations (a list of dicts), or None when any
    operation is not in its plain form: a non-dict, an unknown ``op``, a missing key, an id
    that is not an int, features that are not ``dim`` finite float32 numbers. The caller then
    validates op by op (``parse_batch``), which names every problem. Ids are not checked
    against the graph here (``check_columns`` does). Python touches each operation a few times
    at C speed (``map``, ``itemgetter``), never in a per-operation loop of statements."""
    if not isinstance(raw, list) or not raw:
        return None
    try:
        code = np.fromiter(map(OP_CODES.get, map(_OP, raw)), np.float64, len(raw))
    except (TypeError, KeyError, ValueError):  # not a dict, no "op", an unhashable or unknown op
        return None
    if np.isnan(code).any():
        return None
    op = code.astype(np.int8)
    is_edge, is_upsert = op <= DELETE_EDGE, op == UPSERT
    try:
        pairs = list(map(_EDGE, compress(raw, is_edge.tolist())))
        nodes = list(map(_NODE, compress(raw, is_upsert.tolist())))
        rows = list(map(_FEATURES, compress(raw, (op >= ADD_NODE).tolist())))
    except KeyError:
        return None
    ends = list(chain.from_iterable(pairs))  # src, dst, src, dst, ...
    if not {*map(type, ends), *map(type, nodes)} <= {int}:  # no bools, no floats
        return None
    src, dst, node = (np.full(len(raw), -1, np.int64) for _ in range(3))
    try:
        ids = np.fromiter(ends, np.int64, len(ends))
        src[is_edge], dst[is_edge] = ids[0::2], ids[1::2]
        node[is_upsert] = np.fromiter(nodes, np.int64, len(nodes))
    except OverflowError:  # beyond int64
        return None
    features = _feature_rows(rows, dim)
    return None if features is None else ColumnBatch(op, src, dst, node, features)


_OP, _EDGE, _NODE = itemgetter("op"), itemgetter("src", "dst"), itemgetter("node")
_FEATURES = itemgetter("features")


def _feature_rows(rows: list[Any], dim: int) -> np.ndarray | None:
    """float32 [len(rows), dim] from lists of JSON numbers, rounded as ``parse_batch`` rounds
    them (to float64, then float32); None unless every row is ``dim`` numbers finite in float32."""
    if not rows:
        return np.empty((0, dim), np.float32)
    if not set(map(type, rows)) <= {list} or set(map(len, rows)) != {dim}:
        return None
    if not set(map(type, chain.from_iterable(rows))) <= {int, float}:
        return None
    try:
        exact = np.array(rows, dtype=np.float64)
    except OverflowError:
        return None
    with np.errstate(over="ignore", invalid="ignore"):
        features = exact.astype(np.float32)
    return features if np.isfinite(features).all() else None


def encode(batch: ColumnBatch) -> bytes:
    """The batch as bytes (header, then op, src, dst, node, features; little-endian)."""
    parts = [_HEADER.pack(len(batch), batch.features.shape[1])]
    parts += [np.ascontiguousarray(a, a.dtype.newbyteorder("<")).tobytes() for a in _arrays(batch)]
    return b"".join(parts)


def _arrays(batch: ColumnBatch) -> tuple[np.ndarray, ...]:  # what ``encode`` writes
    return batch.op, batch.src, batch.dst, batch.node, batch.features


def decode(payload: bytes) -> ColumnBatch:
    """Inverse of ``encode``; ValueError when the bytes do not hold one whole batch."""
    if len(payload) < _HEADER.size:
        raise ValueError("payload length is shorter than its header")
    k, dim = _HEADER.unpack_from(payload)
    at = _HEADER.size
    op = np.frombuffer(payload, "<i1", min(k, len(payload) - at), at).astype(np.int8)
    with_features = int(np.count_nonzero(op >= ADD_NODE))
    if len(payload) != at + 25 * k + 4 * with_features * dim:
        raise ValueError("payload length does not match its header")
    at += k
    src, dst, node = (np.frombuffer(payload, "<i8", k, at + 8 * k * j) for j in range(3))
    features = np.frombuffer(payload, "<f4", with_features * dim, at + 24 * k)
    return ColumnBatch(
        op,
        src.astype(np.int64),
        dst.astype(np.int64),
        node.astype(np.int64),
        features.astype(np.float32).reshape(with_features, dim),
    )


@numba.njit(cache=True)
def _failed_deletes(sorted_rows, delta, group_start, base):  # type: ignore[no-untyped-def]
    """Walk each (src, dst) group's operations in order from its current edge count: a delete
    that finds no copy fails and, as in ``parse_batch``, changes nothing."""
    failed = np.zeros(sorted_rows.size, dtype=np.bool_)
    count = 0
    for j in range(sorted_rows.size):
        if group_start[j]:
            count = base[j]
        if delta[j] > 0:
            count += 1
        elif count > 0:
            count -= 1
        else:
            failed[j] = True
    return failed


EdgeCounts = Callable[[np.ndarray, np.ndarray], np.ndarray]  # (srcs, dsts) -> u -> v counts now


def check_columns(
    batch: ColumnBatch, num_nodes: int, dim: int, edge_counts: EdgeCounts | None
) -> list[int]:
    """Validate ``batch`` against the graph now; returns the ids its add_node rows create.
    ``edge_counts`` None skips the check that each delete finds an edge (the caller applies
    the batch to a copy no one reads and checks again if a delete fails there).

    Raises UpdateRejectedError listing every invalid row (messages as ``parse_batch``), or
    InvalidInputError when the batch as a whole is malformed (empty, wrong feature width).
    """
    k = len(batch)
    if k == 0:
        raise InvalidInputError("ops must be a non-empty list of operations", "ops")
    if batch.features.ndim == 2 and batch.features.shape[1] == 0:  # no features column
        batch.features = np.zeros((batch.features.shape[0], dim), np.float32)
    if batch.features.ndim != 2 or batch.features.shape[1] != dim:
        width = batch.features.shape[1] if batch.features.ndim == 2 else "?"
        raise InvalidInputError(
            f"features must hold {dim} numbers per row, got {width}", "features"
        )
    plain = batch.features_missing is None or not batch.features_missing.any()
    if plain and _rows_valid(batch.op, batch.src, batch.dst, batch.node, batch.features, num_nodes):
        errors: dict[int, str] = {}  # row -> message of its first problem
    else:
        errors = _row_errors(batch, num_nodes)
    if edge_counts is not None:
        _check_deletes(errors, batch, num_nodes, edge_counts)
    if errors:
        raise UpdateRejectedError([error_entry(i, errors[i]) for i in sorted(errors)])
    return list(range(num_nodes, num_nodes + batch.added))


@numba.njit(nogil=True, cache=True)
def _rows_valid(op, src, dst, node, features, num_nodes):  # type: ignore[no-untyped-def]
    """Whether every row passes the row checks of ``_row_errors`` (one pass, no GIL): a known
    op, ids of nodes that exist at that row, finite features."""
    limit = num_nodes
    for i in range(op.shape[0]):
        o = op[i]
        if o == ADD_NODE:
            limit += 1
        elif o == UPSERT:
            if node[i] < 0 or node[i] >= limit:
                return False
        elif ADD_EDGE <= o <= DELETE_EDGE:
            if src[i] < 0 or src[i] >= limit or dst[i] < 0 or dst[i] >= limit:
                return False
        else:
            return False
    for x in features.ravel():  # noqa: SIM110 (a loop numba compiles)
        if not np.isfinite(x):
            return False
    return True


def _row_errors(batch: ColumnBatch, num_nodes: int) -> dict[int, str]:
    """Row -> the message of its first problem, for every row that fails a row check."""
    errors: dict[int, str] = {}
    op = batch.op
    bad_op = (op < 0) | (op > UPSERT)
    _report(errors, bad_op, lambda i: f"ops[{i}].op must be one of {list(OPS)}")
    _check_features(errors, batch)
    adds = op == ADD_NODE
    valid_adds = adds.copy()  # an add_node refused creates no node (as in parse_batch)
    valid_adds[[i for i in errors if adds[i]]] = False
    limit = num_nodes + np.cumsum(valid_adds)  # nodes at row i (an add row names no id)
    edge = (op <= DELETE_EDGE) & ~bad_op
    for name, column in (("src", batch.src), ("dst", batch.dst)):
        _check_ids(errors, column, edge, limit, name)
    _check_ids(errors, batch.node, op == UPSERT, limit, "node")
    return errors


def _report(errors: dict[int, str], bad: np.ndarray, say: Callable[[int], str]) -> None:
    """Record ``say(i)`` for each bad row i that has no problem recorded yet."""
    for i in np.flatnonzero(bad).tolist():
        errors.setdefault(i, say(i))


def _check_ids(
    errors: dict[int, str], ids: np.ndarray, used: np.ndarray, limit: np.ndarray, name: str
) -> None:
    missing = used & (ids == MISSING)
    _report(errors, missing, lambda i: f"ops[{i}].{name} must be an integer node id")
    beyond = used & ~missing & ((ids < 0) | (ids >= limit))
    _report(
        errors,
        beyond,
        lambda i: f"ops[{i}].{name}: node {ids[i]} does not exist (nodes: {limit[i]})",
    )


def _check_features(errors: dict[int, str], batch: ColumnBatch) -> None:
    rows = batch.feature_rows
    if batch.features_missing is not None:
        width = batch.features.shape[1]
        _report(
            errors,
            np.isin(np.arange(len(batch)), rows[batch.features_missing]),
            lambda i: f"ops[{i}].features must be a list of {width} numbers, got NoneType",
        )
    finite = np.isfinite(batch.features)
    largest = np.finfo(np.float32).max
    for j in np.flatnonzero(~finite.all(axis=1)).tolist():
        col = int(np.argmin(finite[j]))
        value = float(batch.features[j, col])
        errors.setdefault(
            int(rows[j]),
            f"ops[{int(rows[j])}].features must be finite in float32 (the feature table's type, "
            f"largest {largest:.7g}): features[{col}] is {value!r:.40}",
        )


def _check_deletes(
    errors: dict[int, str], batch: ColumnBatch, num_nodes: int, counts: EdgeCounts
) -> None:
    """Each delete must find an edge: the graph's copies plus the batch's earlier net adds."""
    rows = batch.edge_rows
    if errors:
        rows = rows[~np.isin(rows, np.fromiter(errors, dtype=np.int64))]
    if rows.size == 0 or not np.any(batch.op[rows] == DELETE_EDGE):
        return
    src, dst = batch.src[rows], batch.dst[rows]
    order = np.lexsort((rows, dst, src))  # by (src, dst), then in batch order
    s, d, r = src[order], dst[order], rows[order]
    start = np.ones(r.size, dtype=np.bool_)
    start[1:] = (s[1:] != s[:-1]) | (d[1:] != d[:-1])
    delta = np.where(batch.op[r] == ADD_EDGE, 1, -1)
    group = np.cumsum(start) - 1
    deletes = np.zeros(int(group[-1]) + 1, dtype=np.bool_)
    deletes[group[delta < 0]] = True  # groups with a delete: only their edges are counted
    base = np.zeros(r.size, dtype=np.int64)
    old = start & deletes[group] & (s < num_nodes) & (d < num_nodes)  # new nodes: no copy yet
    base[old] = counts(s[old], d[old])
    failed = _failed_deletes(r, delta, start, base)
    for j in np.flatnonzero(failed).tolist():
        i = int(r[j])
        errors[i] = f"ops[{i}]: edge {int(s[j])} -> {int(d[j])} does not exist"
