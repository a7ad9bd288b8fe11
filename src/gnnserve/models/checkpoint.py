"""Checkpoint format: a directory with ``config.json`` and ``weights.pt`` (a plain state_dict).

``config.json`` holds the :class:`ModelConfig`, the training metadata (store checksum, accuracy,
fanouts, date, ...) and the sha256 of ``weights.pt``. Weights load with
``torch.load(weights_only=True)``: tensors only, no code is ever unpickled. Every problem with a
checkpoint raises :class:`~gnnserve.errors.StoreFormatError` naming the file.
"""

from __future__ import annotations

import ctypes
import datetime as dt
import hashlib
import json
from pathlib import Path
from typing import Any, NamedTuple

import torch

from gnnserve.data.meta import read_meta_file
from gnnserve.errors import GnnServeError, StoreFormatError
from gnnserve.models.zoo import GNN, ModelConfig, skeleton
from gnnserve.urls import local_path

CONFIG = "config.json"
WEIGHTS = "weights.pt"
FORMAT = "gnnserve-checkpoint"
FORMAT_VERSION = 1
_FIELD = "model_path"


class Checkpoint(NamedTuple):
    """A loaded checkpoint; unpacks as ``(model, config, meta)``."""

    model: GNN  # in eval mode, on CPU
    config: ModelConfig  # architecture and sizes
    meta: dict[str, Any]  # training metadata, plus "version" and "weights_sha256"

    @property
    def version(self) -> str:
        """Model identity ``name@sha256(weights.pt)[:12]``."""
        return str(self.meta["version"])


def file_sha256(path: Path, chunk_bytes: int = 1 << 22) -> str:
    """sha256 of a file's bytes, hex (streamed)."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(chunk_bytes):
            digest.update(chunk)
    return digest.hexdigest()


def save_checkpoint(
    directory: str | Path, model: GNN, config: ModelConfig, meta: dict[str, Any] | None = None
) -> str:
    """Write ``model``'s weights and ``config`` + ``meta`` into ``directory``; return the version.

    ``meta`` must be JSON-able; ``name`` defaults to the directory name and ``date`` to now (UTC).
    """
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().cpu().contiguous().clone() for k, v in model.state_dict().items()}
    torch.save(state, root / WEIGHTS)
    sha = file_sha256(root / WEIGHTS)
    info = dict(meta or {})
    info.setdefault("name", root.resolve().name)
    info.setdefault("date", dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"))
    doc = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "model": config.to_dict(),
        "meta": info,
        "weights_sha256": sha,
    }
    (root / CONFIG).write_text(json.dumps(doc, indent=2, sort_keys=True))
    return f"{info['name']}@{sha[:12]}"


def _read_config(root: Path) -> tuple[ModelConfig, dict[str, Any], str]:
    path = root / CONFIG
    doc = read_meta_file(
        path,
        _FIELD,
        version=FORMAT_VERSION,
        missing=f"{root} is not a gnnserve checkpoint: {CONFIG} missing",
        format_name=FORMAT,
        kind="config",
    )
    try:
        config = ModelConfig.from_dict(doc.get("model"))  # type: ignore[arg-type]
    except GnnServeError as exc:
        raise StoreFormatError(f"{path}: bad model config: {exc.message}", _FIELD) from exc
    meta = doc.get("meta")
    if not isinstance(meta, dict):
        raise StoreFormatError(f"{path}: 'meta' must be an object", _FIELD)
    return config, meta, str(doc.get("weights_sha256", ""))


def _reason(exc: BaseException) -> str:
    """The informative line of a torch.load error (torch's first line advises unsafe loading)."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    for line in lines:
        if "GLOBAL" in line or "Unsupported" in line:
            return line
    return lines[-1] if lines else type(exc).__name__


def _load_state(path: Path, expected_sha: str) -> tuple[dict[str, torch.Tensor], str]:
    if not path.is_file():
        raise StoreFormatError(f"checkpoint weights missing: {path}", _FIELD)
    sha = file_sha256(path)
    if expected_sha and sha != expected_sha:
        raise StoreFormatError(
            f"{path}: sha256 {sha[:12]} does not match config.json ({expected_sha[:12]}); "
            "the weights were modified or belong to another checkpoint",
            _FIELD,
        )
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises several types for unsafe or corrupt files
        raise StoreFormatError(
            f"{path}: refused to load (only plain tensors are accepted): {_reason(exc)}", _FIELD
        ) from exc
    if not isinstance(state, dict) or not all(
        isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in state.items()
    ):
        raise StoreFormatError(f"{path}: expected a dict of name -> tensor", _FIELD)
    return state, sha


def _check_size(config: ModelConfig, path: Path) -> None:
    """Refuse a config implying more parameters than ``path`` has bytes (>= 1 byte per element),
    before the model is built: a tampered config.json must not allocate beyond the weights."""
    if not path.is_file():
        raise StoreFormatError(f"checkpoint weights missing: {path}", _FIELD)
    need, size = config.num_parameters(), path.stat().st_size
    if need > size:
        raise StoreFormatError(
            f"{path.parent / CONFIG} describes a model of {need:,} parameters (hidden_dim "
            f"{config.hidden_dim}, num_layers {config.num_layers}), more than {path.name} "
            f"({size:,} bytes) can hold",
            _FIELD,
        )


def state_shapes(model: torch.nn.Module) -> dict[str, tuple[int, ...]]:
    """Name -> shape of each tensor ``model.state_dict()`` holds (parameters and persistent
    buffers), read without calling it: PyG's ``Linear`` asks ``torch.onnx`` there whether it is
    exporting, and that first import costs ~2 s (torch._dynamo with it) at every start-up."""
    shapes = {name: tuple(p.shape) for name, p in model.named_parameters()}
    for prefix, module in model.named_modules():
        for name, buf in module._buffers.items():
            if buf is not None and name not in module._non_persistent_buffers_set:
                shapes[f"{prefix}.{name}" if prefix else name] = tuple(buf.shape)
    return shapes


def _check_state(model: GNN, state: dict[str, torch.Tensor], path: Path) -> None:
    want = state_shapes(model)
    got = {k: tuple(v.shape) for k, v in state.items()}
    problems = [f"missing {k}" for k in sorted(want.keys() - got.keys())]
    problems += [f"unexpected {k}" for k in sorted(got.keys() - want.keys())]
    problems += [
        f"{k} has shape {list(got[k])}, config needs {list(want[k])}"
        for k in sorted(want.keys() & got.keys())
        if got[k] != want[k]
    ]
    problems += [f"{k} holds NaN or inf" for k, v in state.items() if not torch.isfinite(v).all()]
    if problems:
        shown = "; ".join(problems[:5]) + (
            f" (+{len(problems) - 5} more)" if len(problems) > 5 else ""
        )
        raise StoreFormatError(f"{path} does not match config.json: {shown}", _FIELD)


def _with_weights(config: ModelConfig, state: dict[str, torch.Tensor]) -> GNN:
    """The model holding ``state``'s tensors as its weights: built on the meta device and the
    loaded tensors assigned, so that no random-init copy is allocated beside them (a second
    model then costs its weights' bytes, not twice that)."""
    with torch.device("meta"):
        model = GNN(config)
    model.load_state_dict(state, strict=True, assign=True)
    tensors = [*model.parameters(), *model.buffers()]
    if any(t.is_meta for t in tensors):  # a tensor the state does not hold: build it for real
        model = GNN(config)
        model.load_state_dict(state, strict=True)
    return model


def release_freed_heap() -> None:
    """Give the C heap's free pages back to the OS (glibc ``malloc_trim``; nothing elsewhere).

    A model load frees tens of MB (the file's bytes, decoding buffers) that glibc keeps in its
    heap: without this a server's resident memory grew by ~2.5x a model's weights per model."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.malloc_trim(0)
    except (OSError, AttributeError):
        pass


def load_checkpoint(directory: str | Path) -> Checkpoint:
    """Load a checkpoint directory (a path or file URL) written by :func:`save_checkpoint`
    (model in eval mode)."""
    root = local_path(directory, _FIELD)
    if not root.is_dir():
        raise StoreFormatError(f"checkpoint directory not found: {root}", _FIELD)
    config, meta, expected_sha = _read_config(root)
    _check_size(config, root / WEIGHTS)
    state, sha = _load_state(root / WEIGHTS, expected_sha)
    _check_state(skeleton(config), state, root / WEIGHTS)  # shapes first, allocation after
    model = _with_weights(config, state)
    del state
    release_freed_heap()
    model.eval()
    name = str(meta.get("name") or root.resolve().name)
    meta = {**meta, "weights_sha256": sha, "version": f"{name}@{sha[:12]}"}
    return Checkpoint(model, config, meta)
