"""OMEGA §8.1 serving workload: hold out 25% of the test nodes, train on the rest, make PEs.

``split`` removes a random quarter of the test nodes with every edge touching them; the rest is
written as a store and a model is trained on it; ``query_batches`` turns the held-out nodes into
new-node requests of ``batch`` nodes: their features, their edges to the remaining graph and the
edges between two held-out nodes of the same request (``new_edges``; an edge to a held-out node of
another request cannot be sent, that node is not in the graph). Stores, trained checkpoints and
their PEs are cached in the work directory under a name holding a hash of every parameter that
made them (dataset, fraction, seed; architecture, epochs, training hyper-parameters), so a cached
result is reused only for identical parameters.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from gnnserve.data.importers import load_npz
from gnnserve.data.writer import GraphData, write_store
from gnnserve.embeddings.precompute import precompute_embeddings
from gnnserve.embeddings.stores import open_embeddings
from gnnserve.features import open_feature_store
from gnnserve.graph import open_graph_store
from gnnserve.models.checkpoint import load_checkpoint
from gnnserve.models.train import train
from gnnserve.models.zoo import ModelConfig
from gnnserve.types import NewNodes

# (arch, layers, training / NS fanouts) as in OMEGA's evaluation
MODELS = {"gcn": (2, [25, 10]), "sage": (3, [15, 10, 5]), "gat": (3, [15, 10, 5])}
# training epochs per dataset (bench/srpe.py trains, bench/cgp.py reuses its checkpoints)
EPOCHS = {"cora": 100, "citeseer": 100, "facebook_pagepage": 3, "fb100_cornell5": 2}
TRAINING = {"hidden_dim": 128, "dropout": 0.5, "batch_size": 512, "lr": 0.005}


@dataclass
class Workload:
    """The remaining graph's store and the held-out query nodes."""

    store: Path  # store of the remaining graph (ids renumbered 0..N'-1)
    x: np.ndarray  # float32 [q, F] features of the held-out nodes
    y: np.ndarray  # int64 [q] their labels
    edges: np.ndarray  # int64 [E, 2] (held-out index, remaining id): edges to the remaining graph
    new_edges: np.ndarray  # int64 [E2, 2] (held-out i, held-out j), i < j: edges among them
    num_classes: int


def cache_dir(workdir: Path, stem: str, params: dict[str, Any]) -> Path:
    """``workdir/<stem>-<hash of params>``: a cache entry made from exactly ``params``."""
    text = json.dumps(params, sort_keys=True)
    return workdir / f"{stem}-{hashlib.sha256(text.encode()).hexdigest()[:10]}"


def cached(path: Path, params: dict[str, Any], marker: str) -> bool:
    """Whether ``path`` holds a complete entry (``marker`` written) made from ``params``; a
    partial or foreign entry is removed so it can be rebuilt."""
    made = path / "params.json"
    same = made.exists() and json.loads(made.read_text()) == json.loads(json.dumps(params))
    if same and (path / marker).exists():
        return True
    if path.exists():
        shutil.rmtree(path)
    return False


def record(path: Path, params: dict[str, Any]) -> None:
    """Mark ``path`` as made from ``params`` (after its content is complete)."""
    (path / "params.json").write_text(json.dumps(params, sort_keys=True, indent=1))


def split(dataset: Path, workdir: Path, fraction: float = 0.25, seed: int = 0) -> Workload:
    """Remove ``fraction`` of the test nodes (and their edges); write the rest as a store."""
    data = load_npz(dataset)
    assert data.test_mask is not None and data.y is not None
    rng = np.random.default_rng(seed)
    test = np.flatnonzero(data.test_mask & (data.y >= 0))
    held = np.sort(rng.choice(test, int(round(fraction * test.size)), replace=False))
    keep = np.ones(data.num_nodes, bool)
    keep[held] = False
    new_id = np.cumsum(keep) - 1
    src, dst = data.edge_index
    inside = keep[src] & keep[dst]
    params = {"dataset": str(dataset.resolve()), "fraction": fraction, "seed": seed}
    store = cache_dir(workdir, f"{data.name}-remaining", params)
    if not cached(store, params, "meta.json"):
        masks = [m[keep] if m is not None else None for m in (data.train_mask, data.val_mask)]
        rest = GraphData(
            f"{data.name}-remaining",
            int(keep.sum()),
            np.stack([new_id[src[inside]], new_id[dst[inside]]]),
            data.x[keep],
            data.y[keep],
            masks[0],
            masks[1],
            data.test_mask[keep],
            source=f"{data.source}; {fraction:.0%} of test nodes held out (seed {seed})",
        )
        write_store(rest, store)
        record(store, params)
    held_index = np.full(data.num_nodes, -1, np.int64)
    held_index[held] = np.arange(held.size)
    out = ~keep[src] & keep[dst]  # held-out source -> remaining destination (symmetric graphs)
    edges = np.stack([held_index[src[out]], new_id[dst[out]]], axis=1)
    a, b = held_index[src], held_index[dst]
    among = (a >= 0) & (b >= 0) & (a != b)  # new-node self loops are refused by the API
    pairs = np.unique(np.sort(np.stack([a[among], b[among]], axis=1), axis=1), axis=0)
    classes = int(data.y.max()) + 1
    x = data.x[held].astype(np.float32)
    return Workload(store, x, data.y[held], edges, pairs.reshape(-1, 2), classes)


def training_params(work: Workload, arch: str, epochs: int, seed: int) -> dict[str, Any]:
    """Every parameter a trained checkpoint depends on (its store's name holds the split's)."""
    layers, fanouts = MODELS[arch]
    return {
        "store": work.store.name,
        "arch": arch,
        "layers": layers,
        "fanouts": fanouts,
        "epochs": epochs,
        "seed": seed,
        **TRAINING,
    }


def checkpoint_dir(work: Workload, arch: str, workdir: Path, epochs: int, seed: int = 0) -> Path:
    """Where :func:`trained` keeps the checkpoint of these parameters (it may not exist yet)."""
    return cache_dir(
        workdir, f"{work.store.name}-{arch}", training_params(work, arch, epochs, seed)
    )


def trained(work: Workload, arch: str, workdir: Path, epochs: int, seed: int = 0) -> Path:
    """Checkpoint of ``arch`` trained on the remaining graph (cached)."""
    layers, fanouts = MODELS[arch]
    out = checkpoint_dir(work, arch, workdir, epochs, seed)
    if cached(out, training_params(work, arch, epochs, seed), "config.json"):
        return out
    meta = open_graph_store(work.store).meta
    config = ModelConfig(
        arch=arch,
        in_dim=meta.feature_dim,
        hidden_dim=TRAINING["hidden_dim"],
        out_dim=work.num_classes,
        num_layers=layers,
        dropout=TRAINING["dropout"],
    )
    batch, lr = TRAINING["batch_size"], TRAINING["lr"]
    report = train(work.store, config, epochs, fanouts, batch, lr, seed, out, progress=False)
    record(out, training_params(work, arch, epochs, seed))
    print(
        f"  trained {arch} on {work.store.name}: val {report.val_acc:.3f} "
        f"test {report.test_acc:.3f} ({report.seconds:.0f} s)",
        flush=True,
    )
    return out


def embeddings_for(store: Path, checkpoint: Path):  # type: ignore[no-untyped-def]
    """PEs of ``checkpoint`` on ``store`` (computed once, then read from disk)."""
    ckpt = load_checkpoint(checkpoint)
    graph, features = open_graph_store(store), open_feature_store(store)
    out = checkpoint / "embeddings"
    if (out / "meta.json").exists():
        pes = open_embeddings(out)
    else:
        pes = precompute_embeddings(
            ckpt.model, graph, features, model_version=ckpt.version, out_dir=out, progress=False
        )
    pes.check(ckpt.version, graph.version)
    return ckpt, graph, features, pes


def query_batches(work: Workload, batch: int) -> list[tuple[np.ndarray, NewNodes]]:
    """(held-out indices, NewNodes) per request of at most ``batch`` consecutive held-out nodes,
    with their edges to the remaining graph and the edges among the request's own nodes."""
    out = []
    for lo in range(0, work.y.size, batch):
        hi = min(lo + batch, work.y.size)
        sel = (work.edges[:, 0] >= lo) & (work.edges[:, 0] < hi)
        inside = ((work.new_edges >= lo) & (work.new_edges < hi)).all(axis=1)
        edges, among = work.edges[sel] - [lo, 0], work.new_edges[inside] - lo
        new = NewNodes(torch.from_numpy(work.x[lo:hi]), edges, among)
        out.append((np.arange(lo, hi), new))
    return out


def first_queries(work: Workload, count: int) -> Workload:
    """The workload restricted to its first ``count`` held-out nodes (and their edges)."""
    keep = work.edges[:, 0] < count
    among = (work.new_edges < count).all(axis=1)
    return replace(
        work,
        x=work.x[:count],
        y=work.y[:count],
        edges=work.edges[keep],
        new_edges=work.new_edges[among],
    )
