"""Who owns a vertex: key ranges for sampling workers, a modulus for serving workers."""

from __future__ import annotations

import numpy as np


class KeyRanges:
    """Contiguous ranges of the first ``base`` ids, then new ids round-robin.

    Part i owns ids ``bounds[i] <= v < bounds[i + 1]`` of the graph it started on, and of the
    ids added later (``v >= base``) those with ``(v - base) % parts == i``, so growth spreads
    evenly. DGS partitions the update stream by key; an edge event u -> v is keyed by v, the
    vertex whose in-neighbour reservoir it changes.
    """

    def __init__(self, num_nodes: int, parts: int) -> None:
        if parts < 1:
            raise ValueError("parts must be >= 1")
        self.parts = parts
        self.base = int(num_nodes)
        self.bounds = np.linspace(0, num_nodes, parts + 1).round().astype(np.int64)

    def range_of(self, part: int) -> tuple[int, int]:
        """[lo, hi) of the ids below ``base`` that part ``part`` owns."""
        return int(self.bounds[part]), int(self.bounds[part + 1])

    def owner(self, v: np.ndarray) -> np.ndarray:
        """Owning part of each id in ``v`` (int64 array)."""
        v = np.asarray(v, dtype=np.int64)
        out = np.searchsorted(self.bounds, v, side="right").astype(np.int64) - 1
        grown = v >= self.base
        out[grown] = (v[grown] - self.base) % self.parts
        return out

    def owned(self, part: int) -> OwnedIds:
        """The id <-> row map of part ``part``."""
        return OwnedIds(self, part)


class OwnedIds:
    """Rows of one part: its range's ids first (row = v - lo), then its added ids in order."""

    def __init__(self, ranges: KeyRanges, part: int) -> None:
        self.ranges, self.part = ranges, part
        self.lo, self.hi = ranges.range_of(part)

    def count(self, num_nodes: int) -> int:
        """Rows this part owns in a graph of ``num_nodes`` ids."""
        added = max(num_nodes - self.ranges.base - self.part, 0)
        return self.hi - self.lo + -(-added // self.ranges.parts)

    def rows(self, v: np.ndarray) -> np.ndarray:
        """Row of each owned id in ``v`` (int64 array)."""
        v = np.asarray(v, dtype=np.int64)
        grown = (self.hi - self.lo) + (v - self.ranges.base) // self.ranges.parts
        return np.where(v < self.ranges.base, v - self.lo, grown)

    def vertices(self, rows: np.ndarray) -> np.ndarray:
        """Id of each row in ``rows`` (int64 array)."""
        rows = np.asarray(rows, dtype=np.int64)
        extra = rows - (self.hi - self.lo)
        grown = self.ranges.base + extra * self.ranges.parts + self.part
        return np.where(extra < 0, rows + self.lo, grown)


class Modulo:
    """Part ``v % parts`` owns vertex v (serving workers: query vertices spread evenly)."""

    def __init__(self, parts: int) -> None:
        if parts < 1:
            raise ValueError("parts must be >= 1")
        self.parts = parts

    def owner(self, v: np.ndarray) -> np.ndarray:
        """Owning part of each id in ``v`` (int64 array)."""
        return np.asarray(v, dtype=np.int64) % self.parts


def split(owner: np.ndarray, parts: int) -> list[np.ndarray]:
    """Positions of each part's items, in their original order (a stable grouping)."""
    order = np.argsort(owner, kind="stable")
    cuts = np.searchsorted(owner[order], np.arange(1, parts))
    return np.split(order, cuts)
