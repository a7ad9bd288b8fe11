"""Shared benchmark plumbing: timing, JSON results, target lines, environment facts."""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

RESULTS = Path(__file__).resolve().parent / "results"
# GNNSERVE_DATASETS: where a lent GPU machine finds the carried copies (bench/gpu_device.sh)
DATASETS = Path(
    os.environ.get("GNNSERVE_DATASETS")
    or Path(__file__).resolve().parents[1].parent / "shared" / "datasets"
)


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


def strict(value: Any) -> Any:
    """``value`` with every NaN or infinite float replaced by None (JSON has no such tokens),
    numpy scalars as Python numbers, tuples as lists; recursively."""
    if isinstance(value, dict):
        return {str(k): strict(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [strict(v) for v in value]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not np.isfinite(value):
        return None
    return value


def write_results(name: str, payload: dict[str, Any]) -> Path:
    """Write ``bench/results/<name>.json`` (with the environment) and return its path.

    Strict JSON: a NaN or infinite figure (nothing measured, e.g. no 429 to take a p99 of) is
    written as null."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    doc = strict({"benchmark": name, "environment": environment(), **payload})
    path.write_text(json.dumps(doc, indent=2, allow_nan=False, default=float))
    return path


PYG_BACKENDS = ("pyg-lib", "torch-sparse")  # the headline baseline first, then the fallback


def require_baseline() -> None:
    """Exit with a clear message unless PyG's NeighborLoader can run on pyg-lib (the path PyG
    users get) and on torch-sparse (its deprecated fallback, reported beside it)."""
    missing = []
    for module in ("pyg_lib", "torch_sparse"):
        try:
            __import__(module)
        except ImportError:
            missing.append(module)
    if missing:
        sys.exit(
            f"the PyG baseline needs {' and '.join(missing)}: pip install ../shared/wheels/*.whl "
            "(make bench does)"
        )


@contextmanager
def pyg_backend(name: str) -> Iterator[None]:
    """Run PyG's neighbour sampling on ``name`` (``PYG_BACKENDS``) inside the block.

    PyG picks the sampler per call from ``torch_geometric.typing.WITH_PYG_LIB``: pyg-lib when it
    is installed, else torch-sparse's deprecated one. The flag is switched off for the fallback
    and restored after the block.
    """
    import torch_geometric.typing as pyg_typing

    if name not in PYG_BACKENDS:
        raise ValueError(f"unknown PyG backend {name!r}; choose one of {PYG_BACKENDS}")
    saved = pyg_typing.WITH_PYG_LIB
    pyg_typing.WITH_PYG_LIB = name == "pyg-lib"
    try:
        yield
    finally:
        pyg_typing.WITH_PYG_LIB = saved


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


def result_name(name: str, quick: bool) -> str:
    """``<name>`` for a full run, ``<name>_quick`` for a smoke run (keeps full results intact)."""
    return f"{name}_quick" if quick else name


def set_threads(threads: int) -> dict[str, int]:
    """Give torch (intra-op) and numba the same thread count in this process; return both."""
    import numba
    import torch

    threads = max(1, min(int(threads), int(numba.config.NUMBA_NUM_THREADS)))  # type: ignore[attr-defined]
    numba.set_num_threads(threads)
    for _ in range(
        3
    ):  # seen: the first call after numba's pool started left torch at its old count
        torch.set_num_threads(threads)
        if torch.get_num_threads() == threads:
            break
    used = {"torch_threads": torch.get_num_threads(), "numba_threads": numba.get_num_threads()}
    if set(used.values()) != {threads}:
        raise RuntimeError(f"asked for {threads} threads, got {used}")
    return used


def interleaved_rounds(
    arms: Mapping[str, Callable[[], float]],
    rounds: int,
    on_round: Callable[[int, dict[str, float]], None] | None = None,
    keep_going: Callable[[int], bool] | None = None,
) -> dict[str, list[float]]:
    """Run every arm once per round and return each arm's measurements in round order.

    Arms run in the given order in even rounds and in reverse order in odd rounds (A B B A), so
    a slow drift of the machine, or a cost paid by whichever arm runs first, falls on both sides
    alike; list the arms to compare next to each other. ``on_round(r, values)`` is called after
    each round (for printing). ``keep_going(done)`` is asked before every round after the first
    with the number of rounds done; False stops early (e.g. a wall-clock budget), so the lists
    may be shorter than ``rounds``. Summarise with ``median_range`` / ``ratios``.
    """
    names = list(arms)
    out: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        if r and keep_going is not None and not keep_going(r):
            break
        values = {}
        for name in names if r % 2 == 0 else names[::-1]:
            values[name] = float(arms[name]())
            out[name].append(values[name])
        if on_round is not None:
            on_round(r, {name: values[name] for name in names})
    return out


def median_range(values: Sequence[float]) -> dict[str, Any]:
    """Median, min and max of per-round values, plus the values: the form results publish."""
    v = np.asarray(values, dtype=float)
    return {
        "median": float(np.median(v)),
        "min": float(v.min()),
        "max": float(v.max()),
        "rounds": [float(x) for x in v],
    }


def ratios(numerator: Sequence[float], denominator: Sequence[float]) -> list[float]:
    """Per-round ratios ``numerator[r] / denominator[r]`` (e.g. PyG time / gnnserve time).

    A zero denominator gives ``inf`` (a baseline with no passing rate), or ``nan`` when the
    numerator is zero too (nothing measured: no target can be met on it).
    """
    if len(numerator) != len(denominator):
        raise ValueError(f"{len(numerator)} numerators for {len(denominator)} denominators")
    return [_ratio(float(a), float(b)) for a, b in zip(numerator, denominator, strict=True)]


def _ratio(a: float, b: float) -> float:
    if b:
        return a / b
    return float("inf") if a else float("nan")


def fmt_range(s: Mapping[str, Any], spec: str = ".2f", unit: str = "") -> str:
    """``median [min-max]`` of a ``median_range`` dict, for printed lines."""
    return f"{s['median']:{spec}}{unit} [{s['min']:{spec}}-{s['max']:{spec}}]"


@dataclass
class Capacity:
    """Outcome of ``find_capacity``: highest passing rate, lowest failing rate above it."""

    rate: float  # highest offered rate that passed (0.0 when none did)
    first_fail: float | None  # lowest failing rate above ``rate`` (None: passed up to max_rate)
    probes: list[tuple[float, bool]] = field(default_factory=list)  # (rate, passed), run order


def find_capacity(
    passes: Callable[[float], bool],
    start: float,
    factor: float = 2.0,
    tolerance: float = 0.1,
    min_rate: float = 1.0,
    max_rate: float = float("inf"),
) -> Capacity:
    """Highest rate at which ``passes(rate)`` holds, known within ``tolerance`` (0.1 = 10%).

    A coarse ladder from ``start`` (times ``factor`` while passing, divided by it while failing)
    brackets the capacity between a passing and a failing rate; geometric bisection then narrows
    the bracket until ``first_fail / rate <= 1 + tolerance``. Stops at ``max_rate`` (a pass there
    gives ``first_fail=None``) and below ``min_rate`` (nothing passed: ``rate=0``). Rates are
    requests per second for a load test, but any positive scale works.
    """
    if start <= 0 or factor <= 1 or tolerance <= 0:
        raise ValueError("need start > 0, factor > 1, tolerance > 0")
    cap = Capacity(0.0, None)

    def probe(rate: float) -> bool:
        ok = bool(passes(rate))
        cap.probes.append((rate, ok))
        return ok

    lo, hi = 0.0, min(start, max_rate)  # invariant: lo passed (or is 0), hi is next to probe
    while probe(hi):  # ladder up
        lo = hi
        if lo >= max_rate:
            cap.rate = lo
            return cap
        hi = min(lo * factor, max_rate)
    while not lo:  # ladder down: hi failed
        if hi / factor < min_rate:
            cap.first_fail = hi
            return cap
        if probe(hi / factor):
            lo = hi / factor
        else:
            hi = hi / factor
    while hi / lo > 1 + tolerance:  # bisect: lo passed, hi failed
        mid = float(np.sqrt(lo * hi))
        if probe(mid):
            lo = mid
        else:
            hi = mid
    cap.rate, cap.first_fail = lo, hi
    return cap


def fb100_sage(workdir: Path, note: str) -> tuple[Path, Path, int]:
    """fb100_cornell5 as a store with 128-dim random features (seeded) and a random-init
    GraphSAGE 2x256 checkpoint (throughput does not depend on the weights' values); returns
    (store, checkpoint, number of nodes). The HTTP benchmarks serve this pair."""
    import torch

    from gnnserve.data.writer import GraphData, write_store
    from gnnserve.models.checkpoint import save_checkpoint
    from gnnserve.models.zoo import GNN, ModelConfig

    with np.load(DATASETS / "fb100_cornell5.npz") as z:
        edge_index, n = z["edge_index"], int(z["num_nodes"])
    x = np.random.default_rng(0).standard_normal((n, 128), dtype=np.float32)
    store = workdir / "store"
    write_store(GraphData("fb100_cornell5", n, edge_index, x), store)
    torch.manual_seed(0)
    config = ModelConfig(arch="sage", in_dim=128, hidden_dim=256, out_dim=2, num_layers=2)
    ckpt = workdir / "sage"
    save_checkpoint(ckpt, GNN(config), config, {"note": note})
    return store, ckpt, n
