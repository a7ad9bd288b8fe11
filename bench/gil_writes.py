"""GIL-held time of the write path: one 100-operation JSON batch, body bytes to acknowledged.

A writer thread that holds the GIL stalls every reader beside it in the same process, however
many cores there are; the time it spends in kernels that release the GIL does not. This
benchmark measures the GIL-held time per batch with py-spy's ``--gil`` sampler (it records a
sample only from the thread holding the GIL): a child process applies update batches (half
inserts of random edges, half deletes of existing ones, as ``bench/dynamic.py``) to a dynamic
store with 2-hop [25, 10] pre-sampling attached, each from its JSON body bytes as
``POST /v1/graph/updates`` handles them past the HTTP framing (``endpoint_work``: in this tree
the edge-only scan and ``apply_columns``; in one from before it, pydantic's JSON validation and
``DynamicStore.apply``); py-spy samples it at ``--rate`` Hz twice, once with ``--gil`` and
once without (all on-CPU time, GIL or not). Samples are counted only inside the timed loop (not
in the warm-up, which compiles the kernels).

    python bench/gil_writes.py --before OLD/src   # this tree and an older checkout's src,
                                                  # 3 interleaved rounds of 3,000 batches (~8 min)
    python bench/gil_writes.py --quick            # this tree, one round of 300 batches

(``git worktree add /tmp/before <commit>`` makes the older checkout; the child imports
gnnserve from the ``src`` it is given, this benchmark's own code from this tree.)

Needs py-spy (``pip install py-spy``) and ptrace rights over a child (root, or
``kernel.yama.ptrace_scope`` 0).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import Targets, environment, median_range, write_results  # noqa: E402
from dynamic import make_store, open_dynamic, update_stream  # noqa: E402

DATASET = "soc_epinions1"
MEASURED = "timed_batches"  # the function whose samples count
RATE = 1000  # samples per second (py-spy falls behind at 2,000 on 2 cores)


def endpoint_work(dyn):  # type: ignore[no-untyped-def]
    """What ``POST /v1/graph/updates`` runs between the body bytes and the answer, in the
    gnnserve being measured: an edge-only body read into columns where that code has it
    (``dynamic.json_scan``), else the body validated by pydantic and applied op by op."""
    from gnnserve.server.schemas import UpdatesRequest

    try:
        from gnnserve.dynamic.json_scan import scan_edges
    except ImportError:  # a checkout from before the scan
        scan_edges = None
    dim = dyn.features.dim

    def apply(body: bytes) -> object:
        batch = None if scan_edges is None else scan_edges(body, dim)
        if batch is not None:
            return dyn.apply_columns(batch)
        return dyn.apply(UpdatesRequest.model_validate_json(body).ops)

    return apply


def timed_batches(apply, bodies: list[bytes]) -> float:  # type: ignore[no-untyped-def]
    """Apply each body as the update endpoint does; wall seconds."""
    start = time.perf_counter()
    for body in bodies:
        apply(body)
    return time.perf_counter() - start


def child(workdir: Path, batches: int) -> None:
    """The measured process: a fresh store, warm-up batches, then the timed ones."""
    store = make_store(DATASET, workdir)
    bodies = [json.dumps({"ops": b}).encode() for b in update_stream(store, 100 * batches, 1)]
    dyn, _ = open_dynamic(store, workdir / "log", presample=True)
    warm, timed = bodies[:50], bodies[50:]
    apply = endpoint_work(dyn)
    for body in warm:  # compiles the kernels (under the GIL), outside ``timed_batches``
        apply(body)
    wall = timed_batches(apply, timed)
    dyn.close()
    (workdir / "child.json").write_text(json.dumps({"batches": len(timed), "wall_s": wall}))


def sampled_seconds(raw: Path, rate: int) -> float:
    """Seconds of samples whose stack passes through :data:`MEASURED` (py-spy's raw format:
    one ``frame;frame;... count`` line per distinct stack)."""
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if f"{MEASURED} (" in stack:
            total += int(count)
    return total / rate


def arm(spy: str, workdir: Path, batches: int, gil: bool, src: Path) -> dict[str, float]:
    """One child under py-spy running the gnnserve in ``src``; GIL-held (or on-CPU) ms per
    batch and wall ms per batch."""
    workdir = Path(tempfile.mkdtemp(dir=workdir))
    raw = workdir / "spy.txt"
    cmd = [spy, "record", "--rate", str(RATE), "--format", "raw", "--output", str(raw)]
    cmd += ["--nonblocking"]  # pausing a process of many threads 1,000 times a second slows it 10x
    cmd += ["--gil"] if gil else []
    cmd += ["--", sys.executable, __file__, "--child", str(workdir), str(batches)]
    env = {k: "1" for k in ("OMP_NUM_THREADS", "NUMBA_NUM_THREADS", "MKL_NUM_THREADS")}
    env["PYTHONPATH"] = str(src)
    done = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **env})
    if done.returncode != 0 or not raw.exists():
        raise SystemExit(f"py-spy failed ({done.returncode}): {done.stderr[-2000:]}")
    result = json.loads((workdir / "child.json").read_text())
    n = result["batches"]
    key = "gil_ms_per_batch" if gil else "on_cpu_ms_per_batch"
    return {
        "batches": n,
        "wall_ms_per_batch": 1e3 * result["wall_s"] / n,
        key: 1e3 * sampled_seconds(raw, RATE) / n,
    }


def commit_of(src: Path) -> str:
    """The short commit of the checkout holding ``src``."""
    done = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=src
    )
    return done.stdout.strip()


def main() -> None:
    """Interleaved rounds of each tree (this one, and ``--before SRC`` if given), both kinds
    of sample each; the targets; the results file."""
    quick = "--quick" in sys.argv
    batches, rounds = (300, 1) if quick else (3000, 3)
    trees = {"current": Path(__file__).resolve().parents[1] / "src"}
    if "--before" in sys.argv:
        trees = {"before": Path(sys.argv[sys.argv.index("--before") + 1]).resolve(), **trees}
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    runs: dict[str, list[dict]] = {name: [] for name in trees}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(rounds):
            for name, src in trees.items():
                gil = arm(spy, Path(tmp), batches, True, src)
                cpu = arm(spy, Path(tmp), batches, False, src)
                runs[name].append({"round": r, "gil": gil, "on_cpu": cpu})
                print(
                    f"round {r} {name}: GIL {gil['gil_ms_per_batch']:.3f} ms, on-CPU "
                    f"{cpu['on_cpu_ms_per_batch']:.3f} ms, wall {gil['wall_ms_per_batch']:.3f} "
                    "ms per batch",
                    flush=True,
                )
    summary = {
        name: {
            "commit": commit_of(trees[name]),
            "gil_ms_per_batch": median_range([r["gil"]["gil_ms_per_batch"] for r in rs]),
            "on_cpu_ms_per_batch": median_range([r["on_cpu"]["on_cpu_ms_per_batch"] for r in rs]),
            "wall_ms_per_batch": median_range([r["gil"]["wall_ms_per_batch"] for r in rs]),
        }
        for name, rs in runs.items()
    }
    record = {
        "environment": environment(),
        "dataset": DATASET,
        "batch_ops": 100,
        "sample_rate_hz": RATE,
        "rounds": rounds,
        "summary": summary,
        "runs": runs,
    }
    print(json.dumps(summary, indent=1))
    targets = Targets()
    if "before" in summary:
        now, then = (summary[k]["gil_ms_per_batch"]["median"] for k in ("current", "before"))
        targets.check("GIL-held ms per 100-op batch, current over before", now / then, 0.2, False)
    write_results("gil_writes_quick" if quick else "gil_writes", record)
    targets.print()


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        child(Path(sys.argv[2]), int(sys.argv[3]))
    else:
        main()
