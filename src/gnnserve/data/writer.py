"""Write a validated graph into a store directory (the output of ``gnnserve prepare``)."""

from __future__ import annotations

import logging
import shutil
from dataclasses import dataclass
from pathlib import Path

import numba
import numpy as np

from gnnserve.data import layout
from gnnserve.data.validate import (
    check_edge_index,
    check_features,
    check_labels,
    check_mask,
    first_non_finite_row,
)
from gnnserve.errors import InvalidInputError

log = logging.getLogger(__name__)


@dataclass
class GraphData:
    """An imported graph before it is written: what every importer and generator returns."""

    name: str  # dataset name
    num_nodes: int  # N
    edge_index: np.ndarray  # int64 [2, E]: row 0 source, row 1 destination
    x: np.ndarray  # float32 [N, F]
    y: np.ndarray | None = None  # int64 [N], -1 = unknown
    train_mask: np.ndarray | None = None  # bool [N]
    val_mask: np.ndarray | None = None  # bool [N]
    test_mask: np.ndarray | None = None  # bool [N]
    source: str = ""  # provenance, recorded in meta.json


@numba.njit(cache=True)
def _counting_sort_csr(
    src: np.ndarray, dst: np.ndarray, num_nodes: int, indptr: np.ndarray, indices: np.ndarray
) -> None:
    """Fill ``indptr``/``indices`` with the in-neighbour CSR of (src -> dst), stable per row."""
    for i in range(dst.shape[0]):
        indptr[dst[i] + 1] += 1
    for v in range(num_nodes):
        indptr[v + 1] += indptr[v]
    cursor = indptr[:-1].copy()
    for i in range(dst.shape[0]):
        v = dst[i]
        indices[cursor[v]] = src[i]
        cursor[v] += 1


def build_csr(edge_index: np.ndarray, num_nodes: int) -> tuple[np.ndarray, np.ndarray]:
    """In-neighbour CSR (row pointers int64 [N+1], column ids int32 when N fits else int64)."""
    idx_dtype = np.int32 if num_nodes < np.iinfo(np.int32).max else np.int64
    indptr = np.zeros(num_nodes + 1, dtype=np.int64)
    indices = np.empty(edge_index.shape[1], dtype=idx_dtype)
    src = np.ascontiguousarray(edge_index[0])
    dst = np.ascontiguousarray(edge_index[1])
    _counting_sort_csr(src, dst, num_nodes, indptr, indices)
    return indptr, indices


def _num_classes(y: np.ndarray | None) -> int:
    return int(y.max()) + 1 if y is not None and y.size and y.max() >= 0 else 0


def _cast_features(x: np.ndarray, feature_dtype: str) -> np.ndarray:
    """``x`` (finite float32) as stored: little-endian ``feature_dtype``, checked finite after
    the cast (values finite in float32 overflow float16 from 65520 on)."""
    with np.errstate(over="ignore"):
        stored = x.astype(np.dtype(feature_dtype).newbyteorder("<"), copy=False)
    if stored.dtype != x.dtype:
        row = first_non_finite_row(stored)
        if row is not None:
            raise InvalidInputError(
                f"features overflow float16 (largest {np.finfo(np.float16).max:g}; first at node "
                f"{row}): write the store with --dtype float32",
                "dtype",
            )
    return stored


def write_store(
    data: GraphData, out_dir: str | Path, feature_dtype: str = "float32", overwrite: bool = False
) -> layout.StoreMeta:
    """Validate ``data`` and write it as a store in ``out_dir``; returns the written meta."""
    if feature_dtype not in ("float32", "float16"):
        raise InvalidInputError(
            f"feature dtype must be float32 or float16, got {feature_dtype!r}", "dtype"
        )
    n = int(data.num_nodes)
    edge_index = check_edge_index(data.edge_index, n)
    x = check_features(data.x, n)
    y = check_labels(data.y, n)
    masks = {m: check_mask(getattr(data, m), n, m) for m in layout.MASKS}
    stored = _cast_features(x, feature_dtype)

    out = Path(out_dir)
    if out.exists() and any(out.iterdir()):
        if not overwrite:
            raise InvalidInputError(f"{out} exists and is not empty (use --overwrite)", "out")
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)

    indptr, indices = build_csr(edge_index, n)
    indptr.astype("<i8").tofile(out / layout.INDPTR)
    indices.astype(indices.dtype.newbyteorder("<")).tofile(out / layout.INDICES)
    stored.tofile(out / layout.FEATURES)
    if y is not None:
        np.save(out / layout.LABELS, y)
    present = [m for m, arr in masks.items() if arr is not None]
    for m, arr in masks.items():
        if arr is not None:
            np.save(out / f"{m}.npy", arr)

    meta = layout.StoreMeta(
        name=data.name,
        num_nodes=n,
        num_edges=int(edge_index.shape[1]),
        feature_dim=int(x.shape[1]),
        feature_dtype=feature_dtype,
        indices_dtype=str(indices.dtype),
        num_classes=_num_classes(y),
        has_labels=y is not None,
        masks=present,
        source=data.source,
    )
    meta.checksum = layout.checksum_files(layout.data_files(out, meta))
    (out / layout.META).write_text(meta.to_json())
    log.info(
        "wrote store %s: %d nodes, %d edges, %d features", out, n, meta.num_edges, meta.feature_dim
    )
    return meta
