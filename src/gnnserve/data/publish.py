"""``gnnserve publish``: upload a prepared store to a blob store, unchanged, for remote serving.

The store's files go as they are (``indptr.bin``, ``indices.bin``, ``features.bin``, labels and
masks when present: :func:`gnnserve.data.layout.data_files`), plus ``self_loops.npy`` (the ids of
vertices with a self loop, once per loop: what a remote reader needs for GCN degrees without
reading whole rows). ``meta.json`` goes last, so a reader never finds a store whose data files
are incomplete (overwriting removes the old ``meta.json`` first; other old objects are replaced
or left). Every object's size is checked after the upload. A non-empty destination is refused
unless ``overwrite``.

A file larger than ``block_bytes`` (default 1 MiB; 0 keeps every file whole) goes as block
objects listed in ``blocks.json`` (:mod:`gnnserve.data.blocks`: why, and how readers use them),
uploaded :data:`UPLOAD_THREADS` at a time.
"""

from __future__ import annotations

import io
import logging
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from gnnserve.data import layout
from gnnserve.data.blobs import BlobStore, open_blobs
from gnnserve.data.blocks import (
    DEFAULT_BLOCK_BYTES,
    MANIFEST,
    BlockManifest,
    block_count,
    block_name,
)
from gnnserve.errors import InvalidInputError, StoreFormatError
from gnnserve.urls import local_path

__all__ = ["SELF_LOOPS", "PublishReport", "publish", "self_loop_ids"]

log = logging.getLogger(__name__)
SELF_LOOPS = "self_loops.npy"
_CHUNK_EDGES = 1 << 23  # edges scanned at once for self loops (bounded memory)
UPLOAD_THREADS = 8  # block uploads in flight


@dataclass
class PublishReport:
    """What ``publish`` uploaded."""

    url: str  # destination, as given
    files: list[str]  # file names, in upload order (meta.json last)
    bytes: int  # payload bytes uploaded
    seconds: float  # wall time of the upload and the size checks
    blocks: int = 0  # block objects the files above the block size went as


def self_loop_ids(
    indptr: np.ndarray, indices: np.ndarray, chunk_edges: int = _CHUNK_EDGES
) -> np.ndarray:
    """Sorted int64 ids of the vertices with a self loop, once per loop, scanning about
    ``chunk_edges`` edges at a time (CSR rows: vertex v's neighbours are
    ``indices[indptr[v]:indptr[v + 1]]``)."""
    indptr = np.asarray(indptr, dtype=np.int64)
    n, found, row = indptr.size - 1, [np.empty(0, dtype=np.int64)], 0
    while row < n:
        stop = int(np.searchsorted(indptr, indptr[row] + chunk_edges, side="right")) - 1
        stop = min(max(stop, row + 1), n)
        dst = np.repeat(np.arange(row, stop, dtype=np.int64), np.diff(indptr[row : stop + 1]))
        found.append(dst[np.asarray(indices[indptr[row] : indptr[stop]]) == dst])
        row = stop
    return np.concatenate(found)


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
    block_bytes: int = DEFAULT_BLOCK_BYTES,
) -> PublishReport:
    """Upload the store at ``store_dir`` to ``to_url`` (``s3://bucket/prefix``, a directory or a
    ``file://`` URL); ``options``: object-store settings (default: the AWS_* environment);
    ``progress``: log a line per file; ``block_bytes``: files above this size go as blocks (0:
    none). StoreFormatError for a directory that is not a store or a size that differs after the
    upload; InvalidInputError for a non-empty destination or a negative block size."""
    if block_bytes < 0:
        raise InvalidInputError(f"block size must be >= 0 bytes, got {block_bytes}", "block_bytes")
    root = local_path(store_dir, "store")
    meta = layout.read_meta(root)  # refuses a directory that is not a store
    blobs = open_blobs(to_url, options)
    if blobs.names() and not overwrite:
        raise InvalidInputError(
            f"{to_url} is not empty: pass overwrite (--overwrite) to replace it", "to"
        )
    start = time.perf_counter()
    blobs.delete(layout.META)  # overwriting: no reader takes the prefix for a store meanwhile
    blobs.delete(MANIFEST)
    sizes: dict[str, int] = {}  # object uploaded -> its size, to check
    files: list[str] = []  # the store's files, in upload order
    blocked = BlockManifest(block_bytes or DEFAULT_BLOCK_BYTES)
    for i, path in enumerate(layout.data_files(root, meta), 1):
        size = path.stat().st_size
        whole = block_bytes == 0 or size <= block_bytes
        if progress:
            how = "" if whole else f" as {block_count(size, block_bytes)} blocks"
            log.info("[%d] uploading %s (%.1f MB)%s to %s", i, path.name, size / 1e6, how, to_url)
        files.append(path.name)
        if whole:
            blobs.put_file(path.name, path)
            sizes[path.name] = size
        else:
            blocked.objects[path.name] = size
            sizes.update(_put_blocks(blobs, path, block_bytes))
    loops = _self_loops_npy(root, meta)
    blobs.put(SELF_LOOPS, loops)
    sizes[SELF_LOOPS] = len(loops)
    files.append(SELF_LOOPS)
    _check_sizes(blobs, sizes, to_url)  # complete before meta.json makes it a store
    last = {layout.META: (root / layout.META).read_bytes()}
    if blocked.objects:
        last = {MANIFEST: blocked.to_json(), **last}
    for name, data in last.items():
        blobs.put(name, data)
        blobs.forget_manifest()
        _check_sizes(blobs, {name: len(data)}, to_url)
        sizes[name] = len(data)
        files.append(name)
    n_blocks = sum(blocked.blocks(name) for name in blocked.objects)
    report = PublishReport(
        to_url, files, sum(sizes.values()), time.perf_counter() - start, n_blocks
    )
    if progress:
        log.info(
            "published %d files (%d blocks), %.1f MB in %.1f s",
            len(files),
            n_blocks,
            report.bytes / 1e6,
            report.seconds,
        )
    return report


def _put_blocks(blobs: BlobStore, path: Path, block_bytes: int) -> dict[str, int]:
    """Upload file ``path`` as block objects of ``block_bytes``; their names and sizes."""
    size = path.stat().st_size
    names = [block_name(path.name, i) for i in range(block_count(size, block_bytes))]

    def put(index: int) -> int:
        with path.open("rb") as f:
            f.seek(index * block_bytes)
            data = f.read(block_bytes)
        blobs.put(names[index], data)
        return len(data)

    with ThreadPoolExecutor(UPLOAD_THREADS) as pool:
        return dict(zip(names, pool.map(put, range(len(names))), strict=True))


def _check_sizes(blobs: BlobStore, sizes: Mapping[str, int], to_url: str) -> None:
    """StoreFormatError naming the first object whose uploaded size is not ``sizes[name]``."""
    for name, size in sizes.items():
        got = blobs.size(name)
        if got != size:
            raise StoreFormatError(
                f"{to_url}: {name} is {got} bytes after the upload, {size} here", "to"
            )
