"""Blob stores: named byte objects under one root, read whole or by byte ranges.

A prepared store (``indptr.bin``, ``indices.bin``, ``features.bin``, ``meta.json``) published to a
blob store is read without downloading it: the remote graph and feature backends ask for exactly
the byte ranges a request needs. Backends are chosen by the URL scheme from :data:`BLOB_STORES`:
``file`` (a local directory, the embedded default) and ``s3`` (an S3-compatible object store,
read with obstore). Both serve the same calls, so one code path reads both.

``get_ranges`` fetches exactly the ranges it is given, concurrently where the backend can, one
request per range; callers merge adjacent ranges first with :func:`coalesce` (object stores'
own coalescing merges ranges up to 1 MiB apart, which would make bytes read grow with the graph
instead of the request). Every backend counts its requests and bytes in :attr:`BlobStore.stats`.

A store published with a block manifest (:mod:`gnnserve.data.blocks`) keeps its large files as
fixed-size block objects; ``size``, ``get`` and ``get_ranges`` read them as the one object they
stand for (a range crossing a block boundary costs one request per block it touches).
"""

from __future__ import annotations

import abc
import os
import shutil
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from gnnserve.data.blocks import MANIFEST, BlockManifest, block_name, split_ranges
from gnnserve.errors import InvalidInputError, StoreFormatError
from gnnserve.registry import Registry
from gnnserve.urls import resolve

__all__ = ["BLOB_STORES", "BlobStore", "FetchStats", "LocalBlobStore", "coalesce", "open_blobs"]


@dataclass
class FetchStats:
    """Requests issued and bytes read by a blob store since it was opened (thread-safe adds)."""

    requests: int = 0  # range or whole-object GETs
    bytes_read: int = 0  # payload bytes received

    def __post_init__(self) -> None:
        self._lock = threading.Lock()

    def add(self, requests: int, nbytes: int) -> None:
        """Count ``requests`` GETs that returned ``nbytes`` bytes in all."""
        with self._lock:
            self.requests += requests
            self.bytes_read += nbytes


class BlobStore(abc.ABC):
    """Named objects under one root URL; subclasses implement the ``_`` methods."""

    def __init__(self, url: str) -> None:
        self.url = url  # the root this store reads, as given
        self.stats = FetchStats()
        self._manifest: BlockManifest | None = None  # read on first use
        self._manifest_lock = threading.Lock()

    @abc.abstractmethod
    def _size(self, name: str) -> int:
        """Length of stored object ``name`` in bytes; StoreFormatError when it is missing."""

    @abc.abstractmethod
    def _get(self, name: str) -> bytes:
        """The whole object."""

    @abc.abstractmethod
    def _get_optional(self, name: str) -> bytes | None:
        """The whole object, or None when there is none of that name."""

    def _get_many(self, requests: list[tuple[str, int, int]], bulk: bool = False) -> list[bytes]:
        """Bytes ``[lo, hi)`` of object ``name`` for each non-empty ``(name, lo, hi)``, one
        request each (backends that can issue them all at once override this). ``bulk``: a
        whole-object download, which no per-call request deadline cuts short."""
        out: list[bytes] = [b""] * len(requests)
        by_name: dict[str, list[int]] = {}
        for i, (name, _, _) in enumerate(requests):
            by_name.setdefault(name, []).append(i)
        for name, idx in by_name.items():
            lo, hi = [requests[i][1] for i in idx], [requests[i][2] for i in idx]
            parts = self._get_ranges(name, lo, hi)
            for i, part in zip(idx, parts, strict=True):
                out[i] = part
        return out

    def manifest(self) -> BlockManifest:
        """The store's block manifest (empty when it has none), read once."""
        with self._manifest_lock:
            if self._manifest is None:
                data = self._get_optional(MANIFEST)
                where = f"{self.url}/{MANIFEST}"
                parsed = None if data is None else BlockManifest.parse(data, where)
                self._manifest = parsed or BlockManifest()
            return self._manifest

    def forget_manifest(self) -> None:
        """Read the manifest again on next use (after a publish rewrote it)."""
        with self._manifest_lock:
            self._manifest = None

    def size(self, name: str) -> int:
        """Length of object ``name`` in bytes; StoreFormatError naming it when it is missing."""
        blocked = self.manifest().objects
        return blocked[name] if name in blocked else self._size(name)

    @abc.abstractmethod
    def _get_ranges(self, name: str, starts: list[int], ends: list[int]) -> list[bytes]:
        """The bytes ``[starts[i], ends[i])`` of ``name``, one request per range."""

    @abc.abstractmethod
    def put(self, name: str, data: bytes | memoryview) -> None:
        """Write object ``name`` (replacing it)."""

    @abc.abstractmethod
    def names(self) -> list[str]:
        """Names of the objects under the root, sorted."""

    def put_file(self, name: str, path: Path) -> None:
        """Upload local file ``path`` as object ``name`` (backends may stream it)."""
        self.put(name, path.read_bytes())

    def delete(self, name: str) -> None:
        """Remove object ``name`` if it exists."""
        raise NotImplementedError(f"{type(self).__name__} cannot delete objects")

    def get(self, name: str) -> bytes:
        """Object ``name`` whole (one request, or one per block, counted)."""
        manifest = self.manifest()
        if name in manifest.objects:
            size, step = manifest.objects[name], manifest.block_bytes
            blocks = [
                (block_name(name, i), 0, min(step, size - i * step))
                for i in range(manifest.blocks(name))
            ]
            parts = self._get_many(blocks, bulk=True)
            self._check_lengths(name, blocks, parts)
            data = b"".join(parts)
            self.stats.add(len(parts), len(data))
            return data
        data = self._get(name)
        self.stats.add(1, len(data))
        return data

    def get_optional(self, name: str) -> bytes | None:
        """Object ``name`` whole, or None when the store has none of that name (one request,
        not a listing of every object)."""
        if name in self.manifest().objects:
            return self.get(name)
        data = self._get_optional(name)
        if data is not None:
            self.stats.add(1, len(data))
        return data

    def get_ranges(
        self, name: str, starts: Sequence[int] | np.ndarray, ends: Sequence[int] | np.ndarray
    ) -> list[bytes]:
        """Bytes ``[starts[i], ends[i])`` of ``name`` for every i, exactly those ranges (one
        request each, issued concurrently where the backend can). Empty ranges are allowed."""
        lo = np.asarray(starts, dtype=np.int64).ravel()
        hi = np.asarray(ends, dtype=np.int64).ravel()
        if lo.shape != hi.shape or bool(np.any(lo < 0)) or bool(np.any(hi < lo)):
            raise InvalidInputError(
                f"byte ranges of {name!r} need 0 <= start <= end, as many starts as ends", "ranges"
            )
        if lo.size == 0:
            return []
        manifest = self.manifest()
        if name in manifest.objects:
            return self._get_blocked_ranges(name, manifest, lo, hi)
        parts = self._get_ranges(name, lo.tolist(), hi.tolist())
        self.stats.add(len(parts), sum(len(p) for p in parts))
        return parts

    def _get_blocked_ranges(
        self, name: str, manifest: BlockManifest, lo: np.ndarray, hi: np.ndarray
    ) -> list[bytes]:
        """``get_ranges`` of a blocked object: each range cut at block boundaries, every piece
        fetched at once, the pieces of a range joined in order."""
        self._check_end(name, int(hi.max()), manifest.objects[name])
        wanted = np.flatnonzero(hi > lo)
        block, b_lo, b_hi, owner = split_ranges(lo[wanted], hi[wanted], manifest.block_bytes)
        pieces = [
            (block_name(name, b), a, z)
            for b, a, z in zip(block.tolist(), b_lo.tolist(), b_hi.tolist(), strict=True)
        ]
        parts = self._get_many(pieces)
        self._check_lengths(name, pieces, parts)
        self.stats.add(len(parts), sum(len(p) for p in parts))
        out = [b""] * lo.size
        if owner.size == wanted.size:  # no range crossed a boundary: one piece each
            for i, part in zip(wanted.tolist(), parts, strict=True):
                out[i] = part
            return out
        starts = np.flatnonzero(np.r_[True, owner[1:] != owner[:-1]]).tolist() + [owner.size]
        for k, i in enumerate(wanted.tolist()):
            out[i] = b"".join(parts[starts[k] : starts[k + 1]])
        return out

    def _check_end(self, name: str, end: int, size: int) -> None:
        """StoreFormatError when a range ending at byte ``end`` runs past object ``name`` of
        ``size`` bytes."""
        if end > size:
            raise StoreFormatError(
                f"{self.url}: range end {end} past the end of {name!r} ({size} bytes)", "remote"
            )

    def _check_lengths(
        self, name: str, pieces: list[tuple[str, int, int]], parts: list[bytes]
    ) -> None:
        """StoreFormatError when a block returned fewer bytes than asked (a truncated block)."""
        for (block, a, z), part in zip(pieces, parts, strict=True):
            if len(part) != z - a:
                raise StoreFormatError(
                    f"{self.url}: block {block!r} of {name!r} is shorter than its manifest says",
                    "remote",
                )


BLOB_STORES: Registry[BlobStore] = Registry("blob_store")


@BLOB_STORES.register("file")
class LocalBlobStore(BlobStore):
    """Objects as files in a local directory, read with ``os.pread`` (the embedded default)."""

    def __init__(self, url: str, root: Path) -> None:
        super().__init__(url)
        self.root = root

    def _path(self, name: str) -> Path:
        if not name or name.startswith("/") or ".." in Path(name).parts:
            raise InvalidInputError(f"bad object name {name!r}", "name")
        return self.root / name

    def _size(self, name: str) -> int:
        try:
            return self._path(name).stat().st_size
        except FileNotFoundError:
            raise StoreFormatError(f"{self.url}: object {name!r} not found", "remote") from None

    def _get(self, name: str) -> bytes:
        self._size(name)
        return self._path(name).read_bytes()

    def _get_optional(self, name: str) -> bytes | None:
        path = self._path(name)
        return path.read_bytes() if path.is_file() else None

    def _get_ranges(self, name: str, starts: list[int], ends: list[int]) -> list[bytes]:
        if ends:
            self._check_end(name, max(ends), self._size(name))
        fd = os.open(self._path(name), os.O_RDONLY)
        try:
            return [os.pread(fd, hi - lo, lo) for lo, hi in zip(starts, ends, strict=True)]
        finally:
            os.close(fd)

    def put(self, name: str, data: bytes | memoryview) -> None:
        path = self._path(name)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".part")
        tmp.write_bytes(data)
        os.replace(tmp, path)

    def put_file(self, name: str, path: Path) -> None:
        """Copy ``path`` in (never whole in memory)."""
        target = self._path(name)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(target.name + ".part")
        shutil.copyfile(path, tmp)
        os.replace(tmp, target)

    def delete(self, name: str) -> None:
        self._path(name).unlink(missing_ok=True)

    def names(self) -> list[str]:
        if not self.root.is_dir():
            return []
        return sorted(str(p.relative_to(self.root)) for p in self.root.rglob("*") if p.is_file())


def coalesce(
    starts: np.ndarray, ends: np.ndarray, gap: int = 0
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Merge byte ranges that overlap or lie at most ``gap`` bytes apart.

    Returns (merged_starts, merged_ends, group): ``group[i]`` is the merged range that holds
    input range i, so range i is ``merged[group[i]][starts[i] - merged_starts[group[i]] : ...]``.
    Inputs need not be sorted. Vectorised: O(n log n) for the sort.
    """
    lo = np.asarray(starts, dtype=np.int64)
    hi = np.asarray(ends, dtype=np.int64)
    if lo.size == 0:
        empty = np.empty(0, dtype=np.int64)
        return empty, empty, empty
    order = np.argsort(lo, kind="stable")
    s, e = lo[order], hi[order]
    reach = np.maximum.accumulate(e)  # furthest end covered so far
    new_group = np.empty(s.size, dtype=bool)
    new_group[0] = True
    new_group[1:] = s[1:] > reach[:-1] + gap
    group_sorted = np.cumsum(new_group) - 1
    first = np.flatnonzero(new_group)
    merged_starts = s[first]
    merged_ends = np.maximum.reduceat(e, first)
    group = np.empty(lo.size, dtype=np.int64)
    group[order] = group_sorted
    return merged_starts, merged_ends, group


def open_blobs(url: str, options: Mapping[str, str] | None = None) -> BlobStore:
    """The blob store at ``url``: a local directory (path or ``file://``) or ``s3://bucket/prefix``.

    ``options``: backend settings (for s3: endpoint, credentials; default from the environment).
    """
    location = resolve(url, "remote")
    if location.scheme == "file":
        return BLOB_STORES.create("file", str(url), location.path)
    if location.scheme == "s3" and "s3" not in BLOB_STORES.names():
        _import_s3()
    return BLOB_STORES.create(location.scheme, str(url), location, options)


def _import_s3() -> None:
    """Register the s3 backend (obstore is the optional ``faas`` extra)."""
    try:
        import gnnserve.data.s3  # noqa: F401
    except ImportError as exc:
        raise InvalidInputError(
            f"s3:// stores need obstore ({exc}): pip install 'gnnserve[faas]'", "remote"
        ) from exc
