"""Edge-list CSV import: two integer columns (source, destination) plus a features ``.npy``."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from gnnserve.data.importers import existing_file
from gnnserve.data.writer import GraphData
from gnnserve.errors import InvalidInputError


def _first_data_line(path: Path) -> tuple[int, str | None]:
    """(1-based line number, text) of the first line that is neither blank nor a # comment."""
    with open(path, encoding="utf-8", errors="replace") as fh:
        for lineno, line in enumerate(fh, start=1):
            if line.strip() and not line.lstrip().startswith("#"):
                return lineno, line
    return 0, None


def _is_int(token: str) -> bool:
    try:
        int(token.strip())
    except ValueError:
        return False
    return True


def _find_bad_line(path: Path, delimiter: str | None, start: int) -> tuple[int, str]:
    """Slow path after a parse failure: the first data line (from ``start``) that is not 2 ints."""
    with open(path, encoding="utf-8", errors="replace") as fh:
        for lineno, line in enumerate(fh, start=1):
            if lineno < start or not line.strip() or line.lstrip().startswith("#"):
                continue
            parts = line.split(delimiter)
            if len(parts) < 2 or not (_is_int(parts[0]) and _is_int(parts[1])):
                return lineno, line.rstrip("\r\n")
    return 0, ""


def read_edge_csv(path: str | Path, delimiter: str | None = ",") -> np.ndarray:
    """Parse an edge list (two integer columns src, dst) into int64 [2, E].

    Blank and ``#`` lines are skipped, a non-numeric first line is taken as a header, extra
    columns are ignored; ``delimiter=None`` splits on any whitespace (SNAP files).
    """
    p = existing_file(path, "edges")
    first_line, text = _first_data_line(p)
    if text is None:
        raise InvalidInputError(f"{p} holds no edges", "edges")
    parts = text.split(delimiter)
    has_header = len(parts) >= 2 and not (_is_int(parts[0]) or _is_int(parts[1]))
    start = first_line + 1 if has_header else first_line
    try:
        arr = np.loadtxt(
            p,
            dtype=np.int64,
            delimiter=delimiter,
            comments="#",
            skiprows=start - 1,
            usecols=(0, 1),
            ndmin=2,
        )
    except ValueError as exc:
        lineno, bad = _find_bad_line(p, delimiter, start)
        where = f"line {lineno}: {bad!r}" if lineno else str(exc)
        raise InvalidInputError(f"{p}: {where} is not two integer node ids", "edges") from exc
    return np.ascontiguousarray(arr.T)


def load_edge_list(
    csv_path: str | Path,
    features_npy: str | Path,
    labels_npy: str | Path | None = None,
    delimiter: str | None = ",",
    name: str | None = None,
    split_seed: int = 0,
) -> GraphData:
    """Edge-list CSV plus a features ``.npy`` [N, F] (N = its rows) and optional labels [N].

    With labels, labelled nodes get a random 60/20/20 train/val/test split (``split_seed``).
    """
    from gnnserve.data.generators import random_split

    edge_index = read_edge_csv(csv_path, delimiter)
    x = _load_npy(features_npy, "x")
    y = _load_npy(labels_npy, "y") if labels_npy is not None else None
    if x.ndim != 2:
        raise InvalidInputError(f"features must be 2-D [N, F], got shape {list(x.shape)}", "x")
    num_nodes = int(x.shape[0])
    source = f"csv:{Path(csv_path).name} + {Path(features_npy).name}"
    masks: dict[str, np.ndarray | None] = {}
    if y is not None and y.shape == (num_nodes,) and np.issubdtype(y.dtype, np.integer):
        names = ("train_mask", "val_mask", "test_mask")
        masks = dict(zip(names, random_split(y, split_seed), strict=True))
        source += f" + {Path(labels_npy or '').name}; random 60/20/20 split seed={split_seed}"
    return GraphData(
        name=name or Path(csv_path).stem,
        num_nodes=num_nodes,
        edge_index=edge_index,
        x=x,
        y=y,
        source=source,
        **masks,
    )


def _load_npy(path: str | Path, field: str) -> np.ndarray:
    p = existing_file(path, field)
    try:
        return np.load(p, allow_pickle=False)
    except (OSError, ValueError, EOFError) as exc:
        raise InvalidInputError(f"cannot read {p} as .npy: {exc}", field) from exc
