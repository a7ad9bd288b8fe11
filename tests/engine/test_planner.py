"""Planner: per-request fanouts, the pre-sampled path on a changing graph, and bad fanouts."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from gnnserve.config import ServeConfig
from gnnserve.engine.loader import build_engine
from gnnserve.errors import InvalidInputError
from gnnserve.sampling.presample import PreSampler
from gnnserve.types import MiniBatch


def _config(store: Path, ckpt: Path, **overrides: object) -> ServeConfig:
    base = {"store.path": str(store), "model_path": str(ckpt), "sampler.fanouts": [5, 5]}
    return ServeConfig.load(None, **{**base, **overrides})


def test_request_fanouts_override_the_default(small_store, small_ckpt, reference) -> None:
    logits, _ = reference
    nodes = [3, 99, 3, 1500]
    with build_engine(_config(small_store, small_ckpt)) as engine:
        full = engine.predict(nodes, "probs", fanouts=[-1, -1]).values
        sampled = engine.predict(nodes, "probs").values
    torch.testing.assert_close(full, torch.softmax(logits[nodes], 1), atol=1e-5, rtol=0)
    assert not torch.allclose(sampled, full, atol=1e-5)  # the default [5, 5] samples


@pytest.mark.parametrize("fanouts", [[5], [5, 5, 5], [0, 5], [5, "a"], "5,5", [True, 5]])
def test_bad_fanouts_are_refused(small_store, small_ckpt, fanouts) -> None:
    with build_engine(_config(small_store, small_ckpt)) as engine:
        with pytest.raises(InvalidInputError) as info:
            engine.predict([1], fanouts=fanouts)
        assert info.value.field == "fanouts"


def _forward(engine, sampler: PreSampler, nodes: list[int]) -> torch.Tensor:
    sg = sampler.sample(np.array(nodes))
    ids = sg.input_nodes
    batch = MiniBatch(sg, engine.features.get(ids), torch.from_numpy(engine.graph.gcn_degree(ids)))
    logits, _ = engine.runner.forward(batch)
    return torch.softmax(logits[torch.from_numpy(sg.seed_rows)], 1)


def test_presampled_path_follows_updates(small_store, small_ckpt, tmp_path) -> None:
    overrides = {
        "sampler.presample": True,
        "store.update_log": str(tmp_path / "log"),
        "store.fsync": "never",
    }
    nodes = [7, 8, 9]
    with build_engine(_config(small_store, small_ckpt, **overrides)) as engine:
        presampler = engine.planner.presampler
        assert presampler is not None
        before = engine.predict(nodes, "probs").values
        torch.testing.assert_close(before, _forward(engine, presampler, nodes), atol=1e-5, rtol=0)
        ops = [{"op": "add_edge", "src": int(u), "dst": 7} for u in range(100, 140)]
        ops += [{"op": "delete_edge", "src": int(u), "dst": 8} for u in engine.graph.neighbors(8)]
        engine.apply_updates(ops)
        assert presampler.reservoir(8, 0).size == 0  # every in-edge of 8 is gone
        assert set(presampler.reservoir(7, 0).tolist()) <= set(engine.graph.neighbors(7).tolist())
        after = engine.predict(nodes, "probs")
        torch.testing.assert_close(
            after.values, _forward(engine, presampler, nodes), atol=1e-5, rtol=0
        )
        assert after.graph_version.endswith(".1")
