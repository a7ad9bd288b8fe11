"""On-disk precomputed embeddings: a directory of raw per-layer arrays plus ``meta.json``.

Layout of an embeddings directory::

    meta.json     EmbeddingMeta.to_dict() + {"format": "gnnserve-embeddings", "format_version": 1}
    layer1.bin    raw little-endian float32 [N, dims[0]]
    ...
    layer{k}.bin  raw little-endian float32 [N, dims[k-1]] (layer k = the logits)

``meta.json`` is written last (atomically), so a directory with a readable ``meta.json`` holds
complete layer files. Backends are chosen by name in :data:`EMBEDDING_STORES`: ``memory`` reads
every layer into memory, ``mmap`` maps the files read-only. Every problem with the files raises
:class:`~gnnserve.errors.StoreFormatError` naming the file.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from gnnserve.data import integrity, layout
from gnnserve.data.meta import read_meta_file
from gnnserve.embeddings.base import EmbeddingMeta, EmbeddingStore
from gnnserve.errors import StoreFormatError
from gnnserve.registry import Registry
from gnnserve.urls import local_path

FORMAT = "gnnserve-embeddings"
FORMAT_VERSION = 1
META = "meta.json"
DTYPE = np.dtype("<f4")  # on-disk dtype of every layer file
_FIELD = "embeddings"

# backend name -> factory(directory, meta) returning an EmbeddingStore over the files
EMBEDDING_STORES: Registry[EmbeddingStore] = Registry("embedding_store")


def layer_file(layer: int) -> str:
    """File name of ``layer`` (1-based) inside an embeddings directory."""
    return f"layer{layer}.bin"


def default_embeddings_dir(store_dir: str | Path, checkpoint_dir: str | Path) -> Path:
    """Where ``gnnserve precompute`` writes by default: ``<store>/embeddings/<checkpoint name>``.

    Both arguments are paths or file URLs."""
    store, checkpoint = local_path(store_dir, "store"), local_path(checkpoint_dir, "model_path")
    return store / "embeddings" / checkpoint.resolve().name


def write_meta(directory: str | Path, meta: EmbeddingMeta) -> Path:
    """Write ``meta.json`` of ``directory`` atomically (temp file + rename); return its path."""
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    doc: dict[str, Any] = {**meta.to_dict(), "format": FORMAT, "format_version": FORMAT_VERSION}
    path = root / META
    tmp = root / f".{META}.tmp"
    tmp.write_text(json.dumps(doc, indent=2, sort_keys=True))
    os.replace(tmp, path)
    return path


def create_layer(directory: str | Path, layer: int, num_nodes: int, dim: int) -> np.ndarray:
    """A writable [num_nodes, dim] float32 array backed by ``layer{layer}.bin`` (new or truncated).

    Rows written into it go to the file; call ``flush()`` (memmaps) before reading it back.
    """
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    path = root / layer_file(layer)
    if num_nodes * dim == 0:  # an empty file cannot be memory-mapped
        path.write_bytes(b"")
        return np.zeros((num_nodes, dim), dtype=DTYPE)
    return np.memmap(path, dtype=DTYPE, mode="w+", shape=(num_nodes, dim))


def _positive_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def read_meta(directory: str | Path) -> EmbeddingMeta:
    """Read and check ``meta.json`` of an embeddings directory (a path or file URL);
    StoreFormatError when unusable."""
    root = local_path(directory, _FIELD)
    path = root / META
    doc = read_meta_file(
        path,
        _FIELD,
        version=FORMAT_VERSION,
        missing=f"{root} holds no precomputed embeddings: {path} missing",
        format_name=FORMAT,
    )
    fields = {k: v for k, v in doc.items() if k not in ("format", "format_version")}
    try:
        meta = EmbeddingMeta(**fields)
    except TypeError as exc:
        raise StoreFormatError(f"{path} is malformed: {exc}", _FIELD) from exc
    problems = []
    if not isinstance(meta.model_version, str) or not meta.model_version:
        problems.append("model_version must be a non-empty string")
    if not isinstance(meta.graph_version, str):
        problems.append("graph_version must be a string")
    num_nodes = meta.num_nodes
    if isinstance(num_nodes, bool) or not isinstance(num_nodes, int) or num_nodes < 0:
        problems.append(f"num_nodes must be a non-negative int, got {num_nodes!r}")
    if not isinstance(meta.dims, list) or not meta.dims or not all(map(_positive_int, meta.dims)):
        problems.append(f"dims must be a non-empty list of positive ints, got {meta.dims!r}")
    if meta.dtype != "float32":
        problems.append(f"dtype must be 'float32', got {meta.dtype!r}")
    if problems:
        raise StoreFormatError(f"{path}: {'; '.join(problems)}", _FIELD)
    return meta


class FileEmbeddings(EmbeddingStore):
    """PEs read from an embeddings directory, every layer file checked for its size on open."""

    def __init__(self, directory: str | Path, meta: EmbeddingMeta, mmap: bool) -> None:
        super().__init__(meta)
        self.directory = Path(directory)
        self.mmap = mmap
        self._layers = [self._open(layer, dim) for layer, dim in enumerate(meta.dims, start=1)]

    def _open(self, layer: int, dim: int) -> np.ndarray:
        shape, name = (self.meta.num_nodes, dim), layer_file(layer)
        try:
            table = layout.open_array(self.directory, name, "float32", shape, self.mmap)
        except StoreFormatError as exc:  # same message, reported against the embeddings
            raise StoreFormatError(exc.message, _FIELD) from exc
        integrity.check_finite(self.directory, np.ascontiguousarray(table), name, _FIELD)
        return table

    def _layer(self, layer: int) -> np.ndarray:
        return self._layers[layer - 1]


@EMBEDDING_STORES.register("memory")
def _memory(directory: str | Path, meta: EmbeddingMeta) -> EmbeddingStore:
    return FileEmbeddings(directory, meta, mmap=False)


@EMBEDDING_STORES.register("mmap")
def _mmap(directory: str | Path, meta: EmbeddingMeta) -> EmbeddingStore:
    return FileEmbeddings(directory, meta, mmap=True)


def open_embeddings(directory: str | Path, backend: str = "memory") -> EmbeddingStore:
    """Open the PEs of ``directory`` (a path or file URL) with the backend ``backend``."""
    root = local_path(directory, _FIELD)
    meta = read_meta(root)
    return EMBEDDING_STORES.create(backend, root, meta)
