"""The executor interface: deploy modes come from the EXECUTORS registry, a new one plugs in
without editing the engine, and the local one answers as the plain pipeline does."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from gnnserve.config import ServeConfig
from gnnserve.engine.batcher import Batch
from gnnserve.engine.executor import EXECUTORS, ExecutionContext
from gnnserve.engine.loader import build_engine
from gnnserve.engine.local import LocalExecutor
from gnnserve.errors import InvalidInputError
from gnnserve.types import SampledSubgraph


class CountingExecutor(LocalExecutor):
    """A test-only deployment: the local path, counting the seeds it sampled."""

    name = "test-counting"
    seeds_sampled: list[int] = []

    def sample(self, batch: Batch) -> SampledSubgraph:
        CountingExecutor.seeds_sampled.append(int(batch.seeds.size))
        return super().sample(batch)

    def describe(self) -> dict[str, object]:
        return {"deploy": self.name, "batches": len(self.seeds_sampled)}


@pytest.fixture
def counting() -> Iterator[type[CountingExecutor]]:
    EXECUTORS.register(CountingExecutor.name)(CountingExecutor)
    CountingExecutor.seeds_sampled = []
    yield CountingExecutor
    EXECUTORS.unregister(CountingExecutor.name)


def _config(store: Path, ckpt: Path, mode: str) -> ServeConfig:
    overrides = {"store.path": str(store), "model_path": str(ckpt), "deploy.mode": mode}
    return ServeConfig.load(None, **{**overrides, "sampler.fanouts": [-1, -1]})


def test_registered_executor_serves_without_engine_changes(
    small_store: Path, small_ckpt: Path, counting: type[CountingExecutor]
) -> None:
    nodes = [3, 1, 4, 1, 5]
    with build_engine(_config(small_store, small_ckpt, "local")) as engine:
        assert engine.executor.name == "local"
        want = engine.predict(nodes, "probs", timeout_s=60).values
    with build_engine(_config(small_store, small_ckpt, counting.name)) as engine:
        assert isinstance(engine.executor, CountingExecutor)
        got = engine.predict(nodes, "probs", timeout_s=60).values
        assert engine.executor.describe() == {"deploy": counting.name, "batches": 1}
    # fanouts -1 (all neighbours): the same computation graph, so the same answer
    np.testing.assert_array_equal(got.numpy(), want.numpy())
    assert counting.seeds_sampled == [len(nodes)]


def test_unknown_mode_names_the_registered_ones(small_store: Path, small_ckpt: Path) -> None:
    with pytest.raises(InvalidInputError, match="'nowhere'.*cgp.*dgs.*local") as info:
        build_engine(_config(small_store, small_ckpt, "nowhere"))
    assert info.value.field == "deploy.mode"


def test_context_is_what_the_executor_gets(small_store: Path, small_ckpt: Path) -> None:
    with build_engine(_config(small_store, small_ckpt, "local")) as engine:
        ctx = engine.executor.context
        assert isinstance(ctx, ExecutionContext)
        assert ctx.graph is engine.graph and ctx.planner is engine.planner
        assert ctx.observers is engine.observers  # observers added later still see batches
