"""Fill numba's on-disk cache before the test workers start (`make test` runs its two parts
beside each other, lint, mypy and the docs build, then pytest).

A clean clone starts with an empty cache, and without this step the two xdist workers, their
servers and their Ray workers each compile the same kernels at once in the suite's first
minutes (~28 s of a quiet run's wall time). Here one process compiles the request, new-node,
pre-sampling and update paths on the suite's small store (the signatures most tests use):
building an engine per configuration and running its warm-up, as a server does before it
reports ready; then the DGS workers' kernels. Kernels it misses are compiled by the tests as
before; nothing is asserted here.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from gnnserve.config import ServeConfig
from gnnserve.embeddings.stores import default_embeddings_dir
from gnnserve.engine.loader import build_engine
from tests.conftest import make_checkpoint, write_embeddings, write_small_store


def _configs(store: Path, ckpt: Path, log: Path) -> list[dict[str, object]]:
    base: dict[str, object] = {"store.path": str(store), "model_path": str(ckpt)}
    return [
        {**base, "sampler.fanouts": [10, 5], "sampler.parallel_threshold": 5000},
        {**base, "sampler.fanouts": [-1, -1]},
        {
            **base,
            "sampler.fanouts": [10, 5],
            "sampler.presample": True,
            "store.update_log": str(log),
        },
    ]


def _warm_dgs() -> None:
    """The DGS workers' kernels, in this process: a sampling worker's update path and a serving
    worker's assembly (writable and read-only seeds, as Ray hands them over). Without this the
    suite's first DGS test started four workers that each compiled them (~20 s of a clean run)."""
    from gnnserve.deploy.dgs.sampling_worker import warm_update_path
    from gnnserve.deploy.dgs.serving_worker import ServingCache

    warm_update_path([5, 3])
    cache = ServingCache(16, [5, 3])
    for writable in (True, False):
        seeds = np.arange(3, dtype=np.int64)
        seeds.flags.writeable = writable
        with contextlib.suppress(RuntimeError):  # an empty cache: what is asked is missing
            cache.sample(seeds)


def _warm_engines() -> None:
    """The request, new-node, pre-sampling and update paths of a server on the small store."""
    with tempfile.TemporaryDirectory(prefix="gnnserve-warm-kernels-") as tmp:
        store = write_small_store(Path(tmp) / "small")
        ckpt = make_checkpoint(store, Path(tmp) / "sage")
        write_embeddings(store, ckpt, default_embeddings_dir(store, ckpt))
        for settings in _configs(store, ckpt, Path(tmp) / "updates.log"):
            engine = build_engine(ServeConfig.load(None, **settings)).start()
            try:
                engine.warm_up()
            finally:
                engine.stop()


PARTS = {"engines": _warm_engines, "dgs": _warm_dgs}


def main(argv: list[str]) -> int:
    """Warm the kernels of the parts named in ``argv`` (default: all; `make test` runs each in
    its own process, at once); 0 always (a failure only leaves the tests to compile)."""
    start = time.perf_counter()
    names = argv or list(PARTS)
    for name in names:
        try:
            PARTS[name]()
        except Exception as exc:  # noqa: BLE001 - the tests compile what this did not
            print(f"warm_kernels: {name} skipped ({exc!r})", file=sys.stderr)
    took = time.perf_counter() - start
    print(f"warm_kernels: numba cache filled ({', '.join(names)}) in {took:.1f} s")
    return 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    sys.exit(main(sys.argv[1:]))
