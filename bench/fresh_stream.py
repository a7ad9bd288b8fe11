"""bench/fresh.py's stream sections (issue 29 parts 2-4): the PE refresher behind a live update
stream, and the answer cache on a Zipf-skewed request stream with updates.

``stream``: a DynamicStore over the graph (update log on local disk, fsync never), PEs from a
full precompute, a :class:`PeRefresher`; a writer applies batches of ``batch`` random new edges
at ``rate`` edges/s for ``seconds`` (paced: a batch every batch/rate s; if a commit takes longer
the stream falls behind, recorded). Per batch: its freshness lag, commit to the publication of
a PE version that includes it. Then, the stream stopped and the refresher caught up: the
refreshed PEs against a full precompute of the graph at that version (max abs difference), and
the answers to new-node requests (SRPE gamma 0.1 and PE mode) from each (max abs logit
difference, argmax agreement). ``isolated``: one batch at a time, refresh ms vs full precompute
ms (the ratio the issue targets at 100 edges on R-MAT).

``cache``: two engines over copies of the same store (full-neighbourhood SAGE), one with
``--result-cache``: the same stream of single-node requests (Zipf 1.1 over a random node order)
with a batch of ``batch`` new edges every ``every`` requests, sent to both in lockstep; hit
rate, latency p50/p99 of each arm, and every cached answer against the uncached arm's answer at
the same version (max abs difference).
"""

from __future__ import annotations

import shutil
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from gnnserve.config import ServeConfig
from gnnserve.dynamic.store import DynamicStore
from gnnserve.embeddings.chunked import ChunkedEmbeddings
from gnnserve.embeddings.precompute import precompute_embeddings
from gnnserve.embeddings.refresher import PeRefresher
from gnnserve.engine.loader import build_engine
from gnnserve.features import open_feature_store
from gnnserve.graph import open_graph_store
from gnnserve.models.checkpoint import save_checkpoint
from gnnserve.models.zoo import GNN, ModelConfig
from gnnserve.newnodes.inference import NewNodeInference
from gnnserve.newnodes.parse import parse_new_nodes


def _pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def _full(model: GNN, store: DynamicStore) -> tuple[Any, float]:
    start = time.perf_counter()
    pes = precompute_embeddings(
        model, store.graph, store.features, model_version="m", progress=False
    )
    return pes, time.perf_counter() - start


def _open(store_dir: Path, log: Path, model: GNN) -> tuple[DynamicStore, PeRefresher, float]:
    store = DynamicStore(
        open_graph_store(store_dir), open_feature_store(store_dir), log, fsync="never"
    )
    pes, full_s = _full(model, store)
    layers = [pes.layer(i) for i in range(1, pes.num_layers + 1)]
    refresher = PeRefresher(model, store, ChunkedEmbeddings.from_layers(pes.meta, layers))
    return store, refresher, full_s


def _edge_batch(rng: np.random.Generator, n: int, size: int) -> list[dict[str, int]]:
    pairs = rng.integers(0, n, (size, 2))
    return [{"op": "add_edge", "src": int(a), "dst": int(b)} for a, b in pairs]


def isolated(model: GNN, store_dir: Path, work: Path, sizes: tuple[int, ...], batches: int) -> dict:
    """Refresh ms per batch, one batch at a time, vs a full precompute."""
    store, refresher, full_s = _open(store_dir, work / "iso.log", model)
    rng, out = np.random.default_rng(2), {}
    try:
        for size in sizes:
            ms = []
            for _ in range(batches):
                store.apply(_edge_batch(rng, store.graph.num_nodes, size))
                assert refresher.wait_for(store.graph.seq, 600) is not None
                ms.append(refresher.stats.last_ms)
            out[str(size)] = {
                "refresh_ms": ms,
                "full_precompute_ms": full_s * 1e3,
                "full_over_refresh": full_s * 1e3 / float(np.median(ms)),
            }
            print(
                f"[fresh] isolated {size} edges: refresh {np.median(ms):.0f} ms, "
                f"full {full_s * 1e3:.0f} ms",
                flush=True,
            )
    finally:
        refresher.close()
        store.close()
    return out


def stream(
    model: GNN, store_dir: Path, work: Path, rate: float, batch: int, seconds: float
) -> dict[str, Any]:
    """One paced stream (module doc)."""
    store, refresher, _ = _open(store_dir, work / f"s{rate:g}.log", model)
    rng = np.random.default_rng(int(rate))
    committed: dict[int, float] = {}
    published: dict[int, float] = {}
    done = threading.Event()

    def watch() -> None:
        seq = 1
        while not (done.is_set() and seq > max(committed, default=0)):
            if refresher.wait_for(seq, 0.5) is not None:
                now = time.perf_counter()
                for s in range(seq, refresher.current().seq + 1):
                    published.setdefault(s, now)
                seq = refresher.current().seq + 1

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    start, behind = time.perf_counter(), 0.0
    try:
        k = 0
        while time.perf_counter() - start < seconds:
            due = start + k * batch / rate
            wait = due - time.perf_counter()
            if wait > 0:
                time.sleep(wait)
            else:
                behind = max(behind, -wait)
            store.apply(_edge_batch(rng, store.graph.num_nodes, batch))
            committed[store.graph.seq] = time.perf_counter()
            k += 1
        done.set()
        watcher.join(600)
        lags = [(published[s] - t) * 1e3 for s, t in committed.items() if s in published]
        row: dict[str, Any] = {
            "edges_per_s": rate, "batch_edges": batch, "batches": len(committed),
            "max_behind_schedule_ms": behind * 1e3,
            "lag_ms_p50": _pct(lags, 50), "lag_ms_p99": _pct(lags, 99),
            "refreshes": refresher.stats.refreshes,
            "batches_per_refresh": refresher.stats.batches / max(1, refresher.stats.refreshes),
        }  # fmt: skip
        row |= _answers(model, store, refresher)
    finally:
        done.set()
        refresher.close()
        store.close()
    print(
        f"[fresh] stream {rate:g} edges/s: lag p50 {row['lag_ms_p50']:.0f} ms, "
        f"p99 {row['lag_ms_p99']:.0f} ms, {row['batches_per_refresh']:.1f} batches/refresh, "
        f"PE diff {row['pe_max_abs_diff']:.2g}",
        flush=True,
    )
    return row


def _answers(model: GNN, store: DynamicStore, refresher: PeRefresher) -> dict[str, Any]:
    """Refreshed PEs and new-node answers from them vs a full precompute at the same version."""
    got = refresher.current()
    assert got.seq == store.graph.seq
    full, _ = _full(model, store)
    n = store.graph.num_nodes
    diff = max(
        float(np.abs(got.pes.get(layer, np.arange(n)).numpy() - full.layer(layer)).max())
        for layer in range(1, full.num_layers + 1)
    )
    rng = np.random.default_rng(7)
    dim = store.features.dim
    out: dict[str, Any] = {"pe_max_abs_diff": diff}
    for mode in ("srpe", "pe"):
        logit_diff, agree = 0.0, []
        for _ in range(20):
            m = 4
            features = rng.standard_normal((m, dim)).astype(np.float32)
            edges = np.stack([rng.integers(0, m, 12), rng.integers(0, n, 12)], 1)
            new = parse_new_nodes(features, edges, None, num_nodes=n, feature_dim=dim)
            a = NewNodeInference(model, store.graph, store.features, got.pes).run(new, mode)
            b = NewNodeInference(model, store.graph, store.features, full).run(new, mode)
            logit_diff = max(logit_diff, float((a.logits - b.logits).abs().max()))
            agree.append(float((a.logits.argmax(1) == b.logits.argmax(1)).float().mean()))
        out[f"new_node_{mode}_max_abs_logit_diff"] = logit_diff
        out[f"new_node_{mode}_argmax_agreement"] = float(np.mean(agree))
    return out


def cache(
    store_dir: Path, work: Path, requests: int, every: int, batch: int, mb: float
) -> dict[str, Any]:
    """The answer cache on a Zipf request stream with updates (module doc)."""
    torch.manual_seed(0)
    features = open_feature_store(store_dir)
    config = ModelConfig("sage", in_dim=features.dim, hidden_dim=64, out_dim=4, num_layers=2)
    save_checkpoint(work / "ckpt", GNN(config), config, {"note": "fresh bench"})
    engines = []
    for arm, cache_mb in (("plain", 0.0), ("cached", mb)):
        copy = work / f"store_{arm}"
        shutil.copytree(store_dir, copy)
        settings = {
            "store.path": str(copy), "model_path": str(work / "ckpt"),
            "sampler.fanouts": [-1, -1], "store.update_log": str(work / f"{arm}.log"),
            "store.fsync": "never", "compute.result_cache_mb": cache_mb,
        }  # fmt: skip
        engines.append(build_engine(ServeConfig.load(None, **settings)).start())
    plain, cached = engines
    n = plain.graph.num_nodes
    rng = np.random.default_rng(3)
    order = rng.permutation(n)
    ranks = np.minimum(rng.zipf(1.1, requests), n) - 1
    lat: dict[str, list[float]] = {"plain": [], "cached": []}
    worst = 0.0
    try:
        for i, rank in enumerate(ranks):
            if i and i % every == 0:
                ops = _edge_batch(rng, n, batch)
                plain.apply_updates(ops)
                cached.apply_updates(ops)
            node = [int(order[rank])]
            answers = []
            for name, engine in (("plain", plain), ("cached", cached)):
                t0 = time.perf_counter()
                answers.append(engine.predict(node, "probs"))
                lat[name].append((time.perf_counter() - t0) * 1e3)
            assert (
                answers[0].graph_version.rsplit(".", 1)[1]
                == answers[1].graph_version.rsplit(".", 1)[1]
            )
            worst = max(worst, float((answers[0].values - answers[1].values).abs().max()))
        stats = cached.answer_cache.stats if cached.answer_cache else None
        assert stats is not None
        row = {
            "requests": requests, "update_every": every, "batch_edges": batch, "cache_mb": mb,
            "hit_rate": stats.hits / max(1, stats.hits + stats.misses),
            "invalidated_nodes": stats.invalidated_nodes, "dropped": stats.dropped,
            "plain_ms_p50": _pct(lat["plain"], 50), "plain_ms_p99": _pct(lat["plain"], 99),
            "cached_ms_p50": _pct(lat["cached"], 50), "cached_ms_p99": _pct(lat["cached"], 99),
            "max_abs_diff_vs_plain": worst,
        }  # fmt: skip
    finally:
        for engine in engines:
            engine.stop()
    print(
        f"[fresh] cache: hit rate {row['hit_rate']:.2f}, p50 {row['plain_ms_p50']:.2f} -> "
        f"{row['cached_ms_p50']:.2f} ms, max diff {worst:.2g}",
        flush=True,
    )
    return row
