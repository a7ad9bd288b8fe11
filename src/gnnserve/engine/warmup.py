"""Warm the request path up before the server reports ready.

numba compiles a kernel on its first call for each combination of argument types: with a cold
on-disk cache (a fresh store's index dtypes, a new machine) the first request after start-up
compiled the sampling kernels (458 ms against ~5 ms after). torch allocates and dispatches on
its first forward, and a static graph builds its GCN degree table on first use.
:func:`warm_up_engine` runs every path a request for the configured default fanouts can take
once, on the served graph's arrays, features and model, so that ``/v2/health/ready`` means warm:

- sampling: the planner's sampler (the pre-sampler when configured); on demand (also beside the
  pre-sampler: seeded requests sample on demand), the inline kernel, and hop by hop with serial
  and with parallel draws when a batch can be large enough to go hop by hop
  (``max(max_batch_nodes, max_nodes_per_request)`` seeds);
- the feature gather (serial, and parallel when the graph has enough nodes), GCN degrees, the
  model's forward and the shaping of every output kind;
- a one-node new-node request in every mode (srpe with every policy but oracle, full, ns, pe)
  when precomputed embeddings are loaded;
- with an update log, the update path: the store's kernels (``dynamic.warmup``) and, with
  pre-sampling, the pre-sampler's (``sampling.warmup``), which run under the write lock.

The stages run on the caller's thread, outside admission and the batcher: no request id, no
metric and no service-time sample comes from the warm-up. It is an explicit start-up step:
``Engine.warm_up`` calls it, the app runs that after ``Engine.start``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

import numpy as np
import torch

from gnnserve.dynamic.warmup import warm_up_updates
from gnnserve.errors import GnnServeError
from gnnserve.features.stores import parallel_gather_rows
from gnnserve.newnodes.parse import parse_new_nodes
from gnnserve.sampling.sampler import NeighborSampler
from gnnserve.sampling.warmup import warm_up_presample_updates
from gnnserve.types import MiniBatch, OutputKind

if TYPE_CHECKING:
    from gnnserve.engine.engine import Engine

log = logging.getLogger(__name__)

_SEEDS = 8  # seeds of the warm-up batch
T = TypeVar("T")


def warm_up_engine(engine: Engine) -> dict[str, float]:
    """Run each path of a default-fanout request once; returns ms per step and ``total``
    (:func:`log_warm_up` reports them)."""
    spent: dict[str, float] = {}
    start = time.perf_counter()
    if engine.graph.num_nodes > 0 and engine.graph.local:  # remote: the executor warms up
        batch = _timed(spent, "sample+fetch", lambda: _sample_and_fetch(engine))
        _timed(spent, "model", lambda: _forward(engine, batch))
        if engine.new_nodes.embeddings is not None:
            _timed(spent, "new_nodes", lambda: _new_nodes(engine))
    if engine.updates is not None:
        _timed(spent, "updates", lambda: _updates(engine))
    spent["total"] = (time.perf_counter() - start) * 1e3
    return spent


def log_warm_up(spent: dict[str, float], engine: Engine) -> None:
    """Log what the warm-up ran (ms per step), or why it ran nothing in this process."""
    steps = ", ".join(f"{k} {v:.0f} ms" for k, v in spent.items() if k != "total")
    if steps:
        log.info(
            "request path warmed up in %.0f ms (%s; fanouts %s)",
            spent["total"],
            steps,
            list(engine.planner.default),
        )
    elif engine.graph.num_nodes == 0:
        log.info("nothing to warm up: the graph has no nodes yet")
    else:
        log.info("nothing to warm up in this process: %s", engine.executor.cold_start_note)


def _updates(engine: Engine) -> None:
    """Compile the update path: the store's kernels, and the pre-sampler's when it is fed."""
    warm_up_updates()
    presampler = engine.planner.presampler
    if presampler is not None:
        warm_up_presample_updates(presampler.fanouts)


def _timed(spent: dict[str, float], name: str, step: Callable[[], T]) -> T:
    start = time.perf_counter()
    out = step()
    spent[name] = (time.perf_counter() - start) * 1e3
    return out


def _sample_and_fetch(engine: Engine) -> MiniBatch:
    """Sample on every reachable path; the served sampler's batch with its features."""
    graph = engine.graph
    graph.acquire_read()  # as the engine's sample stage: held until the features are read
    try:
        seeds = _seeds(engine)
        subgraph = engine.planner.sampler_for(None).sample(seeds)  # the served sampler
        _sample_on_demand_paths(engine, seeds)
        ids = subgraph.input_nodes
        x = engine.features.get(ids)
        in_degree = torch.from_numpy(graph.gcn_degree(ids))
        rows = parallel_gather_rows(engine.features.dim)
        if graph.num_nodes >= rows:  # a batch can reach the parallel gather
            engine.features.get(np.arange(rows, dtype=np.int64))
    finally:
        graph.release_read()
    return MiniBatch(subgraph, x, in_degree)


def _in_degree(engine: Engine) -> np.ndarray:
    """Each node's in-degree in the served graph."""
    return engine.graph.adjacency()[1][: engine.graph.num_nodes]


def _seeds(engine: Engine) -> np.ndarray:
    """Up to ``_SEEDS`` nodes with in-neighbours (any nodes when none has)."""
    nodes = np.flatnonzero(_in_degree(engine) > 0)[:_SEEDS]
    if nodes.size == 0:
        nodes = np.arange(min(engine.graph.num_nodes, _SEEDS))
    return nodes.astype(np.int64)


def _sample_on_demand_paths(engine: Engine, seeds: np.ndarray) -> None:
    """Sample ``seeds`` on each on-demand path a default-fanout batch can take.

    Also where the pre-sampler serves the default fanouts: a request with its own seed samples
    on demand. Inline always; hop by hop (serial draws for hops below the parallel threshold,
    parallel draws above it) only when the largest batch's expected size reaches the on-demand
    sampler's threshold. One private sampler, its threshold set per path (the served one is
    shared with requests).
    """
    planner = engine.planner
    served = planner.on_demand_for(None)
    assert isinstance(served, NeighborSampler)
    sampler = NeighborSampler(engine.graph, list(planner.default), parallel_threshold=2**62)
    sampler.sample(seeds)  # inline
    cfg = engine.config
    largest = max(cfg.batcher.max_batch_nodes, cfg.admission.max_nodes_per_request)
    heaviest = 0 if served.cost is None else int(np.argmax(served.cost))
    if served.expected_size(np.full(largest, heaviest, np.int64)) >= served.parallel_threshold:
        sampler.parallel_threshold = 1  # by hop: serial draws, then parallel ones
        for draw_edges in (2**62, 0):
            sampler.parallel_draw_edges = draw_edges
            sampler.sample(seeds)


def _forward(engine: Engine, batch: MiniBatch) -> None:
    logits, embedding = engine.runner.forward(batch)
    rows = batch.subgraph.seed_rows
    for kind in OutputKind:
        engine.runner.shape_output(kind, logits, embedding, rows)


# (mode, policy) runs of the new-node warm-up: every mode a request may ask for, and SRPE with
# every policy but ``oracle`` (evaluation only: it recomputes every candidate to rank them)
_NEW_NODE_RUNS = (
    ("srpe", "query_edges_ratio"),
    ("srpe", "importance"),
    ("srpe", "random"),
    ("full", None),
    ("ns", None),
    ("pe", None),
)


def _new_nodes(engine: Engine) -> None:
    """One new node with one edge to a node of the lowest in-degree (a small full computation
    graph), in every mode and SRPE policy (skipped while the PEs are stale)."""
    cfg, graph = engine.config.embeddings, engine.graph
    new = parse_new_nodes(
        np.zeros((1, engine.features.dim), np.float32),
        np.array([[0, _quiet_node(engine)]], np.int64),
        num_nodes=graph.num_nodes,
        feature_dim=engine.features.dim,
        max_new_nodes=cfg.max_new_nodes,
    )
    inference = engine.new_nodes.inference()
    for mode, policy in _NEW_NODE_RUNS:
        graph.acquire_read()
        try:
            out = inference.run(new, mode, cfg.gamma, policy or cfg.policy, None, 0)
        except GnnServeError as exc:  # e.g. stale PEs: these requests are refused (409) anyway
            log.info("new-node path not warmed up: %s", exc.message)
            return
        finally:
            graph.release_read()
    rows = np.arange(1, dtype=np.int64)
    for kind in OutputKind:
        engine.runner.shape_output(kind, out.logits.cpu(), out.embedding.cpu(), rows)


def _quiet_node(engine: Engine) -> int:
    """A node with the fewest in-neighbours (at least one when any node has some)."""
    degree = _in_degree(engine)
    some = np.flatnonzero(degree > 0)
    if some.size == 0:
        return 0
    return int(some[np.argmin(degree[some])])
