"""Input checks shared by every importer: each failure names the offending field."""

from __future__ import annotations

import numpy as np

from gnnserve.errors import InvalidInputError


def check_edge_index(edge_index: np.ndarray, num_nodes: int) -> np.ndarray:
    """Return ``edge_index`` as int64 [2, E] after checking shape, type and id range."""
    if num_nodes <= 0:
        raise InvalidInputError(f"empty graph: num_nodes={num_nodes}", "num_nodes")
    ei = np.asarray(edge_index)
    if ei.ndim != 2 or ei.shape[0] != 2:
        raise InvalidInputError(
            f"edge_index must have shape [2, E], got {list(ei.shape)}", "edge_index"
        )
    if ei.shape[1] == 0:
        raise InvalidInputError("empty graph: edge_index has no edges", "edge_index")
    if not np.issubdtype(ei.dtype, np.integer):
        if (
            np.issubdtype(ei.dtype, np.floating)
            and np.all(np.isfinite(ei))
            and np.all(ei == np.floor(ei))
        ):
            ei = ei.astype(np.int64)
        else:
            raise InvalidInputError(
                f"edge_index must hold integer ids, got {ei.dtype}", "edge_index"
            )
    ei = ei.astype(np.int64, copy=False)
    lo, hi = int(ei.min()), int(ei.max())
    if lo < 0 or hi >= num_nodes:
        bad = lo if lo < 0 else hi
        raise InvalidInputError(
            f"edge_index holds node id {bad} outside [0, {num_nodes})", "edge_index"
        )
    return ei


def check_features(x: np.ndarray, num_nodes: int) -> np.ndarray:
    """Return features as float32 [N, F] after checking shape and finiteness."""
    arr = np.asarray(x)
    if arr.ndim != 2:
        raise InvalidInputError(f"features must be 2-D [N, F], got shape {list(arr.shape)}", "x")
    if arr.shape[0] != num_nodes:
        raise InvalidInputError(
            f"features have {arr.shape[0]} rows but the graph has {num_nodes} nodes", "x"
        )
    if arr.shape[1] == 0:
        raise InvalidInputError("features have zero columns", "x")
    if not np.issubdtype(arr.dtype, np.number) or np.issubdtype(arr.dtype, np.complexfloating):
        raise InvalidInputError(f"features must be real numbers, got {arr.dtype}", "x")
    with np.errstate(over="ignore", invalid="ignore"):
        arr = arr.astype(np.float32, copy=False)
    row = first_non_finite_row(arr)
    if row is not None:
        raise InvalidInputError(
            f"features hold NaN or inf, or values beyond float32's range (first at node {row})",
            "x",
        )
    return arr


def first_non_finite_row(arr: np.ndarray, chunk_rows: int = 1 << 16) -> int | None:
    """The first row of 2-D ``arr`` holding NaN or inf, or None; scans in chunks of rows so the
    boolean mask stays small for stores of any size."""
    for lo in range(0, arr.shape[0], chunk_rows):
        finite = np.isfinite(arr[lo : lo + chunk_rows]).all(axis=1)
        if not finite.all():
            return lo + int(np.argmin(finite))
    return None


def check_labels(y: np.ndarray | None, num_nodes: int) -> np.ndarray | None:
    """Return labels as int64 [N] (-1 = unknown) or None."""
    if y is None:
        return None
    arr = np.asarray(y)
    if arr.shape != (num_nodes,):
        raise InvalidInputError(f"labels must have shape [{num_nodes}], got {list(arr.shape)}", "y")
    if not np.issubdtype(arr.dtype, np.integer):
        raise InvalidInputError(f"labels must be integers, got {arr.dtype}", "y")
    arr = arr.astype(np.int64, copy=False)
    if arr.min() < -1:
        raise InvalidInputError("labels must be >= -1 (-1 = unknown)", "y")
    return arr


def check_mask(mask: np.ndarray | None, num_nodes: int, name: str) -> np.ndarray | None:
    """Return a split mask as bool [N] or None."""
    if mask is None:
        return None
    arr = np.asarray(mask)
    if arr.shape != (num_nodes,):
        raise InvalidInputError(
            f"{name} must have shape [{num_nodes}], got {list(arr.shape)}", name
        )
    return arr.astype(bool, copy=False)


def check_node_ids(ids: object, num_nodes: int, field: str) -> np.ndarray:
    """Return ``ids`` as int64 [n] after checking they are ids in [0, num_nodes).

    On the request path: small arrays take a Python min/max, cheaper than two numpy reductions.
    """
    arr = np.asarray(ids)
    if arr.ndim != 1:
        raise InvalidInputError(f"{field} must be a 1-D list of node ids", field)
    if arr.dtype != np.int64:
        if arr.size and not np.issubdtype(arr.dtype, np.integer):
            raise InvalidInputError(f"{field} must hold integer node ids, got {arr.dtype}", field)
        arr = arr.astype(np.int64)
    if arr.size:
        if arr.size <= 32:
            values = arr.tolist()
            lo, hi = min(values), max(values)
        else:
            lo, hi = int(arr.min()), int(arr.max())
        if lo < 0 or hi >= num_nodes:
            bad = lo if lo < 0 else hi
            raise InvalidInputError(f"{field} holds node id {bad} outside [0, {num_nodes})", field)
    return arr
