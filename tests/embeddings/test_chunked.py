"""Copy-on-write PE chunks: a new version shares what it did not change, never writes the old."""

from __future__ import annotations

import numpy as np
import pytest

from gnnserve.embeddings.base import EmbeddingMeta
from gnnserve.embeddings.chunked import CHUNK_ROWS, ChunkedEmbeddings
from gnnserve.errors import InvalidInputError


def test_with_rows_copies_only_the_chunks_it_writes_and_grows_the_last() -> None:
    n = 2 * CHUNK_ROWS + 100  # three chunks, the last one short
    rng = np.random.default_rng(0)
    layers = [rng.standard_normal((n, 3)).astype(np.float32) for _ in range(2)]
    old = ChunkedEmbeddings.from_layers(EmbeddingMeta("m", "g.0", n, [3, 3]), layers)
    assert [c.shape[0] for c in old.chunks[0]] == [CHUNK_ROWS, CHUNK_ROWS, 100]
    ids = rng.permutation(n)[:500]
    np.testing.assert_array_equal(old.get(2, ids).numpy(), layers[1][ids])
    assert old.get(1, np.zeros(0, np.int64)).shape == (0, 3)  # no ids: no rows, no error
    np.testing.assert_array_equal(old.layer(1), layers[0])

    rows = np.array([5, CHUNK_ROWS - 1], np.int64)  # both in chunk 0
    values = np.ones((2, 3), np.float32)
    empty = (np.zeros(0, np.int64), np.zeros((0, 3), np.float32))
    new = old.with_rows([(rows, values), empty], EmbeddingMeta("m", "g.1", n, [3, 3]))
    assert new.chunks[0][0] is not old.chunks[0][0]
    assert new.chunks[0][1] is old.chunks[0][1] and new.chunks[0][2] is old.chunks[0][2]
    assert all(a is b for a, b in zip(new.chunks[1], old.chunks[1], strict=True))
    np.testing.assert_array_equal(old.layer(1), layers[0])  # the old version is unchanged
    want = layers[0].copy()
    want[rows] = 1.0
    np.testing.assert_array_equal(new.layer(1), want)

    grown = new.with_rows(
        [(np.array([n + 3], np.int64), np.full((1, 3), 7.0, np.float32)), empty],
        EmbeddingMeta("m", "g.2", n + 4, [3, 3]),
    )
    assert grown.chunks[0][1] is new.chunks[0][1] and grown.chunks[0][2] is not new.chunks[0][2]
    tail = grown.get(1, np.arange(n - 1, n + 4)).numpy()
    np.testing.assert_array_equal(tail[:, 0], [want[n - 1, 0], 0.0, 0.0, 0.0, 7.0])
    assert new.meta.num_nodes == n and new.chunks[0][2].shape[0] == 100
    with pytest.raises(InvalidInputError, match="ids"):
        new.get(1, np.array([n]))
    with pytest.raises(InvalidInputError, match="layer"):
        new.get(3, np.array([0]))
