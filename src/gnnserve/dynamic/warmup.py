"""Compile the update path's numba kernels before serving: an explicit start-up step.

numba compiles a kernel on its first call (seconds, when the on-disk cache is cold). On the
update path that first call runs under the store's write lock, so without a warm-up the first
update batch after start-up stalls every reader for seconds. ``warm_up_updates`` runs one small
batch (node insert, feature upsert, edge insert and delete), one refused batch (a delete
of a missing edge), an edge body read by the JSON scan and a compaction through a throw-away
store of the same dtypes, once per process. Opening a store does not call it: the engine's
warm-up does (``Engine.warm_up``, skipped with ``compute.warm_up`` off), and so may any tool
that times updates. Subscribers warm up their own kernels (the pre-sampler's:
``gnnserve.sampling.warmup``).
"""

from __future__ import annotations

import contextlib
import logging
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from gnnserve.data.writer import GraphData, write_store
from gnnserve.dynamic.json_scan import scan_edges
from gnnserve.dynamic.store import DynamicStore
from gnnserve.dynamic.updates import UpdateRejectedError
from gnnserve.features import open_feature_store
from gnnserve.graph import open_graph_store

log = logging.getLogger(__name__)
_done = False
_lock = threading.Lock()


def warm_up_updates() -> float:
    """Exercise the update kernels once per process; returns ms spent (0.0 after the first)."""
    global _done
    with _lock:
        if _done:
            return 0.0
        _done = True
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="gnnserve-warmup-") as tmp:
        _exercise(Path(tmp))
    elapsed = (time.perf_counter() - start) * 1e3
    log.info("update kernels warmed up in %.0f ms", elapsed)
    return elapsed


def _exercise(tmp: Path) -> None:
    ring = np.array([[0, 1, 2, 3], [1, 2, 3, 0]], dtype=np.int64)
    write_store(GraphData("warmup", 4, ring, np.zeros((4, 1), np.float32)), tmp / "store")
    graph, features = open_graph_store(tmp / "store"), open_feature_store(tmp / "store")
    dyn = DynamicStore(graph, features, tmp / "log", fsync="never")
    try:
        dyn.apply(
            [
                {"op": "add_node", "features": [1.0]},
                {"op": "upsert_features", "node": 0, "features": [2.0]},
                {"op": "add_edge", "src": 4, "dst": 0},
                {"op": "add_edge", "src": 2, "dst": 0},
                {"op": "delete_edge", "src": 3, "dst": 0},
            ]
        )
        with contextlib.suppress(UpdateRejectedError):  # a refusal's checks compile too
            dyn.apply([{"op": "delete_edge", "src": 0, "dst": 2}])
        body = b'{"ops": [{"op": "add_edge", "src": 1, "dst": 0}]}'  # the HTTP edge-body scan
        batch = scan_edges(body, features.dim)
        assert batch is not None
        dyn.apply_columns(batch)
        dyn.compact()
    finally:
        dyn.close()
