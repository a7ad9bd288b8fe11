"""Start-up per deploy mode: launch to ready, and the first request after ready against steady.

One 20K-node SBM store, a 2-layer GraphSAGE checkpoint and its precomputed embeddings; per
mode, ``gnnserve serve`` is started, timed from launch to ``/v2/health/ready``, sent one
existing-node request (one node, default fanouts 25,10), then ``STEADY`` more; modes that
serve new nodes also get a first and then steady new-node requests (SRPE, one node, two
edges). Every mode is first started once with an empty numba cache of its own (a first start
on a fresh machine: every kernel compiled; recorded as ``first_start``), which fills that
cache: the rounds are later starts, as the targets ask. Modes run in interleaved rounds (order
reversed every other round). Latencies are client round trips in ms.

Modes: ``local``; ``local --update-log --presample`` (an empty log); ``dgs`` (2 + 2 Ray
workers); ``cgp`` (2 workers); ``fog`` (2 nodes, one at 0.3 cores; cgroups and shaped links
need root, else unthrottled with a warning). faas is left out: its instances start cold on a
request by design (bench/faas_coldstart.py measures that path).

Targets (issue 25, this machine): ready <= 5 s local, <= 20 s dgs and cgp, <= 30 s fog; first
request <= 3x the steady p50 in every mode.

    python bench/startup.py            # 3 rounds (~15 min on 2 cores)
    python bench/startup.py --quick    # 1 round, 5,000 nodes (results/startup_quick.json)
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

import gnnserve  # noqa: F401  (first: sets the OpenMP wait policy)

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (  # noqa: E402
    Targets,
    fmt_range,
    interleaved_rounds,
    median_range,
    result_name,
    write_results,
)
from gnnserve.cli import main as gnnserve_cli  # noqa: E402
from gnnserve.demo import start_server, stop_server, wait_ready  # noqa: E402
from gnnserve.ports import free_port  # noqa: E402

STEADY = 30  # requests after the first, per kind
FOG_STEADY = 5  # a fog request is a whole round
NEW_NODE = {"features": None, "edges": [[0, 3], [0, 11]]}  # features filled per store
FOG_NODES = "nodes:\n  - {name: weak, cores: 0.3, link: wifi}\n  - {name: strong, link: 5g}\n"
READY_GOAL_S = {"local": 5.0, "local_updates": 5.0, "dgs": 20.0, "cgp": 20.0, "fog": 30.0}
GOAL_FIRST_OVER_STEADY = 3.0


def prepare(workdir: Path, nodes: int) -> tuple[Path, Path]:
    """An SBM store, a 2-epoch GraphSAGE checkpoint and its PEs under ``workdir``."""
    store, ckpt = workdir / "store", workdir / "sage"
    assert gnnserve_cli(["prepare", "sbm", "--nodes", str(nodes), "--out", str(store)]) == 0
    argv = ["train", "--store", str(store), "--arch", "sage", "--layers", "2", "--epochs", "2"]
    assert gnnserve_cli([*argv, "--no-progress", "--out", str(ckpt)]) == 0
    assert gnnserve_cli(["precompute", "--store", str(store), "--model", str(ckpt)]) == 0
    return store, ckpt


def mode_flags(workdir: Path) -> dict[str, list[str]]:
    """``serve`` flags of each mode measured."""
    nodes = workdir / "nodes.yaml"
    nodes.write_text(FOG_NODES)
    log = workdir / "updates.log"
    return {
        "local": [],
        "local_updates": ["--update-log", str(log), "--presample", "--fsync", "never"],
        "dgs": ["--deploy", "dgs", "--deploy-workers", "2"],
        "cgp": ["--deploy", "cgp", "--deploy-workers", "2"],
        "fog": ["--deploy", "fog", "--nodes", str(nodes), "--fanouts=-1,-1"],
    }


def _timed(client: httpx.Client, url: str, body: dict[str, Any], count: int) -> list[float]:
    out = []
    for i in range(count):
        if "nodes" in body:
            body = {**body, "nodes": [(7919 * i) % 1000]}
        t = time.perf_counter()
        r = client.post(url, json=body)
        out.append((time.perf_counter() - t) * 1e3)
        r.raise_for_status()
    return out


def one_server(store: Path, ckpt: Path, mode: str, flags: list[str], dim: int) -> dict[str, float]:
    """Start ``mode``; time ready, the first and the steady requests of each kind it serves."""
    port = free_port()
    log = store.parent / f"{mode}.log"
    with log.open("wb") as out:
        proc = start_server(store, ckpt, port, *flags, stdout=out, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    row: dict[str, float] = {}
    try:
        start = time.perf_counter()
        try:
            wait_ready(base, proc, timeout_s=600)
        except RuntimeError:
            print(log.read_text()[-3000:], file=sys.stderr)
            raise
        row["ready_s"] = time.perf_counter() - start
        steady = FOG_STEADY if mode == "fog" else STEADY
        kinds = {"nodes": {"nodes": [0]}}
        if mode != "fog":
            kinds["new_node"] = {"new_nodes": {**NEW_NODE, "features": [[0.5] * dim]}}
        with httpx.Client(timeout=600) as client:
            for kind, body in kinds.items():
                times = _timed(client, f"{base}/v1/predict", body, steady + 1)
                p50 = statistics.median(times[1:])
                row[f"{kind}_first_ms"], row[f"{kind}_steady_p50_ms"] = times[0], p50
                row[f"{kind}_first_over_steady"] = times[0] / p50
    finally:
        stop_server(proc, timeout_s=120)
    return row


def _numba_cache(workdir: Path, mode: str) -> None:
    """The servers started next use ``mode``'s own numba cache under ``workdir``."""
    os.environ["NUMBA_CACHE_DIR"] = str(workdir / f"numba-cache-{mode}")


def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--quick", action="store_true", help="1 round on a 5,000-node graph")
    p.add_argument("--modes", default=",".join(READY_GOAL_S), help="comma list of modes")
    args = p.parse_args()
    logging.getLogger("httpx").setLevel(logging.WARNING)
    rounds, nodes = (1, 5_000) if args.quick else (3, 20_000)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="gnnserve-startup-") as tmp:
        store, ckpt = prepare(Path(tmp), nodes)
        dim = int(json.loads((store / "meta.json").read_text())["feature_dim"])
        flags = {m: f for m, f in mode_flags(Path(tmp)).items() if m in args.modes.split(",")}
        runs: dict[str, list[dict[str, float]]] = {m: [] for m in flags}
        first: dict[str, dict[str, float]] = {}
        for mode in flags:  # an empty cache of its own: compiles, and fills it for the rounds
            _numba_cache(Path(tmp), mode)
            first[mode] = one_server(store, ckpt, mode, flags[mode], dim)
            print(
                f"  {mode:14s} first start, empty numba cache: ready {first[mode]['ready_s']:.1f} s"
            )

        def arm(mode: str) -> Any:
            def go() -> float:
                _numba_cache(Path(tmp), mode)
                row = one_server(store, ckpt, mode, flags[mode], dim)
                runs[mode].append(row)
                print(f"  {mode:14s} " + "  ".join(f"{k} {v:.1f}" for k, v in row.items()))
                return row["ready_s"]

            return go

        interleaved_rounds({m: arm(m) for m in flags}, rounds)
    summary = {
        m: {k: median_range([r[k] for r in rows]) for k in rows[0]} for m, rows in runs.items()
    }
    out = write_results(
        result_name("startup", args.quick),
        {
            "quick": args.quick,
            "nodes": nodes,
            "fanouts": [25, 10],
            "steady_requests": STEADY,
            "fog_steady_requests": FOG_STEADY,
            "rounds": rounds,
            "numba_cache": "each mode's own; first_start: its first start, every kernel compiled "
            "into the empty cache; the rounds: later starts that load them",
            "first_start": first,
            "runs": runs,
            "summary": summary,
            "wall_s": round(time.perf_counter() - started, 1),
        },
    )
    targets = Targets()
    for mode, s in summary.items():
        kinds = [k.removesuffix("_first_ms") for k in s if k.endswith("_first_ms")]
        shown = ", ".join(
            f"{k} first {fmt_range(s[f'{k}_first_ms'], '.1f')} ms vs steady p50 "
            f"{fmt_range(s[f'{k}_steady_p50_ms'], '.1f')} ms"
            for k in kinds
        )
        print(
            f"{mode}: ready {fmt_range(s['ready_s'], '.1f')} s (first start "
            f"{first[mode]['ready_s']:.1f} s); {shown}"
        )
        targets.check(f"{mode}_ready_s", s["ready_s"]["median"], READY_GOAL_S[mode], False)
        for k in kinds:
            ratio = s[f"{k}_first_over_steady"]["median"]
            targets.check(f"{mode}_{k}_first_over_steady", ratio, GOAL_FIRST_OVER_STEADY, False)
    print(f"wrote {out}")
    targets.print()


if __name__ == "__main__":
    main()
