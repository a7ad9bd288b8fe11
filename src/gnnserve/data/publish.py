"""``gnnserve publish``: upload a prepared store to a blob store, unchanged, for remote serving.

The store's files go as they are (``indptr.bin``, ``indices.bin``, ``features.bin``, labels and
masks when present), plus ``self_loops.npy`` (the ids of vertices with a self loop, once per
loop: what a remote reader needs for GCN degrees without reading whole rows). ``meta.json`` goes
last, so a reader never finds a store whose data files are incomplete. Sizes are checked after
the upload. A non-empty destination is refused unless ``overwrite``.
"""

from __future__ import annotations

import io
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from gnnserve.data import layout
from gnnserve.data.blobs import open_blobs
from gnnserve.errors import InvalidInputError, StoreFormatError
from gnnserve.urls import local_path

log = logging.getLogger(__name__)
SELF_LOOPS = "self_loops.npy"


@dataclass
class PublishReport:
    """What ``publish`` uploaded."""

    url: str  # destination
    files: list[str]  # object names, in upload order
    bytes: int  # payload bytes uploaded
    seconds: float  # wall time


def self_loop_ids(indptr: np.ndarray, indices: np.ndarray) -> np.ndarray:
    """Sorted int64 ids of the vertices with a self loop, once per loop."""
    dst = np.repeat(np.arange(indptr.size - 1, dtype=np.int64), np.diff(indptr))
    return np.sort(dst[np.asarray(indices) == dst])


def _self_loops_npy(root: Path, meta: layout.StoreMeta) -> bytes:
    n, e = meta.num_nodes, meta.num_edges
    indptr = layout.open_array(root, layout.INDPTR, "int64", (n + 1,), mmap=True)
    indices = layout.open_array(root, layout.INDICES, meta.indices_dtype, (e,), mmap=True)
    buf = io.BytesIO()
    np.save(buf, self_loop_ids(np.asarray(indptr), indices), allow_pickle=False)
    return buf.getvalue()


def publish(
    store_dir: str | Path,
    to_url: str,
    options: Mapping[str, str] | None = None,
    overwrite: bool = False,
    progress: bool = True,
) -> PublishReport:
    """Upload the store at ``store_dir`` to ``to_url`` (``s3://bucket/prefix`` or a directory)."""
    root = local_path(store_dir, "store")
    meta = layout.read_meta(root)  # refuses a directory that is not a store
    blobs = open_blobs(to_url, options)
    if blobs.names() and not overwrite:
        raise InvalidInputError(
            f"{to_url} is not empty: pass overwrite (--overwrite) to replace it", "to"
        )
    start = time.perf_counter()
    files = [p.name for p in layout.data_files(root, meta)]
    sent = 0
    for name in files:
        size = (root / name).stat().st_size
        if progress:
            log.info("uploading %s (%.1f MB) to %s", name, size / 1e6, to_url)
        blobs.put_file(name, root / name)
        sent += size
    loops = _self_loops_npy(root, meta)
    blobs.put(SELF_LOOPS, loops)
    meta_bytes = (root / layout.META).read_bytes()
    blobs.put(layout.META, meta_bytes)
    for name in files:
        if blobs.size(name) != (root / name).stat().st_size:
            raise StoreFormatError(f"{to_url}/{name}: size differs after the upload", "to")
    done = [*files, SELF_LOOPS, layout.META]
    report = PublishReport(
        to_url, done, sent + len(loops) + len(meta_bytes), time.perf_counter() - start
    )
    log.info("published %d files, %.1f MB in %.1f s", len(done), report.bytes / 1e6, report.seconds)
    return report
