"""Training on sampled mini-batches (``gnnserve train``): NeighborSampler + FeatureStore + blocks.

The model trains with the same block forward it is served with. Each epoch reports validation
accuracy; the weights of the best validation epoch are written as a checkpoint.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

from gnnserve.data import integrity, layout
from gnnserve.errors import InvalidInputError
from gnnserve.fanouts import check_fanouts, parse_fanouts
from gnnserve.features import FeatureStore, open_feature_store
from gnnserve.graph import open_graph_store
from gnnserve.models.checkpoint import save_checkpoint
from gnnserve.models.zoo import GNN, MODELS, ModelConfig
from gnnserve.sampling import NeighborSampler
from gnnserve.types import Block

log = logging.getLogger(__name__)


@dataclass
class TrainReport:
    """Outcome of :func:`train`; accuracies are fractions in [0, 1] (None: split absent)."""

    best_epoch: int  # 1-based epoch whose weights were kept
    val_acc: float | None  # validation accuracy of the kept weights
    test_acc: float | None  # test accuracy of the kept weights
    epoch_val_acc: list[float] = field(default_factory=list)  # per epoch
    majority_val_acc: float | None = None  # accuracy of always answering the commonest class
    val_size: int = 0  # validation nodes
    epoch_loss: list[float] = field(default_factory=list)  # mean training loss per epoch
    seconds: float = 0.0  # wall time of the whole run
    checkpoint: str = ""  # directory written
    version: str = ""  # model version (name@sha)


@dataclass
class _Data:
    """What training reads from a store."""

    sampler: NeighborSampler
    features: FeatureStore
    in_degree: torch.Tensor  # float32 [N]
    labels: torch.Tensor  # int64 [N]
    splits: dict[str, np.ndarray]  # "train" | "val" | "test" -> int64 node ids
    checksum: str  # store identity


def _open(store_dir: str | Path, config: ModelConfig, fanouts: list[int], seed: int) -> _Data:
    meta = layout.read_meta(store_dir)
    if not meta.has_labels or "train_mask" not in meta.masks:
        raise InvalidInputError(f"{store_dir} has no labels/train_mask to train on", "store")
    if config.in_dim != meta.feature_dim:
        raise InvalidInputError(
            f"in_dim {config.in_dim} != store feature width {meta.feature_dim}", "in_dim"
        )
    if config.out_dim < meta.num_classes:
        raise InvalidInputError(
            f"out_dim {config.out_dim} < store classes {meta.num_classes}", "out_dim"
        )
    if len(fanouts) != config.num_layers:
        raise InvalidInputError(
            f"{len(fanouts)} fanouts for a {config.num_layers}-layer model", "fanouts"
        )
    graph = open_graph_store(store_dir)
    labels = integrity.load_labels(store_dir, meta)
    splits = {}
    for name in ("train", "val", "test"):
        if f"{name}_mask" in meta.masks:
            mask = integrity.load_mask(store_dir, meta, f"{name}_mask")
            splits[name] = np.flatnonzero(mask & (labels >= 0)).astype(np.int64)
    if splits["train"].size == 0:
        raise InvalidInputError("train_mask selects no labelled node", "store")
    return _Data(
        sampler=NeighborSampler(graph, fanouts, seed=seed),
        features=open_feature_store(store_dir),
        in_degree=torch.from_numpy(graph.in_degree_without_self_loops().astype(np.float32)),
        labels=torch.from_numpy(labels.astype(np.int64)),
        splits=splits,
        checksum=graph.version,
    )


Batch = tuple[torch.Tensor, list[Block], torch.Tensor, torch.Tensor]  # x, blocks, degree, labels


def _make_batch(data: _Data, sampler: NeighborSampler, ids: np.ndarray, rng_seed: int) -> Batch:
    sg = sampler.sample(ids, rng_seed=rng_seed)
    nodes = torch.from_numpy(sg.input_nodes)
    seeds = torch.from_numpy(sg.nodes[: sg.num_seeds])
    x = data.features.get(sg.input_nodes)
    return x, sg.blocks, data.in_degree[nodes], data.labels[seeds]


def _batches(
    data: _Data, sampler: NeighborSampler, ids: np.ndarray, size: int, seed: int
) -> Iterator[Batch]:
    """Mini-batches of ``ids`` (sampling seed ``seed + i`` for batch i); the next batch is sampled
    in a worker thread (numba kernels release the GIL) while the model computes."""
    chunks = [ids[i : i + size] for i in range(0, ids.size, size)]
    if not chunks:
        return
    with ThreadPoolExecutor(max_workers=1) as pool:
        pending = pool.submit(_make_batch, data, sampler, chunks[0], seed)
        for i in range(1, len(chunks) + 1):
            batch = pending.result()
            if i < len(chunks):
                pending = pool.submit(_make_batch, data, sampler, chunks[i], seed + i)
            yield batch


@torch.inference_mode()
def evaluate(
    model: GNN, data: _Data, ids: np.ndarray, sampler: NeighborSampler, batch_size: int
) -> float:
    """Accuracy (fraction) of ``model`` on ``ids`` with sampled blocks, fixed sampling seed."""
    model.eval()
    correct = 0
    for x, blocks, deg, y in _batches(data, sampler, ids, batch_size, seed=12345):
        logits, _ = model.forward_blocks(x, blocks, deg)
        correct += int((logits.argmax(dim=1) == y).sum())
    return correct / max(ids.size, 1)


def _epoch(
    model: GNN,
    opt: torch.optim.Optimizer,
    data: _Data,
    rng: np.random.Generator,
    batch_size: int,
    bar_title: str | None,
) -> float:
    """One pass over the shuffled train split; mean cross-entropy. ``bar_title`` None: no bar."""
    model.train()
    ids = rng.permutation(data.splits["train"])
    seed = int(rng.integers(1 << 62))
    total, count = 0.0, 0
    bar = tqdm(
        _batches(data, data.sampler, ids, batch_size, seed),
        total=-(-ids.size // batch_size),
        desc=bar_title,
        disable=True if bar_title is None else None,  # None: only on a terminal
        leave=False,
    )
    for x, blocks, deg, y in bar:
        opt.zero_grad(set_to_none=True)
        logits, _ = model.forward_blocks(x, blocks, deg)
        loss = F.cross_entropy(logits, y)
        loss.backward()
        opt.step()
        total += float(loss.detach()) * y.numel()
        count += y.numel()
        bar.set_postfix(loss=f"{total / count:.4f}")
    return total / max(count, 1)


@contextlib.contextmanager
def _torch_threads(threads: int | None) -> Iterator[int]:
    """Run with ``threads`` intra-op threads (default: the CPUs this process may use)."""
    before = torch.get_num_threads()
    if threads is None:
        threads = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else before
    torch.set_num_threads(max(1, int(threads)))
    try:
        yield torch.get_num_threads()
    finally:
        torch.set_num_threads(before)


def train(
    store_dir: str | Path,
    config: ModelConfig,
    epochs: int,
    fanouts: list[int],
    batch_size: int,
    lr: float,
    seed: int,
    out_dir: str | Path,
    progress: bool = True,
    eval_fanouts: list[int] | None = None,
    weight_decay: float = 5e-4,
    threads: int | None = None,
) -> TrainReport:
    """Train ``config`` on the store's train split and write the best-validation checkpoint.

    ``fanouts`` (nearest hop first, -1 = all) drive training; evaluation uses ``eval_fanouts``
    (default: the same). ``lr`` is Adam's learning rate; ``threads`` the torch intra-op threads
    (default: every CPU this process may use).
    """
    for name, value in (("epochs", epochs), ("batch_size", batch_size), ("lr", lr)):
        if not value > 0:
            raise InvalidInputError(f"{name} must be positive, got {value!r}", name)
    fanouts = check_fanouts(fanouts)
    start = time.perf_counter()
    data = _open(store_dir, config, fanouts, seed)
    eval_sampler = NeighborSampler(data.sampler.graph, check_fanouts(eval_fanouts or fanouts))
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    model = GNN(config)
    opt = torch.optim.Adam(model.parameters(), lr=lr, weight_decay=weight_decay)
    report = TrainReport(best_epoch=0, val_acc=None, test_acc=None)
    best_state: dict[str, torch.Tensor] = {}
    say = _printer(progress)
    with _torch_threads(threads):
        for epoch in range(1, epochs + 1):
            title = f"epoch {epoch}/{epochs}" if progress else None
            loss = _epoch(model, opt, data, rng, batch_size, title)
            val = _split_acc(model, data, "val", eval_sampler, batch_size)
            report.epoch_loss.append(loss)
            report.epoch_val_acc.append(val if val is not None else float("nan"))
            say(f"epoch {epoch}/{epochs}: loss {loss:.4f}, val acc {_fmt(val)}")
            if val is None or report.val_acc is None or val > report.val_acc:
                report.best_epoch, report.val_acc = epoch, val
                best_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        model.load_state_dict(best_state)
        report.test_acc = _split_acc(model, data, "test", eval_sampler, batch_size)
    say(
        f"best epoch {report.best_epoch}: val acc {_fmt(report.val_acc)}, "
        f"test acc {_fmt(report.test_acc)}"
    )
    report.majority_val_acc = _majority_acc(data, "val")
    report.val_size = int(data.splits.get("val", np.empty(0)).size)
    _warn_if_no_better_than_majority(report)
    report.seconds = time.perf_counter() - start
    meta = {
        "store_checksum": data.checksum,
        "store_dir": str(Path(store_dir).resolve()),
        "val_acc": report.val_acc,
        "majority_val_acc": report.majority_val_acc,
        "test_acc": report.test_acc,
        "fanouts": fanouts,
        "eval_fanouts": eval_sampler.fanouts,
        "epochs": epochs,
        "best_epoch": report.best_epoch,
        "batch_size": batch_size,
        "lr": lr,
        "weight_decay": weight_decay,
        "seed": seed,
        "train_seconds": round(report.seconds, 2),
    }
    report.version = save_checkpoint(out_dir, model, config, meta)
    report.checkpoint = str(out_dir)
    return report


def _split_acc(
    model: GNN, data: _Data, split: str, sampler: NeighborSampler, batch_size: int
) -> float | None:
    ids = data.splits.get(split)
    if ids is None or ids.size == 0:
        return None
    return evaluate(model, data, ids, sampler, max(batch_size, 1024))


def _majority_acc(data: _Data, split: str) -> float | None:
    """Accuracy on ``split`` of always answering its most common label (None: no such split)."""
    ids = data.splits.get(split)
    if ids is None or ids.size == 0:
        return None
    counts = torch.bincount(data.labels[torch.from_numpy(ids)])
    return float(counts.max()) / ids.size


def _warn_if_no_better_than_majority(report: TrainReport) -> None:
    """Log a warning when the kept weights do not beat the majority-class answer on val by
    more than two binomial standard errors (the best epoch is picked on val, so luck alone
    lifts it a little above the majority)."""
    m = report.majority_val_acc
    if report.val_acc is None or m is None or report.val_size == 0:
        return
    margin = 2.0 * (m * (1.0 - m) / report.val_size) ** 0.5
    if report.val_acc <= m + margin:
        log.warning(
            "validation accuracy %.4f does not beat always answering the commonest class "
            "(%.4f) by more than chance (%.4f): the model has learned nothing useful to serve; "
            "train longer (--epochs), change --lr, or check that the features carry signal",
            report.val_acc,
            m,
            margin,
        )


def _printer(progress: bool) -> Callable[[str], None]:
    """Epoch summaries: above the progress bars on stderr (stdout stays for results), or logged."""
    if progress:
        return lambda text: tqdm.write(text, file=sys.stderr)
    return log.info


def _fmt(acc: float | None) -> str:
    return "n/a" if acc is None else f"{acc:.4f}"


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Flags of ``gnnserve train``."""
    p.add_argument("--store", required=True, help="store directory (gnnserve prepare)")
    p.add_argument("--out", required=True, help="checkpoint directory to write")
    p.add_argument("--arch", default="sage", choices=MODELS.names(), help="architecture")
    p.add_argument("--layers", type=int, default=2, help="message-passing layers")
    p.add_argument("--hidden", type=int, default=256, help="hidden width")
    p.add_argument("--heads", type=int, default=4, help="GAT attention heads")
    p.add_argument("--dropout", type=float, default=0.5, help="dropout probability")
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--fanouts", default="25,10", help="per hop, nearest first; -1 = all")
    p.add_argument("--eval-fanouts", default=None, help="fanouts for evaluation (default: same)")
    p.add_argument("--batch-size", type=int, default=512, help="seed nodes per mini-batch")
    p.add_argument("--lr", type=float, default=0.01, help="Adam learning rate")
    p.add_argument("--weight-decay", type=float, default=5e-4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: all CPUs)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")


# ModelConfig field -> the `gnnserve train` flag that sets it (the others come from the store)
_FLAGS = {
    "hidden_dim": "--hidden",
    "num_layers": "--layers",
    "heads": "--heads",
    "dropout": "--dropout",
    "arch": "--arch",
}


def run(args: argparse.Namespace) -> int:
    """``gnnserve train``: train, write the checkpoint, print the report as JSON; exit code."""
    meta = layout.read_meta(args.store)
    try:
        config = ModelConfig(
            arch=args.arch,
            in_dim=meta.feature_dim,
            hidden_dim=args.hidden,
            out_dim=max(meta.num_classes, 1),
            num_layers=args.layers,
            heads=args.heads,
            dropout=args.dropout,
        )
    except InvalidInputError as exc:  # name the flag: ModelConfig's bounds apply to it
        flag = _FLAGS.get(exc.field or "", "--store")
        raise InvalidInputError(f"{flag}: {exc.message}", exc.field) from None
    report = train(
        args.store,
        config,
        epochs=args.epochs,
        fanouts=parse_fanouts(args.fanouts, "--fanouts") or [],
        batch_size=args.batch_size,
        lr=args.lr,
        seed=args.seed,
        out_dir=args.out,
        progress=not args.no_progress,
        eval_fanouts=parse_fanouts(args.eval_fanouts, "--eval-fanouts"),
        weight_decay=args.weight_decay,
        threads=args.threads,
    )
    print(json.dumps(asdict(report), indent=2))
    return 0
