"""What an extra `serve --workers` process costs the machine's memory: the store again, or not?

Two stores: an R-MAT graph of 2^20 nodes, 16M edges and 64-dim features (~330 MB) and a
2^10-node one of the same shape (a process's own memory with almost no store). Each is served
by `gnnserve serve --workers 1` and `--workers 2` (interleaved, 3 rounds); once ready, every
worker answers full-neighbourhood requests over all nodes, so each has touched every page of
the graph and features; then the proportional set size (PSS, /proc/<pid>/smaps_rollup: a page
shared by k processes counts 1/k in each) of the supervisor and its workers is summed. The
growth from 1 to 2 workers on the large store, less that on the small one (a second Python with
torch and a model, whatever the store), is what the extra worker adds because of the store:
the target is <= 10% of the store's bytes.

    python bench/workers_memory.py           # results/workers_memory.json (~4 min)
    python bench/workers_memory.py --quick   # 1 round, 2^18 nodes
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np
import psutil
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import result_name, write_results  # noqa: E402
from gnnserve.data import generators  # noqa: E402
from gnnserve.data.writer import write_store  # noqa: E402
from gnnserve.demo import start_server, stop_server, wait_ready  # noqa: E402
from gnnserve.models.checkpoint import save_checkpoint  # noqa: E402
from gnnserve.models.zoo import GNN, ModelConfig  # noqa: E402
from gnnserve.ports import free_port  # noqa: E402

TARGET = 0.10  # of the store's bytes, per extra worker
FEATURES = 64


def _pss_kb(root: int) -> int:
    """PSS (kB) of process ``root`` and its descendants."""
    total = 0
    procs = [psutil.Process(root)]
    procs += procs[0].children(recursive=True)
    for proc in procs:
        for line in Path(f"/proc/{proc.pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                total += int(line.split()[1])
    return total


def _serve(store: Path, ckpt: Path, workers: int, nodes: int) -> int:
    """PSS (kB) of a `serve --workers N` once every worker has read every node's rows."""
    port = free_port()
    flags = ["--workers", str(workers), "--fanouts=-1", "--max-nodes", "4096"]
    proc = start_server(store, ckpt, port, *flags)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, proc, timeout_s=600)
        ids = np.arange(nodes)
        with httpx.Client(timeout=120) as client:
            # fresh connections: the kernel spreads them over the workers; enough passes that
            # each worker sees every chunk (the answers are not checked: this reads memory)
            for _ in range(3 * workers):
                for chunk in np.array_split(ids, max(1, nodes // 4096)):
                    r = client.post(f"{url}/v1/predict", json={"nodes": chunk.tolist()},
                                    headers={"Connection": "close"})  # fmt: skip
                    r.raise_for_status()
        time.sleep(2.0)
        return _pss_kb(proc.pid)
    finally:
        stop_server(proc, timeout_s=120)


def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--quick", action="store_true", help="1 round on 2^18 nodes")
    opts = p.parse_args()
    rounds, log2 = (1, 18) if opts.quick else (3, 20)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        torch.manual_seed(0)
        config = ModelConfig(arch="sage", in_dim=FEATURES, hidden_dim=64, out_dim=8, num_layers=1)
        ckpt = work / "sage"
        save_checkpoint(ckpt, GNN(config), config, {"note": "memory benchmark"})
        stores = {}
        for name, n in (("large", 2**log2), ("small", 2**10)):
            data = generators.rmat(num_nodes=n, num_edges=16 * n, feature_dim=FEATURES)
            write_store(data, work / name)
            size = sum(f.stat().st_size for f in (work / name).rglob("*") if f.is_file())
            stores[name] = {"nodes": n, "bytes": size, "pss_kb": {"1": [], "2": []}}
        for r in range(rounds):
            for name, info in stores.items():
                for workers in (1, 2) if r % 2 == 0 else (2, 1):
                    pss = _serve(work / name, ckpt, workers, info["nodes"])
                    info["pss_kb"][str(workers)].append(pss)
                    print(f"round {r + 1} {name} workers {workers}: PSS {pss / 1024:.0f} MB",
                          flush=True)  # fmt: skip
    growth = {
        name: float(np.median(np.subtract(s["pss_kb"]["2"], s["pss_kb"]["1"]))) * 1024
        for name, s in stores.items()
    }
    due_to_store = growth["large"] - growth["small"]
    share = due_to_store / stores["large"]["bytes"]
    out = write_results(
        result_name("workers_memory", opts.quick),
        {
            "rounds": rounds,
            "stores": stores,
            "extra_worker_growth_bytes_median": growth,
            "extra_worker_store_bytes": due_to_store,
            "extra_worker_store_share": share,
            "target_share": TARGET,
            "wall_s": round(time.perf_counter() - t0, 1),
        },
    )
    mb = stores["large"]["bytes"] / 2**20
    print(f"the large store is {mb:.0f} MB; a second worker adds {growth['large'] / 2**20:.0f} MB "
          f"there, {growth['small'] / 2**20:.0f} MB on the small store: "
          f"{due_to_store / 2**20:.1f} MB for the store = {share:.3f} of it "
          f"(target <= {TARGET})")  # fmt: skip
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
