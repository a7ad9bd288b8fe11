"""The warm-up compiles every kernel of the update path, so no real update waits on numba JIT."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from gnnserve.dynamic import graph as dynamic
from gnnserve.dynamic.warmup import warm_up_updates
from gnnserve.sampling import presample_kernels as pk
from gnnserve.sampling.warmup import warm_up_presample_updates


def test_warm_up_compiles_update_and_presample_kernels() -> None:
    warm_up_updates()
    warm_up_presample_updates([3, 2])
    kernels = [dynamic._apply_events, dynamic._compact, pk.build, pk.apply_events, pk.assemble]
    for kernel in kernels:
        assert kernel.signatures, f"{kernel.__name__} was not compiled by the warm-up"
    assert warm_up_updates() == 0.0  # once per process
    assert warm_up_presample_updates([3, 2]) == 0.0  # once per process and query


# In a fresh interpreter: open a served store with an update log and pre-sampling, warm-up off
# then on, and record which update-path kernels hold compiled signatures at each step.
_SERVE_AND_RECORD = r"""
import json, sys
from gnnserve.config import ServeConfig
from gnnserve.dynamic import graph as dg
from gnnserve.dynamic import json_scan as js
from gnnserve.engine.loader import build_engine
from gnnserve.sampling import presample_kernels as pk

kernels = {
    "apply_events": dg._apply_events, "compact": dg._compact, "count": dg._count,
    "count_many": dg._count_many,
    "presample_events": pk.apply_events, "copy_rows": pk.copy_rows, "json_scan": js._scan,
}

def compiled():
    return {name: len(kernel.signatures) for name, kernel in kernels.items()}

settings, logs = json.loads(sys.argv[1])
out = {}
off_settings = {**settings, "store.update_log": logs[0], "compute.warm_up": False}
off = build_engine(ServeConfig.load(None, **off_settings))
out["built"] = compiled()
out["spent_off"] = off.start().warm_up()
out["after_off"] = compiled()
off.stop()
on = build_engine(ServeConfig.load(None, **settings, **{"store.update_log": logs[1]}))
out["spent_on"] = on.start().warm_up()
out["warm"] = compiled()
ops = [{"op": "add_node", "features": [0.5] * 16}, {"op": "add_edge", "src": 2000, "dst": 7}]
ops += [{"op": "delete_edge", "src": int(u), "dst": 8} for u in on.graph.neighbors(8)]
on.apply_updates(ops)
on.updates.compact()
out["updated"] = compiled()
on.stop()
print(json.dumps(out))
"""


def test_warm_up_is_a_start_up_step_not_part_of_opening_the_store(
    small_store: Path, small_ckpt: Path, tmp_path: Path
) -> None:
    settings = {
        "store.path": str(small_store),
        "model_path": str(small_ckpt),
        "sampler.presample": True,
        "sampler.fanouts": [4, 3],
        "store.fsync": "never",
    }
    logs = [str(tmp_path / "log-off"), str(tmp_path / "log-on")]
    proc = subprocess.run(
        [sys.executable, "-c", _SERVE_AND_RECORD, json.dumps([settings, logs])],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.splitlines()[-1])
    none = {k: 0 for k in out["built"] if k != "compact"}  # opening a store lays it out with it
    assert {k: out["built"][k] for k in none} == none  # opening compiled no update kernel
    assert out["spent_off"] == {} and out["after_off"] == out["built"]  # warm-up off: nothing
    assert out["spent_on"]["updates"] > 0
    assert all(out["warm"].values()), out["warm"]  # the warm-up compiled every update kernel
    assert out["updated"] == out["warm"]  # and the first real batch compiled nothing more
