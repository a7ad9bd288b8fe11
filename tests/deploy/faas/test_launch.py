"""Instance launch paths and the memory rules with real processes and real cgroups: forked
instances answer as local inference does, a process instance is charged from its first byte,
one cold start per request, no scratch file outlives an instance, an OOM-killed request runs
again on a fresh instance, and a prediction above the free budget clears the cache first."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from gnnserve.deploy.faas.cgroup import MemoryCgroup, cgroup_support
from gnnserve.deploy.faas.function import FunctionSpec, scratch_dir
from gnnserve.deploy.faas.service import FaaSService
from gnnserve.errors import NeedsMoreMemoryError
from gnnserve.models.memory import MemoryPredictor
from tests.conftest import make_checkpoint
from tests.deploy.faas.test_service import local_logits, star_store

pytestmark = [
    pytest.mark.slow,
    pytest.mark.distributed,
    pytest.mark.skipif(cgroup_support() is not None, reason=str(cgroup_support())),
]
MB = 1 << 20


@contextmanager
def running(spec: FunctionSpec, **options: Any) -> Iterator[FaaSService]:
    """A service for ``spec`` (keep-alive 60 s), shut down on exit."""
    service = FaaSService(spec, keep_alive_s=60.0, **options)
    try:
        yield service
    finally:
        service.shutdown()


def _instances(service: FaaSService, pool: str) -> list[str]:
    """Names of the instances alive in ``pool`` ("sample" | "infer")."""
    chosen = service.sampler if pool == "sample" else service.inference
    return [i.handle.name for i in chosen._instances.values()]


def _parent(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def test_forked_instances_answer_as_local_inference(
    ray_instance: None, small_store: Path, tmp_path: Path
) -> None:
    ckpt = make_checkpoint(small_store, tmp_path / "sage", arch="sage")
    spec = FunctionSpec(small_store.as_uri(), str(ckpt), (5, 3), memory_mb=400)
    with running(spec, launch="fork", mb_per_cpu=400) as service:
        # no --max-instances: as many pairs of 1-core quotas as the cores hold
        assert service.max_instances == max(1, len(os.sched_getaffinity(0)) // 2)
        for key, ids in enumerate(([3], [7, 7, 100], [1999, 0])):
            seeds = np.array(ids, dtype=np.int64)
            got = service.predict(seeds, rng_seed=key)
            want = local_logits(small_store, ckpt, seeds, [5, 3], key)
            torch.testing.assert_close(got.output.logits, want, rtol=1e-5, atol=1e-5)
        templates = {f.result().process.pid for f in service.launcher._templates.values()}
        for pool, memory in service.instance_memory().items():
            (info,) = memory
            assert _parent(info["pid"]) in templates, pool  # forked from a template
            (name,) = _instances(service, pool)
            assert f"memory:/gnnserve/{name}" in Path(f"/proc/{info['pid']}/cgroup").read_text()
            assert info["limit_bytes"] == 400 * MB
        cpu = Path(f"/sys/fs/cgroup/cpu/gnnserve-faas/{_instances(service, 'infer')[0]}")
        assert (cpu / "cpu.cfs_quota_us").read_text() == (cpu / "cpu.cfs_period_us").read_text()
        assert service.summary()["cold_starts"] == 2
    assert not cpu.exists()  # the owner removed its cgroups


def test_a_forked_instance_that_dies_while_starting_fails_its_start(
    small_store: Path, tmp_path: Path
) -> None:
    from gnnserve.deploy.faas.fork import ForkedInstance, ForkLauncher
    from gnnserve.deploy.faas.launch import InstanceDiedError, Resources

    ckpt = make_checkpoint(small_store, tmp_path / "gcn", arch="gcn")
    spec = FunctionSpec(small_store.as_uri(), str(ckpt), (5, 3))
    launcher = ForkLauncher("test-dies")
    try:
        handle = launcher.launch("infer", spec, "test-dies-0", Resources(0, 0.0))
        assert isinstance(handle, ForkedInstance)
        os.kill(handle.pid, signal.SIGKILL)  # before it has built its function and connected
        with pytest.raises(InstanceDiedError, match="while starting"):
            handle.call("ready").result(timeout=30)
    finally:
        launcher.close()


def test_a_process_instance_is_charged_from_its_first_byte(
    ray_instance: None, small_store: Path, tmp_path: Path
) -> None:
    """Every anonymous page of the process, the Python runtime included, is charged to the
    instance's cgroup (joined after start-up, a v1 cgroup charged only what came later)."""
    ckpt = make_checkpoint(small_store, tmp_path / "gcn", arch="gcn")
    spec = FunctionSpec(small_store.as_uri(), str(ckpt), (5, 3), memory_mb=1500)
    with running(spec) as service:
        service.predict(np.array([4]), rng_seed=0)
        for pool, memory in service.instance_memory().items():
            (info,) = memory
            assert info["anon_bytes"] > 150 * MB, pool  # torch and the runtime
            assert info["usage_bytes"] >= info["anon_bytes"], (pool, info)


def test_the_inference_instance_starts_while_the_request_samples(
    ray_instance: None, small_store: Path, tmp_path: Path
) -> None:
    ckpt = make_checkpoint(small_store, tmp_path / "gcn", arch="gcn")
    spec = FunctionSpec(small_store.as_uri(), str(ckpt), (5, 3))
    with running(spec, launch="fork") as service:
        service.predict(np.array([4]), rng_seed=0)
        infer, sample = service.inference.stats, service.sampler.stats
        assert infer.cold_starts == sample.cold_starts == 1
        assert infer.launched_at[0] < sample.done_at[0]  # launched before sampling ended


def test_sample_instances_compile_their_kernels_in_the_cold_start(small_store: Path) -> None:
    code = (
        "import sys\n"
        "from gnnserve.sampling import kernels\n"
        "from gnnserve.deploy.faas.function import FunctionSpec, SampleFunction\n"
        "ds = [v for v in vars(kernels).values() if hasattr(v, 'signatures')]\n"
        "before = sum(len(d.signatures) for d in ds)\n"
        "SampleFunction(FunctionSpec(sys.argv[1], '', (5, 3)))\n"
        "print(before, sum(len(d.signatures) for d in ds))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, small_store.as_uri()],
        capture_output=True,
        text=True,
        check=True,
    )
    before, after = (int(v) for v in out.stdout.split())
    assert before == 0 and after > 0


@pytest.mark.parametrize("launch", ["fork", "process"])
def test_no_scratch_file_outlives_a_full_fetch_instance(
    ray_instance: None, small_store: Path, tmp_path: Path, launch: str
) -> None:
    ckpt = make_checkpoint(small_store, tmp_path / "gcn", arch="gcn")
    spec = FunctionSpec(small_store.as_uri(), str(ckpt), (5, 3), fetch="full", memory_mb=1500)
    temp = Path(tempfile.gettempdir())
    before = set(temp.iterdir())
    with running(spec, launch=launch) as service:
        tag = service._tag
        want = local_logits(small_store, ckpt, np.array([8]), [5, 3], 1)
        got = service.predict(np.array([8]), rng_seed=1)
        torch.testing.assert_close(got.output.logits, want, rtol=1e-5, atol=1e-5)
        names = _instances(service, "sample") + _instances(service, "infer")
        assert len(names) == 2
        assert not any(scratch_dir(n).exists() for n in names)  # deleted once loaded
    new = {p for p in set(temp.iterdir()) - before if p.name.startswith("gnnserve-faas")}
    left = {p for p in new if not p.is_dir() or any(p.iterdir())}  # empty shared parents aside
    # (FaaS's names only: tests on the other xdist worker make other deployments' temp dirs)
    assert not left and not list(scratch_dir(tag).parent.glob(f"{tag}*"))


def test_a_full_fetch_template_with_wide_rows_still_forks(tmp_path: Path) -> None:
    """The template's warm-up gathers a table over 1 MiB (4,200 columns), so a parallel
    numba kernel runs in it before it forks; GNU OpenMP's layer would abort that fork."""
    from gnnserve.data import generators
    from gnnserve.data.writer import write_store

    store = tmp_path / "wide"
    write_store(generators.rmat(300, 2400, feature_dim=4200, seed=3), store)
    ckpt = make_checkpoint(store, tmp_path / "gcn", arch="gcn")
    spec = FunctionSpec(store.as_uri(), str(ckpt), (-1, -1), fetch="full", cache=False)
    with running(spec, launch="fork") as service:
        got = service.predict(np.array([4, 9]), rng_seed=0)
        assert service.summary()["failures"] == 0
    want = local_logits(store, ckpt, np.array([4, 9]), [-1, -1], 0)
    torch.testing.assert_close(got.output.logits, want, rtol=1e-4, atol=1e-4)


def test_an_oom_killed_request_runs_again_on_a_fresh_instance(
    ray_instance: None, tmp_path: Path
) -> None:
    store = star_store(tmp_path / "star")
    ckpt = make_checkpoint(store, tmp_path / "ckpt", arch="sage")
    spec = FunctionSpec(store.as_uri(), str(ckpt), (-1, 1), memory_mb=1200, cache=False)
    with running(spec, launch="fork") as service:
        service.predict(np.array([5]), rng_seed=0)
        (name,) = _instances(service, "infer")
        group = MemoryCgroup(name, 1200 * MB)
        MemoryCgroup(name, group.usage_bytes + 8 * MB)  # this instance only: tight
        want = local_logits(store, ckpt, np.array([0]), [-1, 1], 0)
        got = service.predict(np.array([0]), rng_seed=0)  # 100 MB of features: killed, rerun
        torch.testing.assert_close(got.output.logits, want, rtol=1e-5, atol=1e-5)
        stats = service.inference.stats
        assert (stats.failures, stats.retries, stats.cold_starts) == (1, 1, 2)
        assert name not in _instances(service, "infer")


def test_a_request_killed_for_memory_twice_is_a_413_that_says_so(
    ray_instance: None, tmp_path: Path
) -> None:
    """Both instances OOM-killed (their cgroups count it): retrying cannot help, so the client
    gets 413 ``needs_more_memory`` naming --memory-mb, not a 503 to retry."""
    store = star_store(tmp_path / "star")
    ckpt = make_checkpoint(store, tmp_path / "ckpt", arch="sage")
    spec = FunctionSpec(store.as_uri(), str(ckpt), (-1, 1), memory_mb=120, cache=False)
    with running(spec, launch="fork", sample_memory_mb=0) as service:
        small = service.predict(np.array([5]), rng_seed=0)  # reads 2 rows: fits
        with pytest.raises(NeedsMoreMemoryError, match="killed for memory twice") as err:
            service.predict(np.array([0]), rng_seed=0)  # 100 MB of features, on both tries
        assert err.value.http_status == 413 and "--memory-mb 120" in err.value.message
        stats = service.inference.stats
        assert (stats.failures, stats.retries, stats.oom_kills) == (2, 1, 2)
        again = service.predict(np.array([5]), rng_seed=0)  # a replacement instance answers
        torch.testing.assert_close(again.output.logits, small.output.logits)


def test_a_prediction_above_the_free_budget_clears_the_cache_in_a_real_cgroup(
    ray_instance: None, small_store: Path, tmp_path: Path
) -> None:
    ckpt = make_checkpoint(small_store, tmp_path / "gcn", arch="gcn")
    rng = np.random.default_rng(0)
    X = rng.uniform(1, 2000, (200, 6))
    # 210 KB per input node: ~372 MB predicted for this request's 1,939 input nodes, above
    # the free budget of a 400 MB instance (0.9 x 400 MB less the instance's own memory),
    # within its capacity
    y = X[:, 0] * 210_000
    MemoryPredictor(2, fanouts=(5, 3)).fit(X, y, epochs=800).save(ckpt)
    spec = FunctionSpec(small_store.as_uri(), str(ckpt), (5, 3), memory_mb=400)
    with running(spec, launch="fork") as service:
        first = service.predict(np.array([3]), rng_seed=0)  # predicted a few MB: rows cached
        assert not first.output.cleared and first.output.misses > 0
        seeds = np.arange(0, 2000, 4, dtype=np.int64)
        got = service.predict(seeds, rng_seed=1)
        assert 340 * MB < got.output.predicted_bytes < 400 * MB and got.output.cleared
        assert got.output.evicted == first.output.misses  # every row cached before
        want = local_logits(small_store, ckpt, seeds, [5, 3], 1)
        torch.testing.assert_close(got.output.logits, want, rtol=1e-5, atol=1e-5)
