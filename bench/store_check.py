"""Time the structure check that opening a store runs (``gnnserve.data.integrity``).

Writes a store of ``--edges`` edges over ``--nodes`` nodes as raw arrays (even degrees, uniform
random int32 ids, ``--dim`` float32 standard-normal features; ~1.3 GB on disk at the defaults),
then opens it ``--rounds`` times with each backend, checked and unchecked (the baseline,
``check_structure=False``) interleaved, and reports the medians with their ranges (graph:
``indptr`` + ``indices``; features: finiteness) and the peak RSS. The page cache is warm after
the first open. numba starts up before the timed opens.

    python bench/store_check.py                               # 10^8 edges (temp dir)
    python bench/store_check.py --out /tmp/store_check --quick
"""

from __future__ import annotations

import argparse
import functools
import resource
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

import gnnserve  # noqa: F401  (first: sets the OpenMP wait policy)

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (  # noqa: E402
    Targets,
    fmt_range,
    interleaved_rounds,
    median_range,
    result_name,
    save_figure,
    write_results,
)
from gnnserve.data import integrity, layout  # noqa: E402
from gnnserve.features.stores import InMemoryFeatures, MmapFeatures  # noqa: E402
from gnnserve.graph.csr import InMemoryCSR, MmapCSR  # noqa: E402

BACKENDS = {"memory": (InMemoryCSR, InMemoryFeatures), "mmap": (MmapCSR, MmapFeatures)}
PARTS = ("graph", "features")
GOAL_SECONDS = 10.0  # "seconds for 10^8 edges" (issue 10): check time added to an open


def write_raw_store(out: Path, n: int, e: int, dim: int, seed: int = 0) -> layout.StoreMeta:
    """A valid store of ``e`` edges written chunk by chunk (bounded memory), no checksum."""
    out.mkdir(parents=True, exist_ok=True)
    (np.arange(n + 1, dtype=np.int64) * e // n).astype("<i8").tofile(out / layout.INDPTR)
    rng = np.random.default_rng(seed)
    chunk = 10**7
    with open(out / layout.INDICES, "wb") as fh:
        for lo in range(0, e, chunk):
            rng.integers(0, n, min(chunk, e - lo), dtype=np.int32).astype("<i4").tofile(fh)
    rows = max(1, chunk // dim)
    with open(out / layout.FEATURES, "wb") as fh:
        for lo in range(0, n, rows):
            rng.standard_normal((min(rows, n - lo), dim), dtype=np.float32).tofile(fh)
    meta = layout.StoreMeta("store_check", n, e, dim, "float32", "int32", 0, source="raw uniform")
    (out / layout.META).write_text(meta.to_json())
    return meta


def _timed(open_store: Callable[..., object], out: Path, meta: layout.StoreMeta) -> float:
    start = time.perf_counter()
    open_store(out, meta)
    return time.perf_counter() - start


def plot(result: dict[str, Any], path: Path) -> None:
    """Open time with and without the check, per backend and part of the store."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    labels = [f"{b} {w}" for b in BACKENDS for w in PARTS]
    for k, kind in enumerate(("checked", "unchecked")):
        med = [result["open_s"][f"{label}"][kind]["median"] for label in labels]
        ax.bar([i + 0.4 * k for i in range(len(labels))], med, 0.4, label=f"open, {kind}")
    ax.set_xticks([i + 0.2 for i in range(len(labels))], labels)
    edges = result["edges"]
    ax.set(ylabel="seconds (median)", title=f"store open with structure check, {edges:.0e} edges")
    ax.legend()
    save_figure(fig, path)


def main() -> None:
    """Write the store (unless present), time the opens interleaved, write JSON + PNG."""
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--out", default=None, help="store directory (reused; default: temp dir)")
    p.add_argument("--nodes", type=int, default=1 << 22)
    p.add_argument("--edges", type=int, default=10**8)
    p.add_argument("--dim", type=int, default=32)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--quick", action="store_true", help="10^6 edges, 2^16 nodes")
    args = p.parse_args()
    if args.quick:
        args.nodes, args.edges = 1 << 16, 10**6
    with tempfile.TemporaryDirectory(prefix="store-check-") as tmp:
        out = Path(args.out or tmp)
        if not (out / layout.META).is_file():
            write_raw_store(out, args.nodes, args.edges, args.dim)
        meta = layout.read_meta(out)
        integrity._indptr_scan(np.zeros(1, np.int64), 0)  # numba start-up, not part of the check
        arms = {}
        for backend, (graph, features) in BACKENDS.items():
            for part, cls in zip(PARTS, (graph, features), strict=True):
                label = f"{backend} {part}"
                arms[f"{label}|checked"] = functools.partial(_timed, cls, out, meta)
                unchecked = functools.partial(cls, check_structure=False)
                arms[f"{label}|unchecked"] = functools.partial(_timed, unchecked, out, meta)
        times = interleaved_rounds(arms, args.rounds)
    opened: dict[str, dict[str, Any]] = {}
    for key, values in times.items():
        label, kind = key.split("|")
        opened.setdefault(label, {})[kind] = median_range(values)
    result: dict[str, Any] = {
        "nodes": meta.num_nodes,
        "edges": meta.num_edges,
        "feature_dim": meta.feature_dim,
        "quick": args.quick,
        "rounds": args.rounds,
        "open_s": opened,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024,
    }
    path = write_results(result_name("store_check", args.quick), result)
    plot(result, path.with_suffix(".png"))
    for label, kinds in opened.items():
        print(
            f"{label:16s} open checked {fmt_range(kinds['checked'], '.3f')} s, "
            f"unchecked {fmt_range(kinds['unchecked'], '.3f')} s"
        )
    print(f"wrote {path} and {path.with_suffix('.png')}")
    targets = Targets()
    for backend in BACKENDS:
        check = sum(
            opened[f"{backend} {part}"]["checked"]["median"]
            - opened[f"{backend} {part}"]["unchecked"]["median"]
            for part in PARTS
        )
        targets.check(f"store_check_{backend}_seconds_added", check, GOAL_SECONDS, False)
    targets.print()


if __name__ == "__main__":
    main()
