"""Key ranges that grow: every id has one owner, and each owner's rows are dense and invertible."""

from __future__ import annotations

import numpy as np
import pytest

from gnnserve.deploy.dgs.partition import KeyRanges


@pytest.mark.parametrize(("base", "parts", "grown"), [(10, 3, 17), (0, 2, 5), (7, 1, 4), (5, 4, 0)])
def test_owned_rows_are_dense_and_invert(base: int, parts: int, grown: int) -> None:
    ranges = KeyRanges(base, parts)
    ids = np.arange(base + grown)
    owner = ranges.owner(ids)
    assert owner.min(initial=0) >= 0 and owner.max(initial=0) < parts
    for part in range(parts):
        owned = ranges.owned(part)
        mine = ids[owner == part]
        rows = owned.rows(mine)
        np.testing.assert_array_equal(rows, np.arange(mine.size))  # dense, in id order
        np.testing.assert_array_equal(owned.vertices(rows), mine)
        assert owned.count(base + grown) == mine.size
    # the first graph's ids stay in contiguous ranges; added ids go round-robin
    np.testing.assert_array_equal(owner[base:], np.arange(grown) % parts)
    assert np.all(np.diff(owner[:base]) >= 0)
