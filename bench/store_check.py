"""Time the structure check that opening a store runs (``gnnserve.data.integrity``).

Writes a store of ``--edges`` edges over ``--nodes`` nodes as raw arrays (even degrees, uniform
random int32 ids, ``--dim`` float32 standard-normal features; ~1.3 GB on disk at the defaults),
then opens it ``--rounds`` times with each backend and reports the median check times (graph:
``indptr`` + ``indices``; features: finiteness) and the peak RSS. The page cache is warm after
the first round. numba starts up before the timed opens.

    .venv/bin/python bench/store_check.py --out /tmp/store_check        # 10^8 edges
    .venv/bin/python bench/store_check.py --out /tmp/store_check --quick
"""

from __future__ import annotations

import argparse
import functools
import json
import resource
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from gnnserve.data import integrity, layout
from gnnserve.features.stores import InMemoryFeatures, MmapFeatures
from gnnserve.graph.csr import InMemoryCSR, MmapCSR


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


def main() -> None:
    """Write the store (unless present), time the opens, print JSON."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="store directory (reused when present)")
    p.add_argument("--nodes", type=int, default=1 << 22)
    p.add_argument("--edges", type=int, default=10**8)
    p.add_argument("--dim", type=int, default=32)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--quick", action="store_true", help="10^6 edges, 2^16 nodes")
    args = p.parse_args()
    if args.quick:
        args.nodes, args.edges = 1 << 16, 10**6
    out = Path(args.out)
    if not (out / layout.META).is_file():
        write_raw_store(out, args.nodes, args.edges, args.dim)
    meta = layout.read_meta(out)
    integrity._indptr_scan(np.zeros(1, np.int64), 0)  # numba start-up, not part of the check
    result: dict[str, object] = {"nodes": meta.num_nodes, "edges": meta.num_edges}
    for name, graph, features in (
        ("memory", InMemoryCSR, InMemoryFeatures),
        ("mmap", MmapCSR, MmapFeatures),
    ):
        for what, cls in (("graph", graph), ("features", features)):
            checked = [_timed(cls, out, meta) for _ in range(args.rounds)]
            trusted = [_timed(functools.partial(cls, check_structure=False), out, meta)]
            result[f"{name}_{what}_open_s"] = round(statistics.median(checked), 3)
            result[f"{name}_{what}_unchecked_open_s"] = round(trusted[0], 3)
    result["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
