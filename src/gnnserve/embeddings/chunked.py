"""PEs held as copy-on-write row chunks (issue 29, part 2): a refreshed version shares every
chunk it did not change with the version before it, so publishing a refresh costs the chunks
its rows fall in, not the whole table, and a reader holding the old version keeps reading it
unchanged.
"""

from __future__ import annotations

import numpy as np
import torch

from gnnserve.data.validate import check_node_ids
from gnnserve.embeddings.base import EmbeddingMeta, EmbeddingStore

# rows per chunk: 2,048 (a 64-wide float32 chunk is 512 KiB). Small, because a refresh copies
# every chunk it writes a row in: a batch's few changed rows of a hidden layer, spread at random
# over the ids, touch about one chunk each
CHUNK_ROWS = 1 << 11


class ChunkedEmbeddings(EmbeddingStore):
    """Every layer as a list of [<= CHUNK_ROWS, dim] float32 chunks; never modified in place
    (:meth:`with_rows` returns a new version)."""

    def __init__(self, meta: EmbeddingMeta, chunks: list[list[np.ndarray]]) -> None:
        super().__init__(meta)
        if len(chunks) != len(meta.dims):
            raise ValueError(f"{len(chunks)} layers of chunks for {len(meta.dims)} dims")
        self.chunks = chunks

    @classmethod
    def from_layers(cls, meta: EmbeddingMeta, layers: list[np.ndarray]) -> ChunkedEmbeddings:
        """Chunks copied from whole [N, dim] arrays (e.g. a precompute's or a store's)."""
        return cls(meta, [_split(np.asarray(a, np.float32)) for a in layers])

    def _layer(self, layer: int) -> np.ndarray:
        """The whole layer, concatenated (a copy: O(N dim); readers of rows use :meth:`get`)."""
        parts = self.chunks[layer - 1]
        return np.concatenate(parts) if parts else np.zeros((0, self.meta.dims[layer - 1]))

    def get(self, layer: int, ids: np.ndarray) -> torch.Tensor:
        """float32 [len(ids), dim] rows of ``layer`` for existing node ``ids``."""
        self.check_layer(layer)
        ids = check_node_ids(ids, self.meta.num_nodes, "ids")
        out = np.empty((ids.size, self.meta.dims[layer - 1]), np.float32)
        if ids.size == 0:
            return torch.from_numpy(out)
        which, offset = np.divmod(ids, CHUNK_ROWS)
        parts = self.chunks[layer - 1]
        small = which.astype(np.int32 if len(parts) > 32_000 else np.int16)
        order = np.argsort(small, kind="stable")  # a radix sort: then each chunk's ids only
        chunks, starts = np.unique(which[order], return_index=True)
        ends = np.append(starts[1:], ids.size)
        for c, lo, hi in zip(chunks.tolist(), starts.tolist(), ends.tolist(), strict=True):
            mine = order[lo:hi]
            out[mine] = parts[c][offset[mine]]
        return torch.from_numpy(out)

    def with_rows(
        self, updates: list[tuple[np.ndarray, np.ndarray]], meta: EmbeddingMeta
    ) -> ChunkedEmbeddings:
        """A new version: per layer ``(rows, values)`` written (int64 ids, float32 [len, dim]),
        grown to ``meta.num_nodes`` rows (new rows zero until written); chunks without a
        written or new row are shared with this version."""
        out = []
        for (rows, values), parts, dim in zip(updates, self.chunks, meta.dims, strict=True):
            parts = _grown(parts, meta.num_nodes, dim)
            which, offset = np.divmod(np.asarray(rows, np.int64), CHUNK_ROWS)
            for c in np.unique(which):
                mine = which == c
                fresh = parts[c].copy()  # copy-on-write: the old version keeps its chunk
                fresh[offset[mine]] = values[mine]
                parts[c] = fresh
            out.append(parts)
        return ChunkedEmbeddings(meta, out)


def _split(layer: np.ndarray) -> list[np.ndarray]:
    return [layer[i : i + CHUNK_ROWS].copy() for i in range(0, layer.shape[0], CHUNK_ROWS)]


def _grown(parts: list[np.ndarray], num_nodes: int, dim: int) -> list[np.ndarray]:
    """A new list of chunks covering ``num_nodes`` rows: the old chunks (shared), the last one
    copied and extended when it grows, zero chunks after it."""
    parts = list(parts)
    have = sum(p.shape[0] for p in parts)
    while have < num_nodes:
        if parts and parts[-1].shape[0] < CHUNK_ROWS:
            last = parts[-1]
            room = min(CHUNK_ROWS, last.shape[0] + num_nodes - have)
            grown = np.zeros((room, dim), np.float32)
            grown[: last.shape[0]] = last
            have += room - last.shape[0]
            parts[-1] = grown
        else:
            size = min(CHUNK_ROWS, num_nodes - have)
            parts.append(np.zeros((size, dim), np.float32))
            have += size
    return parts
