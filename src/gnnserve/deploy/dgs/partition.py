"""Who owns a vertex: key ranges for sampling workers, a modulus for serving workers."""

from __future__ import annotations

import numpy as np


class KeyRanges:
    """Contiguous vertex-id ranges: part i owns ids ``bounds[i] <= v < bounds[i + 1]``.

    DGS partitions the update stream by key range; an edge event u -> v is keyed by v, the
    vertex whose in-neighbour reservoir it changes.
    """

    def __init__(self, num_nodes: int, parts: int) -> None:
        if parts < 1:
            raise ValueError("parts must be >= 1")
        self.parts = parts
        self.bounds = np.linspace(0, num_nodes, parts + 1).round().astype(np.int64)

    def range_of(self, part: int) -> tuple[int, int]:
        """[lo, hi) of the ids part ``part`` owns."""
        return int(self.bounds[part]), int(self.bounds[part + 1])

    def owner(self, v: np.ndarray) -> np.ndarray:
        """Owning part of each id in ``v`` (int64 array)."""
        return np.searchsorted(self.bounds, v, side="right").astype(np.int64) - 1


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
