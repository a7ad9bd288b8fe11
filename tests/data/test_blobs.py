"""Blob stores: the local-directory backend and range coalescing, against plain byte slicing."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from gnnserve.data.blobs import coalesce, open_blobs
from gnnserve.errors import InvalidInputError, StoreFormatError


def test_local_ranges_equal_slices_and_are_counted(tmp_path: Path) -> None:
    data = np.random.default_rng(0).bytes(10_000)
    (tmp_path / "a.bin").write_bytes(data)
    blobs = open_blobs(tmp_path.as_uri())
    starts, ends = [0, 17, 9_990, 5_000], [10, 17, 10_000, 6_024]
    parts = blobs.get_ranges("a.bin", starts, ends)
    assert parts == [data[s:e] for s, e in zip(starts, ends, strict=True)]
    assert blobs.stats.requests == 4
    assert blobs.stats.bytes_read == sum(e - s for s, e in zip(starts, ends, strict=True))
    assert blobs.get("a.bin") == data and blobs.size("a.bin") == 10_000


def test_local_errors_name_the_problem(tmp_path: Path) -> None:
    blobs = open_blobs(str(tmp_path))
    with pytest.raises(StoreFormatError, match="not found"):
        blobs.get_ranges("missing.bin", [0], [4])
    (tmp_path / "a.bin").write_bytes(b"abc")
    with pytest.raises(StoreFormatError, match="past the end"):
        blobs.get_ranges("a.bin", [0], [4])
    with pytest.raises(InvalidInputError, match="start <= end"):
        blobs.get_ranges("a.bin", [2], [1])
    with pytest.raises(InvalidInputError, match="bad object name"):
        blobs.get("../etc/passwd")


def test_put_then_names(tmp_path: Path) -> None:
    blobs = open_blobs(str(tmp_path / "root"))
    blobs.put("x/y.bin", b"123")
    assert blobs.names() == ["x/y.bin"] and blobs.get("x/y.bin") == b"123"


@pytest.mark.parametrize("gap", [0, 3, 50])
def test_coalesce_matches_a_plain_merge(gap: int) -> None:
    rng = np.random.default_rng(gap)
    starts = rng.integers(0, 1_000, 200)
    ends = starts + rng.integers(0, 20, 200)
    merged_lo, merged_hi, group = coalesce(starts, ends, gap)
    # reference: sort and merge in plain Python
    ref: list[list[int]] = []
    for s, e in sorted(zip(starts.tolist(), ends.tolist(), strict=True)):
        if ref and s <= ref[-1][1] + gap:
            ref[-1][1] = max(ref[-1][1], e)
        else:
            ref.append([s, e])
    assert [[int(a), int(b)] for a, b in zip(merged_lo, merged_hi, strict=True)] == ref
    assert np.all(merged_lo[group] <= starts) and np.all(ends <= merged_hi[group])
