"""RemoteCSR: rows read by byte ranges equal the local CSR's; bytes read are exactly the ranges."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from gnnserve.data.blobs import open_blobs
from gnnserve.data.publish import SELF_LOOPS, publish, self_loop_ids
from gnnserve.errors import StoreFormatError
from gnnserve.graph import open_graph_store
from gnnserve.graph.remote import RemoteCSR


def union_length(lo: np.ndarray, hi: np.ndarray) -> int:
    """Total length of the union of intervals [lo, hi) (plain loop: the reference)."""
    total, end = 0, -1
    for a, b in sorted(zip(lo.tolist(), hi.tolist(), strict=True)):
        if a >= end:
            total += b - a
        elif b > end:
            total += b - end
        end = max(end, b)
    return total


def test_fetch_rows_equals_local_neighbours(small_store: Path) -> None:
    local = open_graph_store(small_store)
    remote = RemoteCSR(open_blobs(small_store.as_uri()))
    nodes = np.array([5, 6, 7, 1999, 0, 5, 42], dtype=np.int64)  # adjacent ids and a repeat
    got = remote.fetch_rows(nodes)
    np.testing.assert_array_equal(got.degree, local.in_degree(nodes))
    for i, v in enumerate(nodes.tolist()):
        row = got.indices[got.row_start[i] : got.row_start[i] + got.degree[i]]
        np.testing.assert_array_equal(row, local.neighbors(v))
    # bytes: exactly the union of the row-index pairs plus each row's segment
    pairs = union_length(nodes * 8, nodes * 8 + 16)
    unique = np.unique(nodes)
    starts = local.csr()[0][unique]
    segments = union_length(starts * 4, (starts + local.in_degree(unique)) * 4)
    assert got.bytes_read == pairs + segments
    # 5, 6, 7 are one pair range and one segment range; the repeat of 5 overlaps it
    assert got.requests == 4 + 4


def test_gcn_degree_uses_the_self_loop_table(small_store: Path, tmp_path: Path) -> None:
    remote = RemoteCSR(open_blobs(small_store.as_uri()))
    nodes = np.array([1, 2, 3])
    degree = remote.fetch_degrees(nodes)[1]
    remote.self_loops = np.array([2, 2, 3])
    np.testing.assert_array_equal(remote.gcn_degree(nodes, degree), degree - [0, 2, 1])
    indptr = np.array([0, 2, 3, 5])
    indices = np.array([0, 1, 1, 2, 2])
    np.testing.assert_array_equal(self_loop_ids(indptr, indices), [0, 1, 2, 2])


def test_truncated_remote_file_is_refused(small_store: Path, tmp_path: Path) -> None:
    for path in small_store.iterdir():
        (tmp_path / path.name).write_bytes(path.read_bytes())
    data = (tmp_path / "indices.bin").read_bytes()
    (tmp_path / "indices.bin").write_bytes(data[:-4])
    with pytest.raises(StoreFormatError, match="indices.bin"):
        RemoteCSR(open_blobs(str(tmp_path)))


def test_self_loops_are_read_without_listing_the_store(small_store: Path, tmp_path: Path) -> None:
    """Opening reads self_loops.npy by name (a listing of a blocked store names every block)."""
    url = (tmp_path / "pub").as_uri()
    publish(small_store, url, progress=False, block_bytes=4096)
    blobs = open_blobs(url)
    blobs.names = lambda: pytest.fail("listed the store")  # type: ignore[method-assign]
    indptr, indices = open_graph_store(small_store).csr()
    np.testing.assert_array_equal(RemoteCSR(blobs).self_loops, self_loop_ids(indptr, indices))
    (tmp_path / "pub" / SELF_LOOPS).unlink()  # an older store without the table
    assert RemoteCSR(open_blobs(url)).self_loops is None
