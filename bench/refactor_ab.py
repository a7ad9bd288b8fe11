"""A/B of two source trees (e.g. before and after a refactor): sampling and serving, alternated.

    python bench/refactor_ab.py --old /tmp/old --new .            # 3 rounds each, ~15 min
    python bench/refactor_ab.py --old /tmp/old --new . --quick    # 1 round, small graphs

``--old`` / ``--new`` are checkouts of gnnserve (``git worktree add /tmp/old <rev>``); each side
runs from its own ``src`` (PYTHONPATH) with this virtualenv. Per round, in alternating order:

- sampling: ``bench/sampling.py --quick --rounds 3`` of that tree (gnnserve's kernels against
  PyG's NeighborLoader, same process); the gnnserve median ms per (graph, batch size);
- serving: ``gnnserve serve`` of that tree on the fb100_cornell5 GraphSAGE fixture (fanouts
  25,10, 2 torch threads), closed-loop one-node requests (16 clients, 3,000 requests) and
  open-loop p99 at 200 requests/s for 6 s.

Writes ``results/refactor_ab.json`` (``_quick``) and a PNG: new/old per metric, median [range]
over rounds (ratios near 1 = no change; sampling and latency lower is better, throughput higher).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (  # noqa: E402
    RESULTS,
    fb100_sage,
    median_range,
    ratios,
    require_baseline,
    result_name,
    save_figure,
    write_results,
)
from gnnserve import loadgen  # noqa: E402
from gnnserve.demo import wait_ready  # noqa: E402
from gnnserve.ports import free_port  # noqa: E402


def _args() -> Any:
    import argparse

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--old", type=Path, required=True, help="checkout of the old tree")
    p.add_argument("--new", type=Path, default=Path("."), help="checkout of the new tree")
    p.add_argument("--rounds", type=int, default=None, help="rounds (default 3, quick 1)")
    p.add_argument("--quick", action="store_true", help="one round")
    return p.parse_args()


def _env(tree: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": f"{tree.resolve()}/src", "PYTHONUNBUFFERED": "1"}


def sampling_round(tree: Path) -> dict[str, float]:
    """gnnserve's median ms per (graph, batch) from that tree's sampling bench."""
    cmd = [sys.executable, "bench/sampling.py", "--quick", "--rounds", "3"]
    subprocess.run(cmd, cwd=tree, env=_env(tree), check=True, stdout=subprocess.DEVNULL)
    doc = json.loads((tree / "bench/results/sampling_quick.json").read_text())
    return {
        f"sample {graph} b{row['batch_size']}": row["gnnserve_ms"]["median"]
        for graph, rows in doc["results"].items()
        for row in rows
    }


def serving_round(tree: Path, store: Path, ckpt: Path, n: int, seed: int) -> dict[str, float]:
    """Closed-loop throughput and open-loop p99 of that tree's server."""
    port = free_port()
    cmd = [sys.executable, "-m", "gnnserve.cli", "serve", "--store", str(store), "--model"]
    cmd += [str(ckpt), "--port", str(port), "--fanouts", "25,10", "--torch-threads", "2"]
    proc = subprocess.Popen(cmd, env=_env(tree), stdout=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, proc, timeout_s=600)
        predict = f"{url}/v1/predict"
        rng = np.random.default_rng(seed)
        asyncio.run(loadgen.closed_loop(predict, [{"nodes": [i]} for i in range(300)], 8))
        payloads = [{"nodes": [int(x)]} for x in rng.integers(0, n, 3000)]
        closed = asyncio.run(loadgen.closed_loop(predict, payloads, 16)).summary()
        nodes = rng.integers(0, n, 2000)
        open_ = asyncio.run(
            loadgen.open_loop(predict, lambda i: {"nodes": [int(nodes[i])]}, 200, 6, seed=seed)
        ).summary()
    finally:
        proc.terminate()
        proc.wait(60)
    return {
        "serve closed-loop req/s": closed["throughput_rps"],
        "serve p99 ms @200/s": open_["p99_ms"],
    }


def main() -> None:
    args = _args()
    require_baseline()
    rounds = args.rounds or (1 if args.quick else 3)
    trees = {"old": args.old, "new": args.new}
    values: dict[str, dict[str, list[float]]] = {"old": {}, "new": {}}
    with tempfile.TemporaryDirectory() as tmp:
        store, ckpt, n = fb100_sage(Path(tmp), "A/B")
        for rnd in range(rounds):
            for side in list(trees) if rnd % 2 == 0 else list(trees)[::-1]:
                got = sampling_round(trees[side])
                got.update(serving_round(trees[side], store, ckpt, n, seed=rnd))
                for key, v in got.items():
                    values[side].setdefault(key, []).append(v)
                print(rnd, side, {k: round(v, 3) for k, v in got.items()}, flush=True)
    summary = {
        key: {
            "old": median_range(values["old"][key]),
            "new": median_range(values["new"][key]),
            "new_over_old": median_range(ratios(values["new"][key], values["old"][key])),
        }
        for key in values["old"]
    }
    for key, s in summary.items():
        r = s["new_over_old"]
        print(f"{key:34s} new/old {r['median']:.3f} [{r['min']:.3f}-{r['max']:.3f}]")
    name = result_name("refactor_ab", args.quick)
    trees_doc = {k: str(v.resolve()) for k, v in trees.items()}
    out = write_results(name, {"trees": trees_doc, "rounds": rounds, "metrics": summary})
    _plot(summary, RESULTS / f"{name}.png")
    print(f"wrote {out}")


def _plot(summary: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = list(summary)
    med = [summary[k]["new_over_old"]["median"] for k in keys]
    lo = [m - summary[k]["new_over_old"]["min"] for k, m in zip(keys, med, strict=True)]
    hi = [summary[k]["new_over_old"]["max"] - m for k, m in zip(keys, med, strict=True)]
    fig, ax = plt.subplots(figsize=(8, 0.4 * len(keys) + 1.5))
    ax.barh(keys, med, xerr=[lo, hi], color="tab:blue")
    ax.axvline(1.0, color="black", lw=1)
    ax.set_xlabel("new / old (median, range over rounds)")
    save_figure(fig, path)


if __name__ == "__main__":
    main()
