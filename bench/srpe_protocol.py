"""OMEGA §8.1 serving workload: hold out 25% of the test nodes, train on the rest, make PEs.

``split`` removes a random quarter of the test nodes with every edge touching them; the rest is
written as a store and a model is trained on it; ``query_batches`` turns the held-out nodes into
new-node requests (their features plus their edges to the remaining graph) of ``batch`` nodes.
Trained checkpoints and PEs are cached in the work directory, keyed by dataset, model and seed.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

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


@dataclass
class Workload:
    """The remaining graph's store and the held-out query nodes."""

    store: Path  # store of the remaining graph (ids renumbered 0..N'-1)
    x: np.ndarray  # float32 [q, F] features of the held-out nodes
    y: np.ndarray  # int64 [q] their labels
    edges: np.ndarray  # int64 [E, 2] (held-out index, remaining id): edges to the remaining graph
    num_classes: int


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
    store = workdir / f"{data.name}-remaining"
    if not (store / "meta.json").exists():
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
    held_index = np.full(data.num_nodes, -1, np.int64)
    held_index[held] = np.arange(held.size)
    out = ~keep[src] & keep[dst]  # held-out source -> remaining destination (symmetric graphs)
    edges = np.stack([held_index[src[out]], new_id[dst[out]]], axis=1)
    classes = int(data.y.max()) + 1
    return Workload(store, data.x[held].astype(np.float32), data.y[held], edges, classes)


def trained(work: Workload, arch: str, workdir: Path, epochs: int, seed: int = 0) -> Path:
    """Checkpoint of ``arch`` trained on the remaining graph (cached)."""
    layers, fanouts = MODELS[arch]
    out = workdir / f"{work.store.name}-{arch}"
    if (out / "config.json").exists():
        return out
    meta = open_graph_store(work.store).meta
    config = ModelConfig(
        arch=arch,
        in_dim=meta.feature_dim,
        hidden_dim=128,
        out_dim=work.num_classes,
        num_layers=layers,
        dropout=0.5,
    )
    report = train(work.store, config, epochs, fanouts, 512, 0.005, seed, out, progress=False)
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
    """(held-out indices, NewNodes) per request of at most ``batch`` held-out nodes."""
    out = []
    for lo in range(0, work.y.size, batch):
        idx = np.arange(lo, min(lo + batch, work.y.size))
        sel = (work.edges[:, 0] >= lo) & (work.edges[:, 0] < idx[-1] + 1)
        edges = work.edges[sel].copy()
        edges[:, 0] -= lo
        new = NewNodes(torch.from_numpy(work.x[idx]), edges, np.empty((0, 2), np.int64))
        out.append((idx, new))
    return out
