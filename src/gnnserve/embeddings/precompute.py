"""Precomputed embeddings (PEs) by layer-wise full-graph inference, and ``gnnserve precompute``.

Layer ``l`` (1..k) is computed for every node from layer ``l-1`` of every node (layer 0 = the
features), one chunk of destination nodes at a time: a chunk is a range of consecutive ids whose
in-edges (at most ``chunk_edges``) form a one-hop :class:`~gnnserve.types.Block` with every
in-neighbour, so memory is bounded by the chunk, not by ``N * F``. The model's own
``layer_forward`` (the block path of serving) computes each chunk; with every neighbour present it
equals the full-graph forward.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from gnnserve.embeddings import stores
from gnnserve.embeddings.base import ArrayEmbeddings, EmbeddingMeta, EmbeddingStore
from gnnserve.errors import InvalidInputError
from gnnserve.features.base import FeatureStore
from gnnserve.graph.base import GraphStore
from gnnserve.models.zoo import GNN
from gnnserve.types import Block


def chunk_bounds(indptr: np.ndarray, chunk_edges: int) -> np.ndarray:
    """Boundaries ``b`` (int64, ``b[0] = 0``, ``b[-1] = N``) of the destination chunks.

    Chunk ``i`` is the id range ``[b[i], b[i+1])``: as many consecutive nodes as fit in
    ``chunk_edges`` in-edges, and no more than ``chunk_edges`` nodes (isolated nodes cost no
    edges but still rows); always at least one node, so a node of higher degree is a chunk alone.
    """
    n = indptr.size - 1
    bounds = [0]
    lo = 0
    while lo < n:
        by_edges = int(np.searchsorted(indptr, indptr[lo] + chunk_edges, side="right")) - 1
        lo = max(lo + 1, min(by_edges, lo + chunk_edges, n))
        bounds.append(lo)
    return np.asarray(bounds, dtype=np.int64)


def chunk_block(
    indptr: np.ndarray, indices: np.ndarray, lo: int, hi: int
) -> tuple[Block, np.ndarray]:
    """The one-hop block of destinations ``[lo, hi)`` with all their in-neighbours.

    Returns ``(block, src_ids)``: ``src_ids`` int64 [n_src] are the global ids of the block's
    sources, the destinations ``lo..hi-1`` first, then the other distinct in-neighbours (sorted).
    """
    n_dst = hi - lo
    src = np.asarray(indices[indptr[lo] : indptr[hi]], dtype=np.int64)
    dst = np.repeat(np.arange(n_dst, dtype=np.int64), np.diff(indptr[lo : hi + 1]))
    inside = (src >= lo) & (src < hi)
    outside, inverse = np.unique(src[~inside], return_inverse=True)
    local = np.empty_like(src)
    local[inside] = src[inside] - lo
    local[~inside] = n_dst + inverse.reshape(-1)
    src_ids = np.concatenate([np.arange(lo, hi, dtype=np.int64), outside])
    edge_index = torch.from_numpy(np.stack([local, dst]))
    return Block(edge_index, int(src_ids.size), n_dst), src_ids


def layer_chunk_edges(chunk_edges: int, chunk_bytes: int, width: int) -> int:
    """In-edges per chunk for a layer whose input rows are ``width`` float32 wide.

    PyG materialises one message row per edge (plus the source rows), so a chunk holds about
    ``2 * edges * width * 4`` bytes; the result keeps that under ``chunk_bytes``.
    """
    return max(1, min(chunk_edges, chunk_bytes // (8 * max(width, 1))))


def layer_dims(model: GNN) -> list[int]:
    """Output width of each layer 1..k of ``model``."""
    c = model.config
    return [c.hidden_dim] * (c.num_layers - 1) + [c.out_dim]


def _check_inputs(
    model: GNN, graph: GraphStore, features: FeatureStore, chunk_edges: int, chunk_bytes: int
) -> None:
    for name, value in (("chunk_edges", chunk_edges), ("chunk_bytes", chunk_bytes)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InvalidInputError(f"{name} must be a positive int, got {value!r}", name)
    if features.num_nodes != graph.num_nodes:
        raise InvalidInputError(
            f"features have {features.num_nodes} rows, the graph {graph.num_nodes} nodes",
            "features",
        )
    if features.dim != model.config.in_dim:
        raise InvalidInputError(
            f"features are {features.dim} wide, the model takes {model.config.in_dim}",
            "features",
        )


def precompute_embeddings(
    model: GNN,
    graph: GraphStore,
    features: FeatureStore,
    *,
    model_version: str,
    out_dir: Path | None = None,
    chunk_edges: int = 2_000_000,
    chunk_bytes: int = 512 << 20,
    progress: bool = True,
) -> EmbeddingStore:
    """Every layer's output of every node of ``graph``, by layer-wise full-graph inference.

    With ``out_dir`` the layers are written straight into ``out_dir/layer{l}.bin`` (then
    ``meta.json``, last) and the returned store maps those files; without, they are in-memory
    arrays. The store records ``model_version`` and the graph version it was computed on.
    ``chunk_edges`` bounds the in-edges (and nodes) of one chunk, and ``chunk_bytes`` bounds them
    further so that a chunk's per-edge messages of the layer's input width fit in that many bytes
    (wide raw features get smaller chunks); ``progress`` shows a tqdm bar over chunks x layers on
    stderr.
    """
    _check_inputs(model, graph, features, chunk_edges, chunk_bytes)
    dims = layer_dims(model)
    device = next(model.parameters()).device
    graph_version = graph.acquire_read()  # one consistent snapshot of a mutable graph
    try:
        indptr, indices = graph.csr()
        n = graph.num_nodes
        meta = EmbeddingMeta(str(model_version), graph_version, n, list(dims))
        if out_dir is not None:
            root = Path(out_dir)
            root.mkdir(parents=True, exist_ok=True)
            (root / stores.META).unlink(missing_ok=True)  # incomplete until the meta is back
            keep = {stores.layer_file(i) for i in range(1, len(dims) + 1)}
            for old in root.glob("layer*.bin"):  # layers of an earlier, deeper model
                if old.name not in keep:
                    old.unlink()
        widths = [model.config.in_dim, *dims[:-1]]
        per_layer = [
            chunk_bounds(indptr, layer_chunk_edges(chunk_edges, chunk_bytes, w)) for w in widths
        ]
        bar = tqdm(
            total=sum(b.size - 1 for b in per_layer),
            desc="precompute",
            unit="chunk",
            file=sys.stderr,
            disable=not progress,
            leave=False,
        )
        was_training = model.training
        model.eval()
        layers: list[np.ndarray] = []
        try:
            with torch.inference_mode(), bar:
                for index, dim in enumerate(dims):
                    if out_dir is None:
                        out = np.empty((n, dim), dtype=np.float32)
                    else:
                        out = stores.create_layer(out_dir, index + 1, n, dim)
                    prev = layers[-1] if layers else None
                    bar.set_postfix(layer=index + 1)
                    bounds = per_layer[index]
                    for lo, hi in zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True):
                        block, src_ids = chunk_block(indptr, indices, lo, hi)
                        if prev is None:
                            h = features.get(src_ids)
                        else:
                            h = torch.from_numpy(np.asarray(prev[src_ids], dtype=np.float32))
                        deg = torch.from_numpy(np.asarray(graph.gcn_degree(src_ids)))
                        block = Block(block.edge_index.to(device), block.n_src, block.n_dst)
                        y = model.layer_forward(index, h.to(device), block, deg.to(device))
                        out[lo:hi] = y.cpu().numpy()
                        bar.update()
                    if isinstance(out, np.memmap):
                        out.flush()
                    layers.append(out)
        finally:
            model.train(was_training)
    finally:
        graph.release_read()
    if out_dir is None:
        return ArrayEmbeddings(meta, layers)
    stores.write_meta(out_dir, meta)
    return stores.open_embeddings(out_dir, "mmap")


# --- gnnserve precompute -------------------------------------------------------------------------


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Flags of ``gnnserve precompute``."""
    p.add_argument("--store", required=True, help="store directory (gnnserve prepare)")
    p.add_argument("--model", required=True, help="checkpoint directory (gnnserve train)")
    p.add_argument(
        "--out", default=None, help="embeddings directory (default: <store>/embeddings/<model>)"
    )
    p.add_argument(
        "--backend", default="memory", help="graph and feature store backend: memory | mmap"
    )
    p.add_argument(
        "--chunk-edges", type=int, default=2_000_000, help="in-edges per chunk (bounds memory)"
    )
    p.add_argument(
        "--chunk-mb",
        type=int,
        default=512,
        help="MiB of per-edge messages per chunk (wide features get smaller chunks)",
    )
    p.add_argument(
        "--update-log",
        default=None,
        help="graph update log of a mutable store (gnnserve serve --update-log): PEs of the "
        "store with every logged batch applied; read only, safe beside a running server",
    )
    p.add_argument("--torch-threads", type=int, default=None, help="torch threads (default: all)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


@contextlib.contextmanager
def _torch_threads(threads: int | None) -> Iterator[None]:
    """Run with ``threads`` intra-op threads (None: leave torch's setting)."""
    before = torch.get_num_threads()
    if threads is not None:
        if threads < 1:
            raise InvalidInputError(f"--torch-threads must be >= 1, got {threads}", "torch_threads")
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _written_bytes(directory: Path, num_layers: int) -> int:
    names = [stores.META] + [stores.layer_file(i) for i in range(1, num_layers + 1)]
    return sum((directory / name).stat().st_size for name in names)


def run(args: argparse.Namespace) -> int:
    """``gnnserve precompute``: compute and write the PEs of a checkpoint on a store; exit code."""
    from gnnserve.data import layout
    from gnnserve.features import open_feature_store
    from gnnserve.graph import open_graph_store
    from gnnserve.models.checkpoint import load_checkpoint

    ckpt = load_checkpoint(args.model)
    store_meta = layout.read_meta(args.store)
    trained_on = ckpt.meta.get("store_checksum")
    if trained_on is not None and trained_on != store_meta.checksum:
        raise InvalidInputError(
            f"checkpoint {args.model} was trained on store checksum {trained_on}, "
            f"{args.store} has {store_meta.checksum}; precompute with the matching store",
            "store",
        )
    graph = open_graph_store(args.store, args.backend)
    features = open_feature_store(args.store, args.backend)
    if args.update_log:
        from gnnserve.dynamic.store import DynamicStore
        from gnnserve.urls import local_path

        if not local_path(args.update_log, "update_log").is_file():
            raise InvalidInputError(f"no update log at {args.update_log}", "update_log")
        updated = DynamicStore(graph, features, args.update_log, read_only=True)
        graph, features = updated.view, updated.features
    out = Path(args.out) if args.out else stores.default_embeddings_dir(args.store, args.model)
    start = time.perf_counter()
    with _torch_threads(args.torch_threads):
        pes = precompute_embeddings(
            ckpt.model,
            graph,
            features,
            model_version=ckpt.version,
            out_dir=out,
            chunk_edges=args.chunk_edges,
            chunk_bytes=args.chunk_mb << 20,
            progress=not args.no_progress,
        )
    seconds = time.perf_counter() - start
    report = {
        "out": str(out),
        "model_version": pes.meta.model_version,
        "graph_version": pes.meta.graph_version,
        "num_nodes": pes.meta.num_nodes,
        "dims": pes.meta.dims,
        "bytes": _written_bytes(out, pes.num_layers),
        "seconds": round(seconds, 3),
    }
    print(json.dumps(report, indent=2))
    return 0


__all__ = [
    "add_arguments",
    "chunk_block",
    "chunk_bounds",
    "layer_dims",
    "precompute_embeddings",
    "run",
]
