"""FaaS-GNN's peak-memory predictor (§4.3) and the measurement it learns from.

:func:`peak_memory` (``models.peakmem``, re-exported here) measures the peak resident-memory
increase of this process while a function runs. :func:`profile` measures requests that way and
:class:`MemoryPredictor`, a 2-layer MLP (hidden 16), learns a request's peak inference memory
from :func:`request_features`, the per-layer vertex and edge counts of its sampled subgraph.
The adaptive feature cache sizes itself by the prediction (``features.adaptive_cache``). Saved
beside a model checkpoint as ``memory_predictor.pt`` + ``memory_predictor.json``; loading
refuses a predictor profiled for another layer count or model version.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from gnnserve.data.meta import read_meta_file
from gnnserve.errors import InvalidInputError, StoreFormatError
from gnnserve.models import checkpoint
from gnnserve.models.peakmem import (
    PeakMemoryUnavailableError,
    configure_malloc,
    peak_memory,
    resident_bytes,
)
from gnnserve.types import SampledSubgraph
from gnnserve.urls import local_path

__all__ = [
    "MemoryPredictor",
    "PeakMemoryUnavailableError",
    "PredictorInfo",
    "checkpoint_identity",
    "configure_malloc",
    "feature_names",
    "peak_memory",
    "profile",
    "relative_errors",
    "request_features",
    "resident_bytes",
]

PREDICTOR_WEIGHTS = "memory_predictor.pt"
PREDICTOR_META = "memory_predictor.json"
FORMAT = "gnnserve-memory-predictor"
FORMAT_VERSION = 1
COUNTS = ("n_src", "n_dst", "edges")  # request_features per block, input layer first
_FIELD = "memory_predictor"


def feature_names(num_layers: int) -> list[str]:
    """Names of the :func:`request_features` columns: ``block{i}.{count}``, input layer first."""
    return [f"block{i}.{c}" for i in range(num_layers) for c in COUNTS]


def request_features(subgraph: SampledSubgraph) -> np.ndarray:
    """float64 [3 * layers]: per block, input layer first, (n_src, n_dst, edges)."""
    counts = [(b.n_src, b.n_dst, int(b.edge_index.size(1))) for b in subgraph.blocks]
    return np.asarray(counts, dtype=np.float64).reshape(-1)


def profile(
    samples: Sequence[tuple[SampledSubgraph, Callable[[], object]]], warmup: int = 1
) -> tuple[np.ndarray, np.ndarray]:
    """``(X, y)``: :func:`request_features` of each sample's subgraph [n, 3L] and the peak
    memory of running its function (bytes, [n]). The first function runs ``warmup`` times
    unmeasured first (lazy initialisation belongs to no request)."""
    if not samples:
        raise InvalidInputError("profile needs at least one sample", "samples")
    X = [request_features(s) for s, _ in samples]
    if len({x.size for x in X}) != 1:
        raise InvalidInputError("every sample must have the same number of blocks", "samples")
    for _ in range(warmup):
        samples[0][1]()
    y = [peak_memory(fn)[1] for _, fn in samples]
    return np.stack(X), np.asarray(y, dtype=np.float64)


def relative_errors(predicted: np.ndarray, actual: np.ndarray) -> dict[str, float]:
    """``mean_rel_error`` and ``max_rel_error`` of ``|predicted - actual| / max(actual, 1)``."""
    rel = np.abs(predicted - actual) / np.maximum(actual, 1.0)
    return {"mean_rel_error": float(rel.mean()), "max_rel_error": float(rel.max())}


class _MLP(torch.nn.Module):
    """Linear -> tanh -> Linear on standardised log1p inputs; the scalings are buffers."""

    x_mean: torch.Tensor  # float64 [width]: mean of log1p(X) over the training set
    x_std: torch.Tensor  # float64 [width]
    y_mean: torch.Tensor  # float64 [1]: mean of log1p(y)
    y_std: torch.Tensor  # float64 [1]

    def __init__(self, width: int, hidden: int) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(width, hidden), torch.nn.Tanh(), torch.nn.Linear(hidden, 1)
        )
        for name, size in (("x_mean", width), ("x_std", width), ("y_mean", 1), ("y_std", 1)):
            self.register_buffer(name, torch.zeros(size, dtype=torch.float64))

    def scale(self, X: np.ndarray) -> torch.Tensor:
        x = (torch.from_numpy(np.log1p(X)) - self.x_mean) / self.x_std
        return x.to(torch.float32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x).squeeze(1)


@dataclass
class PredictorInfo:
    """What a MemoryPredictor records in its JSON file besides the weights."""

    num_layers: int
    model_version: str
    hidden: int
    train_size: int = 0
    held_out: dict[str, float] | None = None  # relative errors on data not trained on
    fanouts: list[int] | None = None  # the sampling fanouts profiled (None: not recorded)


class MemoryPredictor:
    """Predicts a request's peak inference memory (bytes) from :func:`request_features`.

    A 2-layer MLP (hidden 16, tanh). Inputs are ``log1p`` counts, target ``log1p`` bytes, both
    standardised by the training set's mean and std: memory spans orders of magnitude across
    requests, and a squared error in log space weighs every request by its relative error.
    """

    def __init__(
        self,
        num_layers: int,
        model_version: str = "",
        hidden: int = 16,
        fanouts: Sequence[int] | None = None,
    ) -> None:
        if not 1 <= num_layers <= 64:
            raise InvalidInputError(f"num_layers must be in [1, 64], got {num_layers}", "layers")
        listed = None if fanouts is None else [int(f) for f in fanouts]
        self.info = PredictorInfo(int(num_layers), str(model_version), int(hidden), fanouts=listed)
        self.mlp = _MLP(3 * self.info.num_layers, self.info.hidden)

    @property
    def num_layers(self) -> int:
        """GNN layers (blocks) of the requests this predicts for."""
        return self.info.num_layers

    def _check(self, X: np.ndarray, y: np.ndarray | None = None) -> np.ndarray:
        X = np.atleast_2d(np.asarray(X, dtype=np.float64))
        width = 3 * self.num_layers
        if X.ndim != 2 or X.shape[1] != width:
            raise InvalidInputError(f"X must be [n, {width}], got {list(X.shape)}", "X")
        if not np.isfinite(X).all() or (X < 0).any():
            raise InvalidInputError("X must hold finite counts >= 0", "X")
        if y is not None and (np.shape(y) != (X.shape[0],) or not np.all(np.asarray(y) >= 0)):
            raise InvalidInputError(f"y must be {X.shape[0]} byte counts >= 0", "y")
        return X

    def fit(
        self,
        X: np.ndarray,
        y: np.ndarray,
        epochs: int = 1500,
        seed: int = 0,
        validation: tuple[np.ndarray, np.ndarray] | None = None,
    ) -> MemoryPredictor:
        """Train on ``X`` [n, 3L] and peak bytes ``y`` [n]: full-batch Adam for ``epochs`` steps
        (lr 0.02, cosine decay), seeded. ``validation``: held-out (X, y) whose errors
        :meth:`evaluate` records for :meth:`save`. Returns self."""
        X, y = self._check(X, y), np.asarray(y, dtype=np.float64)
        if X.shape[0] < 2:
            raise InvalidInputError("fit needs at least 2 samples", "X")
        mlp = self.mlp
        logx, logy = np.log1p(X), np.log1p(y)
        mlp.x_mean.copy_(torch.from_numpy(logx.mean(0)))
        mlp.x_std.copy_(torch.from_numpy(np.maximum(logx.std(0), 1e-6)))
        mlp.y_mean.fill_(float(logy.mean()))
        mlp.y_std.fill_(max(float(logy.std()), 1e-6))
        inputs = mlp.scale(X)
        target = ((torch.from_numpy(logy) - mlp.y_mean) / mlp.y_std).to(torch.float32)
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            for layer in mlp.net:
                if isinstance(layer, torch.nn.Linear):
                    layer.reset_parameters()
        opt = torch.optim.Adam(mlp.net.parameters(), lr=0.02)
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, max(1, epochs))
        mlp.train()
        for _ in range(epochs):
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(mlp(inputs), target)
            loss.backward()
            opt.step()
            sched.step()
        mlp.eval()
        self.info.train_size = int(X.shape[0])
        self.info.held_out = None if validation is None else self.evaluate(*validation)
        return self

    def predict(self, X: np.ndarray) -> np.ndarray:
        """Predicted peak bytes (float64 [n], >= 0) of requests ``X`` [n, 3L] (or one [3L])."""
        X = self._check(X)
        with torch.inference_mode():
            out = self.mlp(self.mlp.scale(X)).to(torch.float64)
            log = out * self.mlp.y_std + self.mlp.y_mean
        return np.maximum(np.expm1(log.numpy()), 0.0)

    def evaluate(self, X: np.ndarray, y: np.ndarray) -> dict[str, float]:
        """Relative errors of :meth:`predict` on (X, y): see :func:`relative_errors`."""
        X = self._check(X, y)
        return relative_errors(self.predict(X), np.asarray(y, dtype=np.float64))

    def save(self, directory: str | Path) -> Path:
        """Write ``memory_predictor.pt`` and ``.json`` into ``directory`` (a checkpoint's); an
        empty model version is taken from the checkpoint there. Returns the JSON path."""
        root = local_path(directory, "model_path")
        root.mkdir(parents=True, exist_ok=True)
        if not self.info.model_version:
            identity = checkpoint_identity(root)
            self.info.model_version = identity[1] if identity else ""
        torch.save(self.mlp.state_dict(), root / PREDICTOR_WEIGHTS)
        doc = {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "feature_layout": feature_names(self.num_layers),
            "transform": "inputs and target log1p, standardised by the training set",
            **self.info.__dict__,
            "weights_sha256": checkpoint.file_sha256(root / PREDICTOR_WEIGHTS),
        }
        path = root / PREDICTOR_META
        path.write_text(json.dumps(doc, indent=2, sort_keys=True))
        return path

    @classmethod
    def load(
        cls,
        directory: str | Path,
        num_layers: int | None = None,
        model_version: str | None = None,
        fanouts: Sequence[int] | None = None,
    ) -> MemoryPredictor:
        """The predictor saved in ``directory``. StoreFormatError naming the file when it is
        missing, malformed, or profiled for another layer count, model version or sampling
        fanouts than expected (``num_layers``/``model_version``; None: those of the checkpoint
        in ``directory``; ``fanouts``: None accepts any)."""
        root = local_path(directory, "model_path")
        path = root / PREDICTOR_META
        doc = read_meta_file(
            path,
            _FIELD,
            version=FORMAT_VERSION,
            missing=f"no memory predictor: {path} missing",
            format_name=FORMAT,
            kind="file",
        )
        info = _parse_info(doc, path)
        identity = checkpoint_identity(root)
        want_layers = num_layers if num_layers is not None else identity and identity[0]
        want_version = model_version if model_version is not None else identity and identity[1]
        _expect(path, "layer count", info.num_layers, want_layers)
        _expect(path, "model version", info.model_version, want_version)
        if fanouts is not None and info.fanouts != [int(f) for f in fanouts]:
            raise StoreFormatError(
                f"{path} was profiled with fanouts {info.fanouts}, this deployment samples with "
                f"{list(fanouts)}: profile it again with --fanouts "
                f"{','.join(str(f) for f in fanouts)} (gnnserve faas profile)",
                _FIELD,
            )
        predictor = cls(info.num_layers, info.model_version, info.hidden)
        predictor.info = info
        weights = root / PREDICTOR_WEIGHTS
        try:
            predictor.mlp.load_state_dict(_load_state(weights, doc))
        except RuntimeError as exc:  # missing, unexpected or mis-shaped tensors
            raise StoreFormatError(f"{weights} does not match {path}: {exc}", _FIELD) from exc
        predictor.mlp.eval()
        return predictor

    @classmethod
    def load_if_present(
        cls, directory: str | Path, fanouts: Sequence[int] | None = None
    ) -> MemoryPredictor | None:
        """:meth:`load`, or None when ``directory`` (a path or file URL) holds no memory
        predictor."""
        if not (local_path(directory, "model_path") / PREDICTOR_META).is_file():
            return None
        return cls.load(directory, fanouts=fanouts)


def checkpoint_identity(directory: Path) -> tuple[int, str] | None:
    """(num_layers, version ``name@sha[:12]``) of the checkpoint in ``directory``, read from its
    config.json without loading the weights; None where there is none."""
    path = directory / checkpoint.CONFIG
    if not path.is_file():
        return None
    doc = read_meta_file(
        path,
        "model_path",
        version=checkpoint.FORMAT_VERSION,
        missing=str(path),
        format_name=checkpoint.FORMAT,
        kind="config",
    )
    model, meta = doc.get("model"), doc.get("meta")
    if not isinstance(model, dict) or not isinstance(meta, dict):
        raise StoreFormatError(f"{path}: 'model' and 'meta' must be objects", "model_path")
    name = meta.get("name") or directory.resolve().name
    return int(model.get("num_layers", 0)), f"{name}@{str(doc.get('weights_sha256', ''))[:12]}"


def _parse_info(doc: dict[str, Any], path: Path) -> PredictorInfo:
    try:
        info = PredictorInfo(
            int(doc["num_layers"]),
            str(doc["model_version"]),
            int(doc["hidden"]),
            int(doc["train_size"]),
            doc.get("held_out"),
            None if doc.get("fanouts") is None else [int(f) for f in doc["fanouts"]],
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise StoreFormatError(f"{path}: missing or malformed field {exc}", _FIELD) from exc
    if not 1 <= info.num_layers <= 64 or not 1 <= info.hidden <= 4096:
        raise StoreFormatError(f"{path}: num_layers or hidden out of range", _FIELD)
    if doc.get("feature_layout") != feature_names(info.num_layers):
        raise StoreFormatError(f"{path}: feature layout is not {COUNTS} per block", _FIELD)
    return info


def _expect(path: Path, what: str, found: object, want: object) -> None:
    """Refuse ``path`` when ``want`` is set (not None or empty) and differs from ``found``."""
    if want not in (None, "", 0) and found != want:
        raise StoreFormatError(
            f"{path} was profiled for {what} {found!r}, the model has {want!r}: profile it "
            "again for this model (gnnserve faas profile)",
            _FIELD,
        )


def _load_state(path: Path, doc: dict[str, Any]) -> dict[str, torch.Tensor]:
    if not path.is_file():
        raise StoreFormatError(f"memory predictor weights missing: {path}", _FIELD)
    if checkpoint.file_sha256(path) != doc.get("weights_sha256"):
        raise StoreFormatError(f"{path}: sha256 does not match {PREDICTOR_META}", _FIELD)
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises several types for unsafe or corrupt files
        raise StoreFormatError(f"{path}: refused to load: {exc}", _FIELD) from exc
    if not isinstance(state, dict):
        raise StoreFormatError(f"{path}: expected a dict of name -> tensor", _FIELD)
    return state
