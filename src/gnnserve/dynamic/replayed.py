"""What the batches replayed from an update log changed, summed over the whole log: the nodes
whose in-edges or features changed and the nodes added. Listeners subscribe after the replay
and never hear of those batches; a consumer that holds state of the base store (precomputed
embeddings) catches up from this summary instead (``embeddings.refresher``)."""

from __future__ import annotations

import numpy as np

_COMPACT_EVERY = 256  # batches between merges of the collected ids (bounds the memory)


class ReplayedChanges:
    """Accumulates :meth:`add` per replayed batch; ``first_new_node``: the base store's node
    count (every node from it on was added by the log)."""

    def __init__(self, first_new_node: int) -> None:
        self.first_new_node = first_new_node
        self.batches = 0
        self._dsts: list[np.ndarray] = []
        self._features: list[np.ndarray] = []

    def add(self, edge_dsts: np.ndarray | None, upserted: np.ndarray) -> None:
        """One replayed batch: the destinations of its edge events (None: none) and the
        existing nodes whose features it rewrote."""
        self.batches += 1
        if edge_dsts is not None:
            self._dsts.append(np.asarray(edge_dsts, np.int64))
        if upserted.size:
            self._features.append(np.asarray(upserted, np.int64))
        if self.batches % _COMPACT_EVERY == 0:
            self._dsts, self._features = [self.edge_dsts()], [self.features()]

    def edge_dsts(self) -> np.ndarray:
        """Sorted unique destinations of every replayed edge insert or delete."""
        return np.unique(np.concatenate(self._dsts)) if self._dsts else np.zeros(0, np.int64)

    def features(self) -> np.ndarray:
        """Sorted unique existing nodes whose features a replayed batch rewrote."""
        return (
            np.unique(np.concatenate(self._features)) if self._features else np.zeros(0, np.int64)
        )
