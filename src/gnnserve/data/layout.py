"""The on-disk store layout: file names, ``meta.json`` schema and its reader (``data.meta``).

A store directory holds the graph as CSR over *in*-neighbours (row ``v`` lists the sources ``u`` of
edges ``u -> v``, the order message passing reads them), features as a raw little-endian array that
can be memory-mapped, labels and split masks as ``.npy``, and ``meta.json``.
"""

from __future__ import annotations

import hashlib
import json
import mmap as _mmap
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from gnnserve.data.meta import parse_meta_text, read_meta_file
from gnnserve.errors import StoreFormatError
from gnnserve.urls import local_path

if TYPE_CHECKING:
    from gnnserve.data.blobs import BlobStore

FORMAT_VERSION = 1
META = "meta.json"
INDPTR = "indptr.bin"
INDICES = "indices.bin"
FEATURES = "features.bin"
LABELS = "labels.npy"
MASKS = ("train_mask", "val_mask", "test_mask")


@dataclass
class StoreMeta:
    """Contents of ``meta.json``: counts, dtypes, dims and a content checksum."""

    name: str  # dataset name
    num_nodes: int  # N
    num_edges: int  # directed edges stored in the CSR
    feature_dim: int  # F
    feature_dtype: str  # "float32" | "float16", little-endian on disk
    indices_dtype: str  # "int32" when N fits, else "int64"
    num_classes: int  # 0 when unlabelled
    checksum: str = ""  # blake2b-128 over the data files, hex
    indptr_dtype: str = "int64"  # row pointers are always int64
    format_version: int = FORMAT_VERSION  # bumped on incompatible layout changes
    has_labels: bool = False  # labels.npy present
    masks: list[str] = field(default_factory=list)  # which split masks are present
    source: str = ""  # where the data came from (importer / generator and its arguments)

    def to_json(self) -> str:
        """Serialise with stable key order."""
        return json.dumps(asdict(self), indent=2, sort_keys=True)


def read_meta(store_dir: str | Path) -> StoreMeta:
    """Read and check ``meta.json`` of ``store_dir`` (a path or file URL); raise StoreFormatError
    when unusable."""
    root = local_path(store_dir, "store")
    path = root / META
    doc = read_meta_file(
        path,
        "store",
        version=FORMAT_VERSION,
        missing=f"{root} is not a gnnserve store: {META} missing",
        default_version=FORMAT_VERSION,
    )
    return _store_meta(doc, str(path))


def read_blob_meta(blobs: BlobStore) -> StoreMeta:
    """``meta.json`` of the published store that ``blobs`` reads (an object-store or file URL)."""
    text = blobs.get(META).decode("utf-8", errors="replace")
    return parse_meta(text, f"{blobs.url}/{META}")


def parse_meta(text: str, where: str) -> StoreMeta:
    """A store's ``meta.json`` from its text, read from ``where`` (a URL: remote stores)."""
    doc = parse_meta_text(
        text, where, "store", version=FORMAT_VERSION, default_version=FORMAT_VERSION
    )
    return _store_meta(doc, where)


def _store_meta(doc: dict, where: str) -> StoreMeta:  # type: ignore[type-arg]
    try:
        return StoreMeta(**doc)
    except TypeError as exc:
        raise StoreFormatError(f"{where} is malformed: {exc}", "store") from exc


def data_files(store_dir: str | Path, meta: StoreMeta) -> list[Path]:
    """The files covered by the checksum, in a fixed order."""
    root = local_path(store_dir, "store")
    names = [INDPTR, INDICES, FEATURES]
    if meta.has_labels:
        names.append(LABELS)
    names += [f"{m}.npy" for m in meta.masks]
    return [root / n for n in names]


def checksum_files(paths: list[Path], chunk_bytes: int = 1 << 22) -> str:
    """blake2b-128 over the concatenated contents of ``paths`` (streamed, bounded memory)."""
    digest = hashlib.blake2b(digest_size=16)
    for path in paths:
        with open(path, "rb") as fh:
            while chunk := fh.read(chunk_bytes):
                digest.update(chunk)
    return digest.hexdigest()


def verify_checksum(store_dir: str | Path) -> StoreMeta:
    """Recompute the content checksum and compare it with ``meta.json``."""
    store_dir = local_path(store_dir, "store")
    meta = read_meta(store_dir)
    actual = checksum_files(data_files(store_dir, meta))
    if actual != meta.checksum:
        raise StoreFormatError(
            f"{store_dir}: checksum mismatch (meta {meta.checksum}, data {actual})", "store"
        )
    return meta


def open_array(
    store_dir: str | Path, name: str, dtype: str, shape: tuple[int, ...], mmap: bool
) -> np.ndarray:
    """Open a raw little-endian array file, memory-mapped or loaded into memory; read-only.

    In memory, the array is contiguous in native byte order, ready for numba kernels.
    """
    path = Path(store_dir) / name
    if not path.is_file():
        raise StoreFormatError(f"{path} missing", "store")
    expected = int(np.prod(shape)) * np.dtype(dtype).itemsize
    if path.stat().st_size != expected:
        raise StoreFormatError(
            f"{path}: {path.stat().st_size} bytes, expected {expected} for {dtype}{list(shape)}",
            "store",
        )
    le = np.dtype(dtype).newbyteorder("<")
    if expected == 0:
        return np.zeros(shape, dtype=le)
    if mmap:
        return np.memmap(path, dtype=le, mode="r", shape=shape)
    arr = read_hugepage_array(path, le, shape)
    if not le.isnative:
        arr = arr.astype(le.newbyteorder("="))
    arr.setflags(write=False)
    return arr


def read_hugepage_array(path: Path, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
    """Read a raw file into anonymous memory advised for transparent huge pages.

    Random row gathers from a large table are TLB-bound with 4 KiB pages: on a 1M x 128 float32
    table, huge pages made the feature gather several times faster (bench/sampling.py).
    """
    nbytes = int(np.prod(shape)) * dtype.itemsize
    buf = _mmap.mmap(-1, nbytes)
    if hasattr(_mmap, "MADV_HUGEPAGE"):
        buf.madvise(_mmap.MADV_HUGEPAGE)
    with open(path, "rb") as fh:
        view = memoryview(buf)
        read = 0
        while read < nbytes:
            n = fh.readinto(view[read:])
            if not n:
                raise StoreFormatError(f"{path}: truncated at byte {read}", "store")
            read += n
        view.release()
    return np.frombuffer(buf, dtype=dtype).reshape(shape)
