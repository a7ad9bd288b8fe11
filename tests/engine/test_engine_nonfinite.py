"""Engine: a request whose outputs are not finite fails alone; its batch-mates are answered."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from gnnserve.config import ServeConfig
from gnnserve.engine.batcher import Batch
from gnnserve.engine.loader import build_engine
from gnnserve.errors import NonFiniteOutputError


def _receptive_field(graph, v: int) -> set[int]:  # type: ignore[no-untyped-def]
    """``v`` and its in-neighbours up to 2 hops (what a 2-layer model reads)."""
    hop1 = set(graph.neighbors(v).tolist())
    hop2 = {int(w) for u in hop1 for w in graph.neighbors(u)}
    return {v} | hop1 | hop2


def test_only_the_requests_with_non_finite_outputs_fail(
    small_store: Path, small_ckpt: Path, tmp_path: Path, reference
) -> None:
    config = ServeConfig.load(
        None,
        **{
            "store.path": str(small_store),
            "model_path": str(small_ckpt),
            "sampler.fanouts": [-1, -1],
            "store.update_log": str(tmp_path / "log"),
            "store.fsync": "never",
            "batcher.max_wait_ms": 300.0,  # the requests below ride in one batch
        },
    )
    engine = build_engine(config)
    batches: list[Batch] = []
    engine.observers.append(batches.append)
    with engine:
        engine.apply_updates([{"op": "upsert_features", "node": 7, "features": [3e38] * 16}])
        clean = next(v for v in range(100) if 7 not in _receptive_field(engine.graph, v))
        futures = [engine.submit(engine.request(n, output="probs")) for n in ([clean], [7])]
        good = futures[0].result(30)
        with pytest.raises(NonFiniteOutputError, match=r"node\(s\) \[7\]"):
            futures[1].result(30)
    assert any(len(b.tickets) == 2 for b in batches)  # they shared a batch
    logits = reference[0]  # the unchanged store: node 7 is not in clean's receptive field
    want = np.exp(logits[clean].numpy()) / np.exp(logits[clean].numpy()).sum()
    np.testing.assert_allclose(good.values.numpy()[0], want, rtol=1e-5, atol=1e-6)
