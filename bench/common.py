"""Shared benchmark plumbing: timing, JSON results, target lines, environment facts."""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

RESULTS = Path(__file__).resolve().parent / "results"
DATASETS = Path(__file__).resolve().parents[1].parent / "shared" / "datasets"


def environment() -> dict[str, Any]:
    """Machine and library facts recorded beside every result."""
    import torch

    return {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
    }


def time_calls(fn: Callable[[int], object], n: int, warmup: int = 3) -> np.ndarray:
    """Wall time of ``fn(i)`` for i in range(n), milliseconds, after ``warmup`` untimed calls."""
    for i in range(warmup):
        fn(i)
    out = np.empty(n)
    for i in range(n):
        start = time.perf_counter()
        fn(i)
        out[i] = (time.perf_counter() - start) * 1e3
    return out


class Targets:
    """Collects `target <name>: measured <value> goal <value> met|short` lines."""

    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []

    def check(self, name: str, measured: float, goal: float, higher_is_better: bool = True) -> None:
        """Record one target."""
        met = measured >= goal if higher_is_better else measured <= goal
        self.rows.append(
            {"name": name, "measured": round(float(measured), 3), "goal": goal, "met": bool(met)}
        )

    def print(self) -> None:
        """One line per target, last thing a benchmark prints."""
        for r in self.rows:
            status = "met" if r["met"] else "short"
            print(f"target {r['name']}: measured {r['measured']} goal {r['goal']} {status}")


def write_results(name: str, payload: dict[str, Any]) -> Path:
    """Write ``bench/results/<name>.json`` (with the environment) and return its path."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(
        json.dumps(
            {"benchmark": name, "environment": environment(), **payload}, indent=2, default=float
        )
    )
    return path


def require_baseline() -> None:
    """Exit with a clear message when PyG's NeighborLoader cannot run (torch-sparse missing)."""
    try:
        import torch_sparse  # noqa: F401
    except ImportError:
        sys.exit(
            "baseline needs torch-sparse: pip install ../shared/wheels/*.whl (make bench does)"
        )


def parse_args(doc: str | None, quick_help: str) -> argparse.Namespace:
    """The flags every benchmark takes (``--quick``), then a check that the PyG baseline runs."""
    parser = argparse.ArgumentParser(description=(doc or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help=quick_help)
    args = parser.parse_args()
    require_baseline()
    return args


def save_figure(fig: Any, path: Path) -> None:
    """Lay out and write a matplotlib figure as PNG."""
    fig.tight_layout()
    fig.savefig(path, dpi=120)
