"""Importers for the formats users have: the shared ``.npz`` and a PyG ``Data`` (CSV: edgelist).

Each returns a :class:`~gnnserve.data.writer.GraphData`; value checks (id range, shapes, NaN/inf,
empty graph) happen once, in :func:`~gnnserve.data.writer.write_store`. Importers only raise for
what they alone can see: missing or unreadable files, malformed CSV lines, inconsistent sparse
features.
"""

from __future__ import annotations

import re
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

from gnnserve.data.validate import check_edge_index
from gnnserve.data.writer import GraphData
from gnnserve.errors import InvalidInputError

STRUCTURE_FEATURES = ("degree", "random")
_SPARSE_KEYS = ("x_indptr", "x_indices", "x_data", "x_shape")


_FILE_KINDS = {"input": "input", "edges": "edge list", "x": "features", "y": "labels"}


def existing_file(path: str | Path, field: str) -> Path:
    """``path`` as a Path, or InvalidInputError naming ``field`` when it is not a file."""
    p = Path(path)
    if not p.is_file():
        raise InvalidInputError(f"{_FILE_KINDS.get(field, field)} file not found: {p}", field)
    return p


def degree_features(edge_index: np.ndarray, num_nodes: int, dim: int = 16) -> np.ndarray:
    """Deterministic structural features float32 [N, dim] for graphs without any.

    Column 0 is log1p(in-degree), column 1 log1p(out-degree), columns 2.. a one-hot of the
    log2 bucket of the total degree (the last bucket collects all larger degrees).
    """
    if dim < 3:
        raise InvalidInputError(f"degree features need dim >= 3, got {dim}", "feature_dim")
    ei = check_edge_index(edge_index, num_nodes)  # bincount needs valid ids
    in_deg = np.bincount(ei[1], minlength=num_nodes)
    out_deg = np.bincount(ei[0], minlength=num_nodes)
    x = np.zeros((num_nodes, dim), dtype=np.float32)
    x[:, 0] = np.log1p(in_deg)
    x[:, 1] = np.log1p(out_deg)
    bucket = np.minimum(np.floor(np.log2(in_deg + out_deg + 1)).astype(np.int64), dim - 3)
    x[np.arange(num_nodes), 2 + bucket] = 1.0
    return x


def random_features(num_nodes: int, dim: int, seed: int = 0) -> np.ndarray:
    """Seeded standard-normal features float32 [N, dim]."""
    if dim < 1:
        raise InvalidInputError(f"feature_dim must be >= 1, got {dim}", "feature_dim")
    rng = np.random.default_rng(seed)
    return rng.standard_normal((num_nodes, dim), dtype=np.float32)


def structure_only_features(
    edge_index: np.ndarray, num_nodes: int, kind: str, feature_dim: int, seed: int
) -> tuple[np.ndarray, str]:
    """Features for a graph that has none, and a provenance note saying which were used."""
    if kind == "degree":
        return degree_features(edge_index, num_nodes, feature_dim), f"degree(dim={feature_dim})"
    if kind == "random":
        x = random_features(num_nodes, feature_dim, seed)
        return x, f"random(dim={feature_dim},seed={seed})"
    raise InvalidInputError(
        f"structure_features must be one of {STRUCTURE_FEATURES}, got {kind!r}",
        "structure_features",
    )


def _sparse_to_dense(arrays: Any) -> np.ndarray:
    """Densify CSR feature parts (``x_indptr``, ``x_indices``, ``x_data``, ``x_shape``)."""
    try:
        shape = tuple(int(s) for s in np.asarray(arrays["x_shape"]).reshape(-1))
        mat = sp.csr_matrix(
            (arrays["x_data"], arrays["x_indices"], arrays["x_indptr"]), shape=shape
        )
        mat.check_format(full_check=True)  # index bounds: toarray() must not read out of range
    except (ValueError, TypeError, IndexError) as exc:
        raise InvalidInputError(f"sparse features are inconsistent: {exc}", "x") from exc
    return np.asarray(mat.toarray(), dtype=np.float32)


def _scalar_str(value: Any, default: str) -> str:
    arr = np.asarray(value) if value is not None else None
    return str(arr.item()) if arr is not None and arr.size == 1 else default


def load_npz(
    path: str | Path,
    structure_features: str = "degree",
    feature_dim: int = 16,
    seed: int = 0,
) -> GraphData:
    """Load the shared ``.npz`` format (see ``shared/datasets/README.md``).

    Dense ``x`` or sparse CSR features are returned as float32; a structure-only graph gets
    ``structure_features`` ("degree" or "random", ``feature_dim`` wide, ``seed`` for random).
    """
    p = existing_file(path, "input")
    try:
        with np.load(p, allow_pickle=False) as npz:
            arrays = {k: npz[k] for k in npz.files}
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as exc:
        raise InvalidInputError(f"cannot read {p} as .npz: {exc}", "input") from exc
    if "edge_index" not in arrays:
        raise InvalidInputError(f"{p} has no 'edge_index' array", "edge_index")
    edge_index = arrays["edge_index"]
    if "x" in arrays:
        x = arrays["x"]
    elif all(k in arrays for k in _SPARSE_KEYS):
        x = _sparse_to_dense(arrays)
    else:
        x = None
    num_nodes = _num_nodes(arrays.get("num_nodes"), x, p)
    name = _scalar_str(arrays.get("name"), p.stem)
    source = f"npz:{p.name} ({_scalar_str(arrays.get('source'), 'unknown origin')})"
    if x is None:
        x, note = structure_only_features(
            edge_index, num_nodes, structure_features, feature_dim, seed
        )
        source += f"; no features in input, used {note}"
    return GraphData(
        name=name,
        num_nodes=num_nodes,
        edge_index=edge_index,
        x=x,
        y=arrays.get("y"),
        train_mask=arrays.get("train_mask"),
        val_mask=arrays.get("val_mask"),
        test_mask=arrays.get("test_mask"),
        source=source,
    )


def _num_nodes(value: Any, x: np.ndarray | None, path: Path) -> int:
    """N from the ``num_nodes`` entry, else from the feature rows."""
    if value is not None:
        arr = np.asarray(value)
        if arr.size != 1 or not np.issubdtype(arr.dtype, np.integer):
            raise InvalidInputError(f"{path}: num_nodes must be one integer", "num_nodes")
        return int(arr.item())
    if x is not None and np.ndim(x) == 2:
        return int(np.shape(x)[0])
    raise InvalidInputError(f"{path}: no 'num_nodes' and no features to infer it", "num_nodes")


def _pyg_safe_globals() -> list[Any]:
    """Classes a pickled PyG ``Data`` references, to allow-list for ``weights_only`` loading."""
    from gnnserve.deferred_imports import defer_torch_dynamo

    defer_torch_dynamo()
    from torch_geometric.data import Data
    from torch_geometric.data.data import DataEdgeAttr, DataTensorAttr
    from torch_geometric.data.storage import EdgeStorage, GlobalStorage, NodeStorage

    return [Data, DataEdgeAttr, DataTensorAttr, GlobalStorage, NodeStorage, EdgeStorage]


def _tensor_np(value: Any) -> np.ndarray | None:
    """A torch tensor (dense or sparse) or array-like as numpy, None stays None."""
    if value is None:
        return None
    import torch

    if isinstance(value, torch.Tensor):
        t = value.detach().cpu()
        if t.layout != torch.strided:
            t = t.to_dense()
        return np.asarray(t.numpy())
    return np.asarray(value)


def _short(exc: Exception) -> str:
    """The informative line of a torch.load error (weights-only refusals are a page long)."""
    refused = re.search(r"Unsupported global: GLOBAL (\S+)", str(exc))
    if refused:
        return f"it holds {refused.group(1)}; only tensors and PyG Data are loaded"
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    return lines[0] if lines else type(exc).__name__


def load_pyg(
    path: str | Path,
    structure_features: str = "degree",
    feature_dim: int = 16,
    seed: int = 0,
) -> GraphData:
    """Load a ``torch_geometric.data.Data`` saved with ``torch.save`` (or a dict of its fields).

    Loads with ``torch.load(weights_only=True)``: only tensors and the allow-listed PyG
    container classes are unpickled, so a crafted file cannot run code.
    """
    import torch

    p = existing_file(path, "input")
    try:
        with torch.serialization.safe_globals(_pyg_safe_globals()):
            obj = torch.load(p, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises UnpicklingError, RuntimeError, EOFError, ...
        raise InvalidInputError(f"cannot load {p} as a PyG Data: {_short(exc)}", "input") from exc
    fields = obj.to_dict() if hasattr(obj, "to_dict") else obj
    edge_index = _tensor_np(fields.get("edge_index")) if isinstance(fields, dict) else None
    if edge_index is None:
        raise InvalidInputError(
            f"{p} holds {type(obj).__name__}, expected a PyG Data with edge_index", "input"
        )
    x = _tensor_np(fields.get("x"))
    n_attr = getattr(obj, "num_nodes", None) if hasattr(obj, "to_dict") else None
    num_nodes = int(n_attr) if n_attr is not None else _num_nodes(fields.get("num_nodes"), x, p)
    source = f"pyg:{p.name}"
    if x is None:
        x, note = structure_only_features(
            edge_index, num_nodes, structure_features, feature_dim, seed
        )
        source += f"; no features in input, used {note}"
    y = _tensor_np(fields.get("y"))
    if y is not None and y.ndim == 2 and y.shape[1] == 1:
        y = y[:, 0]
    masks = {m: _tensor_np(fields.get(m)) for m in ("train_mask", "val_mask", "test_mask")}
    return GraphData(
        name=str(fields.get("name", p.stem)),
        num_nodes=num_nodes,
        edge_index=edge_index,
        x=x,
        y=y,
        source=source,
        **masks,
    )
