"""Training: mini-batches on a small SBM beat chance by far and write a usable checkpoint."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from gnnserve.cli import main
from gnnserve.data.generators import sbm
from gnnserve.data.writer import GraphData, write_store
from gnnserve.errors import InvalidInputError
from gnnserve.features import open_feature_store
from gnnserve.graph import open_graph_store
from gnnserve.models import train as train_mod
from gnnserve.models.checkpoint import load_checkpoint
from gnnserve.models.train import train
from gnnserve.models.zoo import GNN, ModelConfig
from gnnserve.sampling import NeighborSampler

CLASSES = 4


@pytest.fixture(scope="module")
def sbm_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """2,000 nodes, 4 classes, 16 noisy features, mean degree 10."""
    out = tmp_path_factory.mktemp("sbm") / "store"
    data = sbm(2000, CLASSES, feature_dim=16, avg_degree=10, feature_noise=1.5, seed=0)
    write_store(data, out)
    return out


def _config(arch: str) -> ModelConfig:
    return ModelConfig(arch, in_dim=16, hidden_dim=32, out_dim=CLASSES, num_layers=2, dropout=0.2)


def _full_neighbourhood_accuracy(store: Path, model: GNN) -> float:
    """Test accuracy with every neighbour (fanout -1), independent of the training code."""
    graph, features = open_graph_store(store), open_feature_store(store)
    labels = np.load(store / "labels.npy")
    test = np.flatnonzero(np.load(store / "test_mask.npy"))
    sg = NeighborSampler(graph, [-1, -1]).sample(test)
    deg = torch.from_numpy(graph.in_degree(sg.input_nodes).astype(np.float32))
    with torch.inference_mode():
        logits, _ = model.eval().forward_blocks(features.get(sg.input_nodes), sg.blocks, deg)
    pred = logits[torch.from_numpy(sg.seed_rows)].argmax(1).numpy()
    return float(np.mean(pred == labels[test]))


@pytest.mark.parametrize("arch", ["gcn", "sage", "gat"])
def test_training_beats_chance_and_checkpoint_serves(sbm_store: Path, tmp_path: Path, arch) -> None:
    out = tmp_path / "ckpt"
    report = train(sbm_store, _config(arch), epochs=8, fanouts=[5, 5], batch_size=128,
                   lr=0.01, seed=0, out_dir=out, progress=False)  # fmt: skip
    assert report.test_acc is not None and report.test_acc > 0.8  # chance: 0.25
    assert len(report.epoch_val_acc) == 8 and report.val_acc == max(report.epoch_val_acc)
    assert report.epoch_val_acc[report.best_epoch - 1] == report.val_acc
    assert report.epoch_loss[-1] < report.epoch_loss[0]
    ckpt = load_checkpoint(out)
    assert ckpt.version == report.version
    assert ckpt.meta["store_checksum"] == open_graph_store(sbm_store).version
    assert ckpt.meta["fanouts"] == [5, 5] and ckpt.meta["test_acc"] == report.test_acc
    assert _full_neighbourhood_accuracy(sbm_store, ckpt.model) > 0.8


def test_training_is_reproducible(sbm_store: Path, tmp_path: Path) -> None:
    kwargs = dict(epochs=1, fanouts=[3, 3], batch_size=512, lr=0.01, seed=5, progress=False)
    a = train(sbm_store, _config("sage"), out_dir=tmp_path / "a", **kwargs)
    b = train(sbm_store, _config("sage"), out_dir=tmp_path / "b", **kwargs)
    assert a.epoch_loss == b.epoch_loss and a.test_acc == b.test_acc
    assert a.version.split("@")[1] == b.version.split("@")[1]  # same weights bytes


def test_cli_run_writes_checkpoint(sbm_store: Path, tmp_path: Path, capsys) -> None:
    parser = argparse.ArgumentParser()
    train_mod.add_arguments(parser)
    out = tmp_path / "cli"
    args = parser.parse_args(
        ["--store", str(sbm_store), "--out", str(out), "--arch", "sage", "--hidden", "16",
         "--epochs", "1", "--fanouts", "4,4", "--eval-fanouts=-1,-1", "--batch-size", "512"]
    )  # fmt: skip
    assert train_mod.run(args) == 0
    printed = json.loads(capsys.readouterr().out)
    ckpt = load_checkpoint(out)
    assert printed["version"] == ckpt.version
    assert ckpt.config.hidden_dim == 16 and ckpt.meta["eval_fanouts"] == [-1, -1]


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"fanouts": [5]}, "fanouts"),
        ({"fanouts": [5, 0]}, "fanouts"),
        ({"config": ModelConfig("sage", 8, 16, CLASSES)}, "in_dim"),
        ({"config": ModelConfig("sage", 16, 16, 2)}, "out_dim"),
        ({"epochs": 0}, "epochs"),
    ],
)
def test_bad_arguments_raise_typed_errors(sbm_store: Path, tmp_path: Path, kwargs, field) -> None:
    args = dict(config=_config("sage"), epochs=1, fanouts=[2, 2], batch_size=64, lr=0.01,
                seed=0, out_dir=tmp_path / "x", progress=False)  # fmt: skip
    with pytest.raises(InvalidInputError) as err:
        train(sbm_store, **{**args, **kwargs})
    assert err.value.field == field
    assert not (tmp_path / "x").exists()


def test_store_without_labels_is_refused(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    ei = rng.integers(0, 50, (2, 200))
    write_store(GraphData("plain", 50, ei, rng.standard_normal((50, 16))), tmp_path / "s")
    with pytest.raises(InvalidInputError, match="no labels"):
        train(tmp_path / "s", _config("sage"), 1, [2, 2], 16, 0.01, 0, tmp_path / "c", False)


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--hidden", "1000000000"], r"--hidden: hidden_dim must be an int in \[1, 1048576\]"),
        (["--layers", "1000000"], r"--layers: num_layers must be an int in \[1, 16\]"),
        (["--heads", "100", "--arch", "gat"], r"--heads: heads must be an int in \[1, 64\]"),
        (["--dropout", "1.5"], r"--dropout: dropout must be in \[0, 1\)"),
        (
            ["--hidden", "1048576", "--layers", "3", "--fanouts", "2,2,2"],
            r"--hidden: .* more than the limit",
        ),
    ],
)
def test_cli_flags_hit_the_model_bounds(
    sbm_store: Path, tmp_path: Path, capsys, flags: list[str], message: str
) -> None:
    argv = ["train", "--store", str(sbm_store), "--out", str(tmp_path / "c"), "--epochs", "1"]
    assert main([*argv, "--no-progress", *flags]) == 2
    assert re.search(r"^error: " + message, capsys.readouterr().err, re.M)
    assert not (tmp_path / "c").exists()


def test_a_model_no_better_than_the_majority_class_is_warned(tmp_path: Path, caplog) -> None:
    """Features and edges of pure noise: nothing to learn, so val accuracy cannot beat
    always answering the commonest class; a learnable graph gets no warning."""
    rng = np.random.default_rng(0)
    n = 600
    labels = (rng.random(n) < 0.8).astype(np.int64)  # 80% class 1
    masks = {k: np.zeros(n, dtype=bool) for k in ("train_mask", "val_mask", "test_mask")}
    for i, k in enumerate(masks):
        masks[k][i::3] = True
    x = rng.normal(size=(n, 8)).astype(np.float32)
    edges = rng.integers(0, n, size=(2, 3000))
    edges = edges[:, edges[0] != edges[1]]
    data = GraphData("noise", n, edges, x, labels, **masks)
    write_store(data, tmp_path / "noise")
    config = ModelConfig("gcn", in_dim=8, hidden_dim=8, out_dim=2, num_layers=2)
    with caplog.at_level("WARNING", logger="gnnserve.models.train"):
        report = train(tmp_path / "noise", config, epochs=2, fanouts=[2, 2], batch_size=64,
                       lr=0.01, seed=0, out_dir=tmp_path / "c", progress=False)  # fmt: skip
    val = np.flatnonzero(masks["val_mask"])
    assert report.majority_val_acc == np.bincount(labels[val]).max() / val.size
    m = np.bincount(labels[val]).max() / val.size
    chance = 2 * (m * (1 - m) / val.size) ** 0.5  # two binomial standard errors
    assert report.val_acc is not None and report.val_acc <= report.majority_val_acc + chance
    assert any("does not beat" in r.message for r in caplog.records)
    assert load_checkpoint(tmp_path / "c").meta["majority_val_acc"] == report.majority_val_acc


def test_a_learning_model_is_not_warned(sbm_store: Path, tmp_path: Path, caplog) -> None:
    with caplog.at_level("WARNING", logger="gnnserve.models.train"):
        report = train(sbm_store, _config("sage"), epochs=3, fanouts=[5, 5], batch_size=128,
                       lr=0.01, seed=0, out_dir=tmp_path / "c", progress=False)  # fmt: skip
    assert report.val_acc is not None and report.majority_val_acc is not None
    assert report.val_acc > report.majority_val_acc
    assert not any("does not beat" in r.message for r in caplog.records)
