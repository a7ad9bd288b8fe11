"""The idle heap trimmer: it gives the heap back once forwards ran and then stopped, once per
burst, and never while none ran; a forward counts."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
import torch

from gnnserve.features import open_feature_store
from gnnserve.graph import open_graph_store
from gnnserve.models import heap
from gnnserve.models.heap import IdleHeapTrimmer
from gnnserve.models.runner import ModelRunner, forwards_run
from gnnserve.models.zoo import GNN, ModelConfig
from gnnserve.sampling import NeighborSampler
from gnnserve.types import MiniBatch


def _wait(condition, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + 30  # the trimmer checks every 50 ms: a correct run is far below
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def test_trims_once_per_burst_and_never_without_one(monkeypatch: pytest.MonkeyPatch) -> None:
    count = [0]
    trims: list[int] = []
    monkeypatch.setattr(heap, "forwards_run", lambda: count[0])
    monkeypatch.setattr(heap, "release_freed_heap", lambda: trims.append(count[0]))
    trimmer = IdleHeapTrimmer(idle_s=0.2).start()
    try:
        time.sleep(0.6)  # three idle periods with no forward: nothing to give back
        assert trims == []
        count[0] = 5  # a burst of forwards
        _wait(lambda: trims == [5], "no trim after the burst")
        time.sleep(0.6)  # still idle: the same pages are not trimmed again
        assert trims == [5] and trimmer.trims == 1
        count[0] = 9
        _wait(lambda: trims == [5, 9], "no trim after the second burst")
    finally:
        trimmer.stop()


def test_a_forward_counts(small_store: Path) -> None:
    graph, features = open_graph_store(small_store), open_feature_store(small_store)
    torch.manual_seed(0)
    config = ModelConfig(arch="sage", in_dim=16, hidden_dim=8, out_dim=4, num_layers=2)
    runner = ModelRunner(GNN(config), "v")
    subgraph = NeighborSampler(graph, [3, 3], seed=0).sample(np.arange(5), rng_seed=0)
    ids = subgraph.input_nodes
    degree = torch.from_numpy(graph.gcn_degree(ids))
    before = forwards_run()
    runner.forward(MiniBatch(subgraph, features.get_valid(ids), degree))
    assert forwards_run() == before + 1
