"""Graphs and models for bench/fog.py: sensor-like sparse features, trained checkpoints.

facebook_pagepage and fb100_cornell5 keep their own sparse binary features, cut to the
``FEATURES`` most frequent columns (the sensors' one-hot readings; Fograph's SIoT has 52 such
dimensions), with their labels; R-MAT 100K vertices / 1M edges gets sparse one-hot features
(three ones per row) and no labels (its accuracy is reported as agreement with full precision);
sbm20k (a stochastic block model, 20K vertices, 8 classes) has continuous Gaussian features, on
which quantization is not exact: the accuracy comparison that binary features cannot give;
sbm20k_ts is the same graph with sensor-like time series (:func:`time_series`).

Readings by kind (``KINDS``): binary (the two real graphs, R-MAT), gaussian (sbm20k),
timeseries (sbm20k_ts).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from common import DATASETS
from gnnserve.data.generators import rmat, sbm
from gnnserve.data.writer import GraphData, write_store
from gnnserve.graph import open_graph_store
from gnnserve.graph.base import GraphStore
from gnnserve.models.checkpoint import load_checkpoint, save_checkpoint
from gnnserve.models.train import train
from gnnserve.models.zoo import GNN, ModelConfig

FEATURES = {
    "facebook_pagepage": 64, "fb100_cornell5": 64, "rmat100k": 16, "sbm20k": 32, "sbm20k_ts": 32,
}  # fmt: skip
KINDS = {
    "facebook_pagepage": "binary", "fb100_cornell5": "binary", "rmat100k": "binary",
    "sbm20k": "gaussian", "sbm20k_ts": "timeseries",
}  # fmt: skip
HIDDEN = 64


@dataclass
class BenchGraph:
    """A prepared benchmark graph."""

    name: str
    graph: GraphStore
    x: np.ndarray  # float32 [N, F] the sensors' readings
    y: np.ndarray | None  # int64 [N] labels (-1 unknown), None without labels
    test: np.ndarray | None  # bool [N]
    store: Path


def _top_columns(z: np.lib.npyio.NpzFile, keep: int) -> np.ndarray:
    """Dense float32 [N, keep]: the ``keep`` most frequent columns of the sparse CSR features."""
    indptr, indices, data = z["x_indptr"], z["x_indices"], z["x_data"]
    n = int(z["x_shape"][0])
    top = np.argsort(-np.bincount(indices, minlength=int(z["x_shape"][1])), kind="stable")[:keep]
    col = np.full(int(z["x_shape"][1]), -1, np.int64)
    col[top] = np.arange(keep)
    rows = np.repeat(np.arange(n), np.diff(indptr))
    mine = col[indices] >= 0
    x = np.zeros((n, keep), np.float32)
    x[rows[mine], col[indices[mine]]] = data[mine]
    return x


def time_series(y: np.ndarray, length: int, seed: int = 0) -> np.ndarray:
    """Sensor-like readings, float32 [N, length]: each vertex's last ``length`` samples of

        x_v(t) = m_v + a_c sin(2 pi t / P_c + phi_v) + e_v(t),  e_v(t) = 0.8 e_v(t-1) + 0.5 z

    (z standard normal; e_v starts at its stationary law). The class ``c = y[v]`` (a zone) sets
    the period ``P_c`` (6 to 20 samples), the amplitude ``a_c`` (0.5 to 2) and the zone's mean
    level ``1.5 (c - (C - 1) / 2)`` (a deviation from the site's nominal temperature), around
    which each sensor has its own level ``m_v`` (std 1.5) and phase ``phi_v``: a periodic signal
    in correlated noise, the shape of an IoT sensor's window, on which rounding is never
    exact."""
    rng = np.random.default_rng(seed)
    classes = int(y.max()) + 1
    period = np.linspace(6.0, 20.0, classes)[y]
    amplitude = np.linspace(0.5, 2.0, classes)[rng.permutation(classes)][y]
    zone = 1.5 * (np.arange(classes) - (classes - 1) / 2)
    level, phase = rng.normal(zone[y], 1.5), rng.uniform(0, 2 * np.pi, y.size)
    noise = np.empty((y.size, length))
    noise[:, 0] = rng.standard_normal(y.size) * 0.5 / np.sqrt(1 - 0.8**2)
    for t in range(1, length):
        noise[:, t] = 0.8 * noise[:, t - 1] + 0.5 * rng.standard_normal(y.size)
    t = np.arange(length)[None, :]
    wave = amplitude[:, None] * np.sin(2 * np.pi * t / period[:, None] + phase[:, None])
    return (level[:, None] + wave + noise).astype(np.float32)


def load(name: str, work: Path) -> BenchGraph:
    """The graph ``name`` written as a store under ``work`` (once)."""
    store = work / name / "store"
    if name in ("sbm20k", "sbm20k_ts"):  # continuous readings: quantization changes them
        data = sbm(num_nodes=20_000, num_classes=8, feature_dim=FEATURES[name], seed=0)
        if name == "sbm20k_ts":
            data.x = time_series(data.y, FEATURES[name])
        data.name = name
    elif name == "rmat100k":
        data = rmat(num_nodes=100_000, num_edges=1_000_000, feature_dim=FEATURES[name], seed=0)
        rng = np.random.default_rng(0)
        x = np.zeros((data.num_nodes, FEATURES[name]), np.float32)
        for _ in range(3):
            x[np.arange(data.num_nodes), rng.integers(0, FEATURES[name], data.num_nodes)] = 1.0
        data.x, data.name = x, name
    else:
        with np.load(DATASETS / f"{name}.npz") as z:
            x = _top_columns(z, FEATURES[name])
            data = GraphData(
                name, int(z["num_nodes"]), z["edge_index"], x, z["y"],
                z["train_mask"], z["val_mask"], z["test_mask"],
            )  # fmt: skip
    if not (store / "meta.json").exists():
        write_store(data, store, overwrite=True)
    labelled = data.y is not None
    return BenchGraph(
        name,
        open_graph_store(store),
        np.asarray(data.x, np.float32),
        np.asarray(data.y) if labelled else None,
        np.asarray(data.test_mask, bool) if labelled else None,
        store,
    )


def model(bench: BenchGraph, arch: str, work: Path) -> tuple[GNN, float | None]:
    """A 2-layer ``arch`` for the graph: trained (3 epochs, fanouts 10,10) where it has labels,
    random weights otherwise; (model, its test accuracy from training or None)."""
    out = work / bench.name / arch
    classes = int(bench.y.max()) + 1 if bench.y is not None else 4
    config = ModelConfig(arch, FEATURES[bench.name], HIDDEN, classes, num_layers=2, heads=2)
    if not (out / "config.json").exists():
        if bench.y is None:
            torch.manual_seed(0)
            save_checkpoint(out, GNN(config), config, {"note": "fog bench, random weights"})
        else:
            train(bench.store, config, 3, [10, 10], 512, 0.01, 0, out, progress=False)
    ckpt = load_checkpoint(out)
    acc = ckpt.meta.get("test_acc")
    return ckpt.model.eval(), acc
