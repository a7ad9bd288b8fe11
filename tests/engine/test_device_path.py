"""The served device path (``compute.device: cuda``), here under numba's CUDA simulator: routed
batches run sample, gather and model through DevicePipeline in the stage threads and answer
exactly what the CPU path answers for the same draw key; inline batches stay on the CPU; a
configuration the path cannot serve is refused naming ``compute.device``."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from gnnserve.config import ServeConfig
from gnnserve.engine.batcher import Batch
from gnnserve.engine.engine import Engine
from gnnserve.engine.loader import build_engine
from gnnserve.errors import InvalidInputError

FANOUTS = [3, 2]
NODES = [4, 17, 4, 1999]


def _config(store: Path, ckpt: Path, **overrides: object) -> ServeConfig:
    base = {
        "store.path": str(store),
        "model_path": str(ckpt),
        "sampler.fanouts": FANOUTS,
        "sampler.parallel_threshold": 1,  # every batch is routed past the inline path
        "compute.warm_up": False,
    }
    return ServeConfig.load(None, **{**base, **overrides})


def _paths(engine: Engine) -> list[str]:
    """The sampling path of every batch the engine answers from now on."""
    paths: list[str] = []
    observers: list[Callable[[Batch], None]] = engine.executor.context.observers
    observers.append(lambda batch: paths.append(batch.path))
    return paths


def _same(got: torch.Tensor, want: torch.Tensor) -> None:
    """Equal under the simulator (the same float sums); on a GPU within float32 rounding."""
    if torch.cuda.is_available():
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    else:
        assert torch.equal(got, want)


def test_routed_batches_answer_as_the_cpu_path(small_store: Path, small_ckpt: Path) -> None:
    gpu_config = _config(small_store, small_ckpt, **{"compute.device": "cuda"})
    with build_engine(gpu_config) as gpu, build_engine(_config(small_store, small_ckpt)) as cpu:
        gpu_paths, cpu_paths = _paths(gpu), _paths(cpu)
        for output in ("probs", "embedding"):
            got = gpu.submit(gpu.request(NODES, output=output, seed=11)).result(timeout=300)
            want = cpu.submit(cpu.request(NODES, output=output, seed=11)).result(timeout=300)
            _same(got.values, want.values)
            assert got.timings.batch_size == want.timings.batch_size == 3  # unique seeds
        assert gpu_paths == ["cuda", "cuda"] and cpu_paths == ["parallel", "parallel"]
        assert gpu.executor.describe()["device_feature_rows"] == gpu.graph.num_nodes
        # a new model version: the device path copies it and answers with it
        runner = gpu.runner
        model = copy.deepcopy(runner.model)
        with torch.no_grad():
            for p in model.parameters():
                p.mul_(2.0)
        cpu.runner = gpu.runner = type(runner)(model, runner.version + "-x2")
        got = gpu.submit(gpu.request(NODES, output="probs", seed=3)).result(timeout=300)
        want = cpu.submit(cpu.request(NODES, output="probs", seed=3)).result(timeout=300)
        _same(got.values, want.values)


def test_inline_batches_stay_on_the_cpu(small_store: Path, small_ckpt: Path) -> None:
    overrides = {"compute.device": "cuda", "sampler.parallel_threshold": 2**40}
    with build_engine(_config(small_store, small_ckpt, **overrides)) as engine:
        paths = _paths(engine)
        engine.predict([1, 2])
        assert paths == ["inline"]


@pytest.mark.parametrize(
    ("overrides", "why"),
    [
        ({"deploy.mode": "dgs"}, "deploy mode 'dgs'"),
        ({"store.update_log": "log"}, "graph updates"),
        ({"sampler.presample": True}, "--presample"),
    ],
)
def test_what_the_device_path_cannot_serve_is_refused(
    small_store: Path, small_ckpt: Path, tmp_path: Path, overrides: dict[str, object], why: str
) -> None:
    if "store.update_log" in overrides:
        overrides = {"store.update_log": str(tmp_path / "updates.log")}
    config = _config(small_store, small_ckpt, **{"compute.device": "cuda", **overrides})
    with pytest.raises(InvalidInputError, match=why) as refused:
        build_engine(config)
    assert refused.value.field == "compute.device"


def test_without_a_gpu_serve_device_cuda_is_refused(small_store: Path, small_ckpt: Path) -> None:
    """The real CLI on this machine, without the simulator: no GPU, a clear refusal."""
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "0"}
    args = ["serve", "--store", str(small_store), "--model", str(small_ckpt), "--device", "cuda"]
    done = subprocess.run(
        [sys.executable, "-m", "gnnserve.cli", *args],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "--device cuda: it needs a CUDA GPU" in done.stderr
