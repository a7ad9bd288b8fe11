"""Pre-sampled vs on-demand sampling where the adjacency is not in memory (DGS, seed 004).

DGS's gain is largest when drawing neighbours on demand must read the adjacency from storage:
pre-sampled reservoirs are looked up in memory whatever backend holds the graph. On
fb100_cornell5 and soc_epinions1, single-seed 2-hop [25, 10] requests with seeds drawn in
proportion to in-degree (hub-skewed, as bench/dynamic.py), one request at a time, for:

- ``presample``: PreSampler reservoirs (in memory; built from the CSR once);
- ``ondemand_memory``: NeighborSampler over the in-memory CSR (the reference);
- ``ondemand_mmap``: NeighborSampler over the mmap backend, the files' page cache dropped
  (``posix_fadvise(DONTNEED)``) before the arm: cold start, then warm as the cache fills; the
  first 10% of requests are reported apart as ``cold``;
- ``ondemand_remote``: OnDemandSampler over the CSR in SeaweedFS (S3 API via obstore, byte
  ranges; on this machine's loopback), what a serverless function reads (FaaS-GNN §4.2);
- ``ondemand_mmap_capped`` (R-MAT, 2^20 nodes, 16M edges: a 128 MB column index): the mmap
  arm in a child process inside a real memory cgroup whose limit is a quarter of the CSR's
  bytes, so the adjacency does not fit in the memory the sampler may use (the case DGS's
  pre-sampling is for); the page cache is dropped first, kernels are compiled on a small
  in-memory graph so the big one is first touched under the limit. (``--requests`` and the
  remote arm are skipped on R-MAT: ~100 ms a request there.)

Each arm answers the same seed sequence (>= 2,000 requests). The targets: presample p99 <= 1/3
of on-demand p99 on the mmap and remote backends (reported as on-demand / presample >= 3).

    python bench/presample_backends.py            # full run (~3 min)
    python bench/presample_backends.py --quick    # smoke run
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

import gnnserve  # noqa: F401  (first: sets the OpenMP wait policy)

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import Targets, environment, parse_args, result_name, write_results  # noqa: E402
from dynamic import FANOUTS, make_store  # noqa: E402
from gnnserve.data.blobs import open_blobs  # noqa: E402
from gnnserve.data.generators import rmat  # noqa: E402
from gnnserve.data.publish import publish  # noqa: E402
from gnnserve.data.seaweed import ObjectStoreServer  # noqa: E402
from gnnserve.data.writer import GraphData, write_store  # noqa: E402
from gnnserve.deploy.faas.cgroup import MemoryCgroup  # noqa: E402
from gnnserve.graph import open_graph_store  # noqa: E402
from gnnserve.graph.remote import RemoteCSR  # noqa: E402
from gnnserve.sampling import NeighborSampler  # noqa: E402
from gnnserve.sampling.ondemand import OnDemandSampler  # noqa: E402
from gnnserve.sampling.presample import PreSampler  # noqa: E402


def drop_page_cache(store: Path) -> None:
    """Evict the store's files from the page cache (this machine's other files untouched)."""
    for path in store.rglob("*"):
        if path.is_file():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def timed(sample: Callable[[np.ndarray], object], seeds: np.ndarray) -> np.ndarray:
    """Latency (ms) of one single-seed request per seed, in order."""
    out = np.empty(seeds.size)
    for i in range(seeds.size):
        t0 = time.perf_counter()
        sample(seeds[i : i + 1])
        out[i] = (time.perf_counter() - t0) * 1e3
    return out


def summary(lat: np.ndarray) -> dict[str, float]:
    """Requests, p50 and p99 (ms), and the first 10% (cold) apart."""
    cold = lat[: max(lat.size // 10, 1)]
    return {
        "requests": int(lat.size),
        "p50_ms": float(np.percentile(lat, 50)),
        "p99_ms": float(np.percentile(lat, 99)),
        "cold_p99_ms": float(np.percentile(cold, 99)),
        "latencies_ms": [round(float(x), 4) for x in lat],
    }


def hub_seeds(indptr: np.ndarray, count: int) -> np.ndarray:
    """``count`` seeds drawn in proportion to in-degree (hub-skewed)."""
    deg = np.diff(indptr).astype(float)
    return np.random.default_rng(3).choice(deg.size, count, p=deg / deg.sum())


def run_dataset(
    name: str, store: Path, server: ObjectStoreServer | None, requests: int, capped: bool
) -> dict:
    """Every arm on one dataset, the same seeds (``server`` None: no remote arm)."""
    memory = open_graph_store(store)
    indptr, indices = memory.csr()
    seeds = hub_seeds(indptr, requests)
    warm = seeds[:50]
    out: dict = {"num_nodes": int(indptr.size - 1), "num_edges": int(indices.size)}
    start = time.perf_counter()
    pre = PreSampler(indptr, indices, FANOUTS, seed=0)
    out["presample_build_s"] = time.perf_counter() - start
    out["presample_bytes"] = int(pre._res.nbytes)
    timed(pre.sample, warm)
    out["presample"] = summary(timed(pre.sample, seeds))
    del pre
    on_memory = NeighborSampler(memory, FANOUTS, seed=0)
    timed(on_memory.sample, warm)
    out["ondemand_memory"] = summary(timed(on_memory.sample, seeds))
    on_mmap = NeighborSampler(open_graph_store(store, backend="mmap"), FANOUTS, seed=0)
    drop_page_cache(store)
    out["ondemand_mmap"] = summary(timed(on_mmap.sample, seeds))
    if server is not None:
        url = f"s3://{server.bucket}/{name}"
        publish(store, url, options=server.options(), progress=False)
        remote = OnDemandSampler(RemoteCSR(open_blobs(url, server.options())), FANOUTS, seed=0)
        timed(remote.sample, warm)
        out["ondemand_remote"] = summary(timed(remote.sample, seeds))
    if capped:
        csr_bytes = indptr.nbytes + indices.nbytes
        out["ondemand_mmap_capped"] = capped_mmap(store, seeds, csr_bytes // 4)
    for arm in [
        k for k in out if k.startswith(("presample", "ondemand")) and isinstance(out[k], dict)
    ]:
        s = out[arm]
        print(
            f"[{name}] {arm:20s} p50 {s['p50_ms']:8.3f} ms  p99 {s['p99_ms']:8.3f} ms  "
            f"(first 10%: p99 {s['cold_p99_ms']:8.3f} ms)  {s['requests']} requests"
        )
    return out


def capped_mmap(store: Path, seeds: np.ndarray, limit: int) -> dict:
    """The mmap arm in a child process inside a memory cgroup of ``limit`` bytes."""
    work = store.parent
    np.save(work / "seeds.npy", seeds)
    group = MemoryCgroup(f"bench-{os.getpid()}-mmap", limit)
    try:
        drop_page_cache(store)
        child = [sys.executable, __file__, "--child", str(store), str(group.path)]
        run = subprocess.run(child, capture_output=True, text=True, timeout=1800)
        if run.returncode != 0:
            raise RuntimeError(f"capped mmap arm failed ({run.returncode}): {run.stderr[-2000:]}")
        out = summary(np.load(work / "latencies.npy"))
        peak, kills = group.max_usage_bytes, group.oom_kills
        out |= {"limit_bytes": limit, "peak_bytes": peak, "oom_kills": kills}
        return out
    finally:
        group.remove()


def child(store: Path, cgroup: Path) -> None:
    """``--child``: compile on a small mmap graph, join ``cgroup``, then measure the seeds."""
    work = store.parent
    seeds = np.load(work / "seeds.npy")
    tiny = work / "tiny"
    edges = np.array([[1, 2, 0], [0, 1, 2]])
    write_store(GraphData("tiny", 3, edges, np.zeros((3, 1), np.float32)), tiny)
    NeighborSampler(open_graph_store(tiny, "mmap"), FANOUTS, seed=0).sample(np.array([0]))
    sampler = NeighborSampler(open_graph_store(store, "mmap", check_structure=False), FANOUTS, 0)
    (cgroup / "cgroup.procs").write_text(str(os.getpid()))
    np.save(work / "latencies.npy", timed(sampler.sample, seeds))


def rmat_store(work: Path) -> Path:
    """An R-MAT graph of 2^20 nodes and 16M edges (1-dim features: sampling reads none)."""
    out = work / "rmat"
    write_store(rmat(2**20, 16_000_000, feature_dim=1, seed=0), out)
    return out


def main() -> None:
    if sys.argv[1:2] == ["--child"]:
        child(Path(sys.argv[2]), Path(sys.argv[3]))
        return
    args = parse_args(__doc__, "smoke run: 300 requests per arm, no R-MAT")
    requests = 300 if args.quick else 2_500
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        with ObjectStoreServer.start(work / "seaweed", bucket="bench") as server:
            for name in ("fb100_cornell5", "soc_epinions1"):
                store = make_store(name, work)
                results[name] = run_dataset(name, store, server, requests, capped=False)
        if not args.quick:
            results["rmat"] = run_dataset("rmat", rmat_store(work), None, requests, capped=True)
    out = write_results(
        result_name("presample_backends", args.quick),
        {"environment": environment(), "fanouts": FANOUTS, "quick": args.quick, "results": results},
    )
    print(f"wrote {out}")
    targets = Targets()
    for name, res in results.items():
        pre = res["presample"]["p99_ms"]
        for arm in ("ondemand_mmap", "ondemand_remote", "ondemand_mmap_capped"):
            if arm in res:
                targets.check(f"{name}_{arm}_over_presample_p99", res[arm]["p99_ms"] / pre, 3.0)
    targets.print()


if __name__ == "__main__":
    main()
