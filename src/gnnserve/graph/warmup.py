"""Compile the update path's numba kernels before serving.

numba compiles a kernel on its first call (seconds, when the on-disk cache is cold). On the
update path that first call runs under the store's write lock, so without a warm-up the first
update batch after start-up stalls every reader for seconds. ``warm_up_updates`` runs one small
batch (node insert, feature upsert, edge insert and delete, compaction, a pre-sampled read)
through a throw-away store of the same dtypes, once per process and pre-sampling query.
"""

from __future__ import annotations

import logging
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)
_done: set[tuple[int, ...]] = set()
_lock = threading.Lock()


def warm_up_updates(fanouts: list[int] | None = None) -> float:
    """Exercise the update kernels (and the pre-sampler's for ``fanouts``); returns ms spent."""
    key = tuple(fanouts or ())
    with _lock:
        if key in _done:
            return 0.0
        _done.add(key)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="gnnserve-warmup-") as tmp:
        _exercise(Path(tmp), list(key))
    elapsed = (time.perf_counter() - start) * 1e3
    log.info("update kernels warmed up in %.0f ms (fanouts %s)", elapsed, list(key) or None)
    return elapsed


def _exercise(tmp: Path, fanouts: list[int]) -> None:
    # imported here: dynamic_store imports this module
    from gnnserve.data.writer import GraphData, write_store
    from gnnserve.features import open_feature_store
    from gnnserve.graph import open_graph_store
    from gnnserve.graph.dynamic_store import DynamicStore
    from gnnserve.sampling.presample import PreSampler

    ring = np.array([[0, 1, 2, 3], [1, 2, 3, 0]], dtype=np.int64)
    write_store(GraphData("warmup", 4, ring, np.zeros((4, 1), np.float32)), tmp / "store")
    graph, features = open_graph_store(tmp / "store"), open_feature_store(tmp / "store")
    dyn = DynamicStore(graph, features, tmp / "log", fsync="never")
    try:
        presampler = None
        if fanouts:
            presampler = PreSampler(*dyn.graph.csr(), fanouts, seed=0)
            dyn.attach(presampler)
        dyn.apply(
            [
                {"op": "add_node", "features": [1.0]},
                {"op": "upsert_features", "node": 0, "features": [2.0]},
                {"op": "add_edge", "src": 4, "dst": 0},
                {"op": "add_edge", "src": 2, "dst": 0},
                {"op": "delete_edge", "src": 3, "dst": 0},
            ]
        )
        dyn.compact()
        if presampler is not None:
            presampler.sample(np.array([0, 1], dtype=np.int64))
    finally:
        dyn.close()
