"""Compile the pre-sampler's update kernels before serving: an explicit start-up step.

The pre-sampler's reservoirs are updated under the dynamic store's write lock (it is a
subscriber, see ``graph.events``), so a first update that compiles them stalls every reader,
as the store's own kernels would (``gnnserve.dynamic.warmup``). ``warm_up_presample_updates``
feeds one small batch (a new node, a delete that refills a reservoir, an insert) and a sample
through a throw-away pre-sampler, once per process and fanouts. The engine's warm-up calls it
when it serves a changing graph with pre-sampling.
"""

from __future__ import annotations

import logging
import threading
import time

import numpy as np

from gnnserve.graph.events import DELETE, INSERT
from gnnserve.sampling.presample import PreSampler

log = logging.getLogger(__name__)
_done: set[tuple[int, ...]] = set()
_lock = threading.Lock()


def warm_up_presample_updates(fanouts: list[int]) -> float:
    """Exercise the pre-sampler's update and sample kernels for ``fanouts`` once per process;
    returns ms spent (0.0 when already done for these fanouts)."""
    key = tuple(fanouts)
    with _lock:
        if key in _done:
            return 0.0
        _done.add(key)
    start = time.perf_counter()
    _exercise(list(key))
    elapsed = (time.perf_counter() - start) * 1e3
    log.info("pre-sampler update kernels warmed up in %.0f ms (fanouts %s)", elapsed, list(key))
    return elapsed


def refill_graph(fanouts: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """In-neighbour CSR (indptr, indices) of d + 1 nodes, d = max(fanouts) + 1: node 0 has
    in-neighbours 1 .. d, so its largest reservoir holds some of them, and deleting one it holds
    makes the update kernel refill from the rest; the other nodes have none."""
    d = max(fanouts) + 1
    indptr = np.concatenate([[0], np.full(d + 1, d)]).astype(np.int64)
    return indptr, np.arange(1, d + 1, dtype=np.int64)


def _exercise(fanouts: list[int]) -> None:
    indptr, indices = refill_graph(fanouts)
    d = indices.size
    presampler = PreSampler(indptr, indices, fanouts, seed=0)
    presampler.on_add_nodes(1)  # node d + 1
    held = int(presampler.reservoir(0, fanouts.index(d - 1))[0])
    kinds = np.array([DELETE, INSERT], dtype=np.int64)
    srcs = np.array([held, d + 1], dtype=np.int64)
    dsts = np.array([0, 0], dtype=np.int64)
    after = np.append(np.delete(indices, held - 1), d + 1)  # node 0's in-neighbours after
    twin = presampler.clone()
    presampler.on_edge_events(kinds, srcs, dsts, lambda v: after)
    twin.copy_changes(presampler, dsts)  # the second copy's catch-up
    presampler.sample(np.array([0, 1], dtype=np.int64))
