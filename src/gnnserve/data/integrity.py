"""Structural checks of a store's data files, run when a store is opened.

File sizes alone do not make a store safe: the numba samplers index ``indices`` with the row
pointers and the feature table with ``indices`` without bounds checks, so one bad entry crashes
the process (SIGSEGV), and one NaN feature poisons every answer that reads it. At open, every
backend checks the invariants these kernels rely on:

- ``meta.json``: counts are non-negative ints, dtypes are ones the layout allows;
- ``indptr.bin``: ``indptr[0] == 0``, non-decreasing, every entry in ``[0, E]``, ``indptr[N] == E``
  where ``E`` is the length of ``indices.bin`` (= ``meta.num_edges``, checked by the file size);
- ``indices.bin``: every entry a node id, ``0 <= v < N``;
- ``features.bin``: every value finite (float32 and float16);
- ``labels.npy`` and the split masks (when ``meta.json`` lists them): a readable ``.npy`` of
  one entry per node, labels integers in ``[-1, num_classes)`` (-1 = unlabelled), masks bool
  (or integer 0/1). The same checks guard precomputed embeddings' layer files (finite values).

The scans are numba loops over the arrays themselves (in RAM, or memory-mapped: each page read
once, in order), stopping at the first bad entry; they allocate nothing. A 10^8-edge store
(int32 ids) takes 0.3 s, 4M x 32 float32 features 0.35 s (2-core VM, page cache warm). A failed
check raises :class:`StoreFormatError` naming the file, the first bad position and its value.
``StoreConfig.check_structure = False`` skips the scans (not the ``meta.json`` checks) for stores
that were verified once; ``verify_checksum`` is the separate, slower full content hash.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import numba
import numpy as np

from gnnserve.data import layout
from gnnserve.errors import StoreFormatError

log = logging.getLogger(__name__)

_FIELD = "store"
# all-ones exponent bits mark inf and NaN
_NONFINITE_MASK: dict[str, np.unsignedinteger] = {
    "float32": np.uint32(0x7F800000),
    "float16": np.uint16(0x7C00),
}
_BITS: dict[str, np.dtype] = {"float32": np.dtype("<u4"), "float16": np.dtype("<u2")}
INDICES_DTYPES = ("int32", "int64")
FEATURE_DTYPES = tuple(_NONFINITE_MASK)


# Serial on purpose: the scans are memory-bound (~1.5 GB/s on one core), and loading a cached
# parallel=True kernel cost 1.5-3.5 s per process, more than the scan of 10^8 edges.


@numba.njit(nogil=True, cache=True)
def _indptr_scan(indptr: np.ndarray, num_edges: int) -> int:
    """The first ``i`` with ``indptr[i]`` outside ``[0, E]`` or below ``indptr[i-1]``, or -1."""
    prev = 0
    for i in range(indptr.shape[0]):
        v = indptr[i]
        if v < 0 or v > num_edges or v < prev:
            return i
        prev = v
    return -1


@numba.njit(nogil=True, cache=True)
def _range_scan(values: np.ndarray, lower: int, upper: int) -> int:
    """The first ``i`` with ``values[i]`` outside ``[lower, upper)``, or -1."""
    for i in range(values.shape[0]):
        v = values[i]
        if v < lower or v >= upper:
            return i
    return -1


@numba.njit(nogil=True, cache=True)
def _mask_scan(bits: np.ndarray, mask: np.integer) -> int:
    """The first ``i`` with every bit of ``mask`` set in ``bits[i]``, or -1."""
    for i in range(bits.shape[0]):
        if (bits[i] & mask) == mask:
            return i
    return -1


def check_meta(store_dir: str | Path, meta: layout.StoreMeta) -> None:
    """Check the counts and dtypes of ``meta.json`` that the openers size arrays with."""
    path = Path(store_dir) / layout.META
    for name in ("num_nodes", "num_edges", "feature_dim"):
        value = getattr(meta, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise StoreFormatError(
                f"{path}: {name} must be a non-negative int, got {value!r}", _FIELD
            )
    allowed = {
        "indptr_dtype": ("int64",),
        "indices_dtype": INDICES_DTYPES,
        "feature_dtype": FEATURE_DTYPES,
    }
    for name, choices in allowed.items():
        if getattr(meta, name) not in choices:
            raise StoreFormatError(
                f"{path}: {name} must be one of {list(choices)}, got {getattr(meta, name)!r}",
                _FIELD,
            )
    if meta.indices_dtype == "int32" and meta.num_nodes > np.iinfo(np.int32).max:
        raise StoreFormatError(f"{path}: {meta.num_nodes} nodes do not fit int32 indices", _FIELD)


def check_csr(store_dir: str | Path, indptr: np.ndarray, indices: np.ndarray, n: int) -> None:
    """Check the CSR invariants of ``indptr`` int [N+1] and ``indices`` int [E] over ``n`` nodes.

    Logs the time taken at INFO; raises StoreFormatError at the first bad entry.
    """
    start = time.perf_counter()
    root = Path(store_dir)
    if indptr.shape[0] != n + 1:
        raise StoreFormatError(
            f"{root / layout.INDPTR}: {indptr.shape[0]} entries, need {n + 1}", _FIELD
        )
    e = int(indices.shape[0])
    i = _indptr_scan(indptr, e)
    if i >= 0:
        v = int(indptr[i])
        why = (
            f"is outside [0, {e}] ({layout.INDICES} holds {e} entries)"
            if v < 0 or v > e
            else f"is less than entry {i - 1} = {int(indptr[i - 1])} (must not decrease)"
        )
        raise StoreFormatError(f"{root / layout.INDPTR}: entry {i} = {v} {why}", _FIELD)
    for i, want in ((0, 0), (n, e)):
        if int(indptr[i]) != want:
            raise StoreFormatError(
                f"{root / layout.INDPTR}: entry {i} = {int(indptr[i])}, must be {want} "
                f"({layout.INDICES} holds {e} entries)",
                _FIELD,
            )
    i = _range_scan(indices, 0, n)
    if i >= 0:
        raise StoreFormatError(
            f"{root / layout.INDICES}: entry {i} = {int(indices[i])} is not a node id (N = {n})",
            _FIELD,
        )
    _logged(f"graph: {n} nodes, {e} edges", store_dir, start)


def check_finite(
    store_dir: str | Path, table: np.ndarray, name: str = layout.FEATURES, field: str = _FIELD
) -> None:
    """Check that every value of the float32/float16 ``table`` [N, F] (file ``name`` of
    ``store_dir``) is finite; StoreFormatError naming ``field`` otherwise.

    ``table`` must be C-contiguous (as every opener returns it); logs the time taken at INFO.
    """
    start = time.perf_counter()
    kind = table.dtype.name
    if kind not in _NONFINITE_MASK or not table.flags.c_contiguous:
        raise StoreFormatError(f"cannot check a {kind} table of this layout", field)
    i = _mask_scan(table.reshape(-1).view(_BITS[kind]), _NONFINITE_MASK[kind])
    if i >= 0:
        row, col = divmod(i, table.shape[1])
        raise StoreFormatError(
            f"{Path(store_dir) / name}: row {row}, column {col} = "
            f"{float(table[row, col])} is not finite",
            field,
        )
    what = "features" if name == layout.FEATURES else name
    _logged(f"{what}: {table.shape[0]} x {table.shape[1]} {kind}", store_dir, start)


def _read_npy(path: Path, num_nodes: int) -> np.ndarray:
    """A listed ``.npy`` file of one entry per node, memory-mapped (opening a store for serving
    scans it without holding it in memory), read without unpickling anything."""
    if not path.is_file():
        raise StoreFormatError(f"{path}: missing ({layout.META} lists it)", _FIELD)
    try:
        arr = np.load(path, mmap_mode="r", allow_pickle=False)
    except Exception as exc:  # noqa: BLE001 - a damaged header raises SyntaxError, TypeError, ...
        raise StoreFormatError(f"{path}: not a readable .npy array ({exc})", _FIELD) from None
    if not isinstance(arr, np.ndarray) or arr.shape != (num_nodes,):
        shape = list(getattr(arr, "shape", []))
        raise StoreFormatError(f"{path}: shape {shape}, need [{num_nodes}] (one per node)", _FIELD)
    return arr


def load_labels(store_dir: str | Path, meta: layout.StoreMeta) -> np.ndarray:
    """``labels.npy`` as int64 [N], each in [-1, num_classes); StoreFormatError naming the file
    and the first bad entry otherwise."""
    path = Path(store_dir) / layout.LABELS
    arr = _read_npy(path, meta.num_nodes)
    if not np.issubdtype(arr.dtype, np.integer):
        raise StoreFormatError(f"{path}: dtype {arr.dtype}, need integer class ids", _FIELD)
    i = _range_scan(arr, -1, max(meta.num_classes, 0))
    if i >= 0:
        raise StoreFormatError(
            f"{path}: entry {i} = {int(arr[i])} is not a class id in [-1, {meta.num_classes}) "
            f"(num_classes {meta.num_classes} in {layout.META}; -1 = unlabelled)",
            _FIELD,
        )
    return arr.astype(np.int64, copy=False)


def load_mask(store_dir: str | Path, meta: layout.StoreMeta, mask: str) -> np.ndarray:
    """Split mask ``mask`` (e.g. ``train_mask``) as bool [N]; StoreFormatError naming the file
    unless it is bool or integer 0/1."""
    path = Path(store_dir) / f"{mask}.npy"
    arr = _read_npy(path, meta.num_nodes)
    if arr.dtype == np.bool_:
        return arr
    if not np.issubdtype(arr.dtype, np.integer):
        raise StoreFormatError(f"{path}: dtype {arr.dtype}, need bool", _FIELD)
    i = _range_scan(arr, 0, 2)
    if i >= 0:
        raise StoreFormatError(f"{path}: entry {i} = {int(arr[i])} is not 0 or 1", _FIELD)
    return arr.astype(bool)


def check_labels_and_masks(store_dir: str | Path, meta: layout.StoreMeta) -> None:
    """Check ``labels.npy`` and every split mask ``meta.json`` lists (see :func:`load_labels`,
    :func:`load_mask`)."""
    if meta.has_labels:
        load_labels(store_dir, meta)
    for mask in meta.masks:
        if mask not in layout.MASKS:
            raise StoreFormatError(
                f"{Path(store_dir) / layout.META}: unknown split mask {mask[:64]!r}; "
                f"masks are {list(layout.MASKS)}",
                _FIELD,
            )
        load_mask(store_dir, meta, mask)


def _logged(what: str, store_dir: str | Path, start: float) -> None:
    seconds = time.perf_counter() - start
    log.info("checked store structure (%s) of %s in %.2f s", what, store_dir, seconds)
