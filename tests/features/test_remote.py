"""RemoteFeatures: rows read by byte ranges equal the local table; requests and bytes counted."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from gnnserve.data.blobs import open_blobs
from gnnserve.data.layout import read_meta
from gnnserve.features import open_feature_store
from gnnserve.features.remote import RemoteFeatures


def test_rows_equal_local_and_ranges_merge(small_store: Path) -> None:
    local = open_feature_store(small_store)
    remote = RemoteFeatures(open_blobs(small_store.as_uri()), read_meta(small_store))
    ids = np.array([9, 3, 4, 5, 1999, 9, 0], dtype=np.int64)
    rows, requests, nbytes = remote.read_counted(ids)
    np.testing.assert_array_equal(rows.numpy(), local.get(ids).numpy())
    assert requests == 4  # {0}, {3, 4, 5}, {9}, {1999}
    assert nbytes == 6 * 16 * 4  # six distinct rows of 16 float32
    np.testing.assert_array_equal(remote.get(ids[:0]).numpy(), np.empty((0, 16), np.float32))
