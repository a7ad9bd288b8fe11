"""Validation of what a DGSService is given: worker counts, edge events, request seeds."""

from __future__ import annotations

import numpy as np

from gnnserve.data.validate import check_node_ids
from gnnserve.errors import InvalidInputError
from gnnserve.graph.events import DELETE, INSERT


def positive_count(value: object, field: str) -> int:
    """A count that must be an int >= 1 (InvalidInputError naming ``field`` otherwise)."""
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
        raise InvalidInputError(f"{field} must be an int >= 1, got {value!r}", field)
    return int(value)


def check_events(
    kinds: np.ndarray, srcs: np.ndarray, dsts: np.ndarray, num_nodes: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Events as int64 arrays of equal length, kinds in {INSERT, DELETE}, ids < ``num_nodes``."""
    kinds_arr = np.asarray(kinds)
    if kinds_arr.size and not np.issubdtype(kinds_arr.dtype, np.integer):
        raise InvalidInputError(f"event kinds must be integers, got {kinds_arr.dtype}", "kinds")
    kinds_arr = kinds_arr.astype(np.int64)
    srcs = check_node_ids(srcs, num_nodes, "src")
    dsts = check_node_ids(dsts, num_nodes, "dst")
    if kinds_arr.ndim != 1 or not kinds_arr.size == srcs.size == dsts.size:
        raise InvalidInputError("kinds, srcs and dsts must be 1-D of equal length", "kinds")
    bad = np.flatnonzero((kinds_arr != INSERT) & (kinds_arr != DELETE))
    if bad.size:
        i = int(bad[0])
        raise InvalidInputError(
            f"event {i}: kind {int(kinds_arr[i])} is neither INSERT (0) nor DELETE (1)", "kinds"
        )
    return kinds_arr, srcs, dsts


def check_seeds(seeds: np.ndarray, is_query: np.ndarray) -> np.ndarray:
    """Seeds as int64, non-empty, each a query vertex (``is_query`` [N])."""
    seeds = check_node_ids(seeds, is_query.size, "seeds")
    if seeds.size == 0:
        raise InvalidInputError("seeds must not be empty", "seeds")
    unknown = np.flatnonzero(~is_query[seeds])
    if unknown.size:
        v = int(seeds[unknown[0]])
        raise InvalidInputError(f"seed {v} is not a query vertex of this service", "seeds")
    return seeds
