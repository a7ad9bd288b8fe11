"""GIL-held time of the write path: one 100-operation JSON batch, body bytes to acknowledged.

A writer thread that holds the GIL stalls every reader beside it in the same process, however
many cores there are; the time it spends in kernels that release the GIL does not. This
benchmark measures the GIL-held time per batch with py-spy's ``--gil`` sampler (it records a
sample only from the thread holding the GIL): a child process applies update batches (half
inserts of random edges, half deletes of existing ones, as ``bench/dynamic.py``) to a dynamic
store with 2-hop [25, 10] pre-sampling attached, each from its JSON body bytes
(``json.loads`` and ``DynamicStore.apply``, what ``POST /v1/graph/updates`` runs past the HTTP
framing); py-spy samples it at ``--rate`` Hz twice, once with ``--gil`` and once without (all
on-CPU time, GIL or not). Samples are counted only inside the timed loop.

    python bench/gil_writes.py            # soc_epinions1, 3,000 batches per arm (~2 min)
    python bench/gil_writes.py --quick    # 300 batches

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

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import Targets, environment, write_results  # noqa: E402
from dynamic import make_store, open_dynamic, update_stream  # noqa: E402

DATASET = "soc_epinions1"
MEASURED = "timed_batches"  # the function whose samples count
RATE = 1000  # samples per second (py-spy falls behind at 2,000 on 2 cores)


def timed_batches(dyn, bodies: list[bytes]) -> float:  # type: ignore[no-untyped-def]
    """Apply each body as the update endpoint does; wall seconds."""
    start = time.perf_counter()
    for body in bodies:
        dyn.apply(json.loads(body)["ops"])
    return time.perf_counter() - start


def child(workdir: Path, batches: int) -> None:
    """The measured process: a fresh store, warm-up batches, then the timed ones."""
    store = make_store(DATASET, workdir)
    bodies = [json.dumps({"ops": b}).encode() for b in update_stream(store, 100 * batches, 1)]
    dyn, _ = open_dynamic(store, workdir / "log", presample=True)
    warm, timed = bodies[:50], bodies[50:]
    timed_batches(dyn, warm)
    wall = timed_batches(dyn, timed)
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


def arm(spy: str, workdir: Path, batches: int, gil: bool) -> dict[str, float]:
    """One child under py-spy; GIL-held (or on-CPU) ms per batch and wall ms per batch."""
    workdir = workdir / ("gil" if gil else "on_cpu")
    workdir.mkdir()
    raw = workdir / "spy.txt"
    cmd = [spy, "record", "--rate", str(RATE), "--format", "raw", "--output", str(raw)]
    cmd += ["--nonblocking"]  # pausing a process of many threads 1,000 times a second slows it 10x
    cmd += ["--gil"] if gil else []
    cmd += ["--", sys.executable, __file__, "--child", str(workdir), str(batches)]
    one_thread = {k: "1" for k in ("OMP_NUM_THREADS", "NUMBA_NUM_THREADS", "MKL_NUM_THREADS")}
    done = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **one_thread})
    if done.returncode != 0 or not raw.exists():
        raise SystemExit(f"py-spy failed ({done.returncode}): {done.stderr[-2000:]}")
    result = json.loads((workdir / "child.json").read_text())
    n = result["batches"]
    return {
        "batches": n,
        "wall_ms_per_batch": 1e3 * result["wall_s"] / n,
        ("gil_ms_per_batch" if gil else "on_cpu_ms_per_batch"): 1e3
        * sampled_seconds(raw, RATE)
        / n,
    }


def main() -> None:
    """Both arms, the targets, the results file."""
    quick = "--quick" in sys.argv
    batches = 300 if quick else 3000
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    with tempfile.TemporaryDirectory() as tmp:
        gil = arm(spy, Path(tmp), batches, gil=True)
        cpu = arm(spy, Path(tmp), batches, gil=False)
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
        cwd=Path(__file__).parent,
    ).stdout.strip()
    record = {
        "environment": environment(),
        "commit": commit,  # the code measured (a worktree of an older commit measures "before")
        "dataset": DATASET,
        "batch_ops": 100,
        "sample_rate_hz": RATE,
        "gil": gil,
        "on_cpu": cpu,
        "gil_share_of_on_cpu": gil["gil_ms_per_batch"] / cpu["on_cpu_ms_per_batch"],
    }
    print(json.dumps(record, indent=1))
    targets = Targets()
    # 1/5 of the GIL-held time measured before the array path (see docs/benchmarks.md)
    before = float(os.environ.get("GIL_MS_BEFORE", "nan"))
    if np.isfinite(before):
        targets.check("GIL-held ms per 100-op batch", gil["gil_ms_per_batch"], before / 5, False)
    label = os.environ.get("GIL_LABEL", "")
    write_results(f"gil_writes{label}{'_quick' if quick else ''}", record)
    targets.print()


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        child(Path(sys.argv[2]), int(sys.argv[3]))
    else:
        main()
