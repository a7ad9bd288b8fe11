"""numba kernels for rows stored as segments with slack in one growable array.

Row r's values live in ``cols[start[r] : start[r] + degree[r]]`` with room for ``capacity[r]``.
An insert into a full row moves it to the end with doubled capacity (amortised O(1)); a delete
swaps the row's last value into the hole. Used by the dynamic graph store and the DGS sampling
workers' adjacency.
"""

from __future__ import annotations

import numba
import numpy as np


@numba.njit(nogil=True, cache=True)
def segment_insert(start, degree, capacity, cols, used, row, value):  # type: ignore[no-untyped-def]
    """Append ``value`` to ``row``, moving the row when full; returns (cols, used)."""
    if degree[row] == capacity[row]:
        new_cap = max(4, 2 * capacity[row])
        if used + new_cap > cols.shape[0]:
            grown = np.empty(max(2 * cols.shape[0], used + new_cap), dtype=cols.dtype)
            grown[:used] = cols[:used]
            cols = grown
        lo = start[row]
        for j in range(degree[row]):
            cols[used + j] = cols[lo + j]
        start[row] = used
        capacity[row] = new_cap
        used += new_cap
    cols[start[row] + degree[row]] = value
    degree[row] += 1
    return cols, used


@numba.njit(nogil=True, cache=True)
def segment_delete(start, degree, cols, row, value):  # type: ignore[no-untyped-def]
    """Remove one ``value`` from ``row``; False when the row holds none."""
    lo = start[row]
    last = lo + degree[row] - 1
    for p in range(lo, last + 1):
        if cols[p] == value:
            cols[p] = cols[last]
            degree[row] -= 1
            return True
    return False
