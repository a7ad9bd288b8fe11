"""Quiver §4.2 / §6 Fig. 10 on this machine: calibration, PSGS-bounded batching, hybrid routing.

Three sections for bench/quiver.py, each returning a JSON-able dict:

- :func:`run_calibration`: ``gnnserve calibrate``'s code (``engine.planner.calibrate``) on a
  store + checkpoint; profile JSON + PNG under ``work``; curves and the four crossover points.
- :func:`run_slo`: PSGS-Strict vs PSGS-Loose vs fixed ``batcher.max_batch_nodes`` bounds, **open
  loop** (Poisson arrivals): the share of requests answered within ``slo_ms`` of their arrival
  at ``LOAD_RPS``, and each arm's throughput with >= 99% of requests within the SLO (capacity
  searched as in run_routing). Then Quiver's own measures (§6, Fig. 10): each arm's throughput
  (the highest rate it keeps up with, whatever the latency: :func:`sustains`) and its share
  within the SLO at 80% of that throughput; Loose trades the SLO share for that throughput.
  Requests mix 1, 16 and 128 nodes (``MIX``), seeds drawn with probability proportional to
  out-degree (Quiver's workload); refused or failed requests count as over the SLO. The *best
  fixed bound* is the candidate with the highest 99%-within throughput. (A
  closed loop cannot test an SLO: by Little's law its mean latency is clients / throughput
  whatever the bound; an earlier closed-loop version measured 52% within 10 ms for every arm.)
- :func:`run_routing`: ``sampler.routing`` latency / throughput (threshold from the profile) vs
  inline only (``sampler.parallel_threshold`` = 2^62: never parallel) vs parallel only (threshold
  1) on the same mix, **open loop** (Poisson arrivals from one generator thread): capacity = the
  highest rate whose p99 (nearest rank, from the scheduled send time; refused, failed or
  unanswered requests count as infinite) is <= ``P99_MS``, searched by ``common.find_capacity``
  (ladder x1.5 from the previous round's capacity of the arm, then bisection to 15%). The
  reported throughput is that capacity (offered req/s of the highest passing probe: with p99
  within the bound, at least 99% of its requests were answered; each probe's answered req/s is
  kept in ``capacity_search``).

Every arm builds its own engine (``gnnserve.engine.loader.build_engine``) and warms it up (and,
in run_routing, WARM_S of untimed open loop so both paths have run); rounds interleave the arms
(A B B A); medians with ranges. All arms of run_slo route at the profile's latency point.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from common import find_capacity, fmt_range, interleaved_rounds, median_range, ratios
from gnnserve.config import ServeConfig
from gnnserve.engine.loader import build_engine
from gnnserve.errors import GnnServeError
from gnnserve.graph import open_graph_store
from gnnserve.sampling.calibrate import CalibrationProfile, psgs_bound
from gnnserve.sampling.metrics import psgs
from gnnserve.sampling.paths import NEVER  # a parallel threshold no batch reaches

FANOUTS = [25, 10]  # calibrated and served (the serve default, as bench/quiver.py placement)
MIX = {1: 0.6, 16: 0.3, 128: 0.1}  # request size (nodes) -> share of requests
LOAD_RPS = 400.0  # run_slo's offered load: about half of what 8 closed-loop clients drew here
FIXED = (16, 64, 256, 1024)  # max_batch_nodes candidates of run_slo
P99_MS = 30.0  # run_routing's latency bound
PROBES = 5  # run_routing: a probe lasts window_s / PROBES, at least MIN_PROBE_S
MIN_PROBE_S = 1.0
WARM_S = 0.5  # run_routing: untimed open loop on each new engine before its capacity search


def log(msg: str) -> None:
    """One progress line, prefixed ``[quiver]``."""
    print(f"[quiver] {msg}", flush=True)


# pure helpers ---------------------------------------------------------------------------------
def degree_cdf(store: Path) -> np.ndarray:
    """Cumulative out-degree share per node (float64, last = 1): seeds drawn ∝ out-degree."""
    indptr, _ = open_graph_store(store).csr()
    deg = np.diff(np.asarray(indptr, dtype=np.int64)).astype(np.float64)
    if deg.sum() <= 0:
        deg = np.ones_like(deg)
    return np.cumsum(deg) / deg.sum()


def draw_request(rng: np.random.Generator, cdf: np.ndarray, mix: dict[int, float]) -> np.ndarray:
    """Node ids (int64) of one request: size drawn from ``mix``, nodes ∝ degree (``cdf``)."""
    sizes = np.fromiter(mix, dtype=np.int64)
    probs = np.fromiter(mix.values(), dtype=np.float64)
    size = int(rng.choice(sizes, p=probs / probs.sum()))
    ids = np.searchsorted(cdf, rng.random(size) * cdf[-1], side="right")
    return np.minimum(ids, cdf.size - 1).astype(np.int64)


def nearest_rank(latencies_ms: np.ndarray, q: float) -> float:
    """The ``q``-th percentile (0-100) by nearest rank; ``inf`` entries (failed) sort last."""
    v = np.sort(np.asarray(latencies_ms, dtype=np.float64))
    if v.size == 0:
        return math.inf
    return float(v[max(math.ceil(q / 100 * v.size), 1) - 1])


def read_profile(profile_path: Path) -> CalibrationProfile:
    """The calibration profile at ``profile_path`` (not checked against this machine)."""
    return CalibrationProfile.from_json(Path(profile_path).read_text(), str(profile_path))


def profile_fanouts(profile_path: Path) -> list[int]:
    """The fanouts a calibration profile was measured for."""
    return list(read_profile(profile_path).identity.fanouts)


def engine_for(store: Path, ckpt: Path, profile_path: Path, **settings: Any) -> Any:
    """A started, warmed-up engine for ``store``/``ckpt`` with the profile's fanouts."""
    base = {
        "store.path": str(store),
        "model_path": str(ckpt),
        "sampler.fanouts": profile_fanouts(profile_path),
        "sampler.calibration": str(profile_path),
        "admission.max_queue_requests": 10_000,
    }
    engine = build_engine(ServeConfig.load(None, **(base | settings)))
    engine.warm_up()
    return engine


def open_loop(engine: Any, cdf: np.ndarray, rate: float, window_s: float, seed: int) -> np.ndarray:
    """Latencies (ms from the scheduled send time; ``inf`` = refused/failed/unanswered in 30 s)
    of Poisson arrivals at ``rate`` req/s for ``window_s``."""
    return open_loop_due(engine, cdf, rate, window_s, seed)[1]


def sustains(engine: Any, cdf: np.ndarray, rate: float, window_s: float, seed: int) -> bool:
    """Whether the engine keeps up with ``rate`` (its throughput, whatever the latency): >= 99%
    of the requests answered, at >= 95% of the rate offered (the requests drawn over
    ``window_s``), counted until the last answer (a backlog that grows stretches that span)."""
    return kept_up(*open_loop_due(engine, cdf, rate, window_s, seed), window_s)


def kept_up(due: np.ndarray, latency_ms: np.ndarray, window_s: float) -> bool:
    """:func:`sustains`' verdict on one open-loop run: send times (s), latencies (ms, inf =
    not answered) over ``window_s``."""
    answered = np.isfinite(latency_ms)
    if answered.mean() < 0.99:
        return False
    span_s = max(float(np.max(due[answered] + latency_ms[answered] / 1e3)), window_s)
    return bool(answered.sum() / span_s >= 0.95 * due.size / window_s)


def open_loop_due(
    engine: Any, cdf: np.ndarray, rate: float, window_s: float, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """(scheduled send times in s from the start, latencies in ms as :func:`open_loop`)."""
    rng = np.random.default_rng(seed)
    count = max(int(rng.poisson(rate * window_s)), 1)
    due = np.sort(rng.uniform(0.0, window_s, count))
    requests = [engine.request(draw_request(rng, cdf, MIX)) for _ in range(count)]
    out = np.full(count, math.inf)
    futures = []

    def record(i: int, at: float) -> Callable[[Any], None]:
        def done(f: Any) -> None:
            if f.exception() is None:
                out[i] = (time.perf_counter() - at) * 1e3

        return done

    t0 = time.perf_counter()
    for i, request in enumerate(requests):
        at = t0 + due[i]
        wait = at - time.perf_counter()
        if wait > 0:
            time.sleep(wait)
        try:
            future = engine.submit(request)
        except GnnServeError:
            continue
        future.add_done_callback(record(i, at))
        futures.append(future)
    deadline = time.perf_counter() + 30.0
    for f in futures:
        try:
            f.exception(timeout=max(deadline - time.perf_counter(), 0.0))
        except TimeoutError:
            break
    return due, out.copy()


# 1. calibration -------------------------------------------------------------------------------
def run_calibration(store: Path, ckpt: Path, work: Path, quick: bool) -> dict[str, Any]:
    """Calibrate the inline and parallel paths on ``store`` with ``ckpt`` (FANOUTS, torch 1
    thread as serve); profile ``<work>/calibration_<graph>.json`` and its PNG. Full: 12 buckets
    x 10 runs up to 1024 seeds (the CLI defaults); quick: 8 x 5 up to 256."""
    from gnnserve.engine.planner import calibrate

    name = open_graph_store(store).meta.name or Path(store).name
    buckets, runs, max_seeds = (8, 5, 256) if quick else (12, 10, 1024)
    Path(work).mkdir(parents=True, exist_ok=True)
    log(f"calibrate {name}: {buckets} buckets x {runs} runs up to {max_seeds} seeds ...")
    start = time.perf_counter()
    profile, path, png = calibrate(
        store, ckpt, FANOUTS, Path(work) / f"calibration_{name}.json", buckets, runs, max_seeds,
        progress=lambda m: log(f"  {name} {m}"),
    )  # fmt: skip
    points = {k: None if math.isinf(v) else v for k, v in profile.points.items()}
    log(f"calibrate {name}: points (summed PSGS) {points}")
    return {
        "graph": name,
        "fanouts": FANOUTS,
        "buckets": buckets,
        "runs": runs,
        "max_seeds": max_seeds,
        "seconds": time.perf_counter() - start,
        "points": points,
        "curves": {
            p: {"psgs": c.psgs, "mean_ms": c.mean_ms, "max_ms": c.max_ms}
            for p, c in profile.curves.items()
        },
        "profile": str(path),
        "png": str(png),
    }


# 2. PSGS-bounded batching ---------------------------------------------------------------------
def slo_arms(slo_ms: float, fixed: tuple[int, ...]) -> dict[str, dict[str, Any]]:
    """Engine settings per arm: PSGS-Strict/Loose (node bound 4096: PSGS binds), fixed bounds.
    All route with the profile's latency point, so only the batch bound differs."""
    common = {"sampler.routing": "latency"}
    arms = {
        b: common | {"batcher.latency_slo_ms": slo_ms, "batcher.psgs_bound": b,
                     "batcher.max_batch_nodes": 4096}
        for b in ("strict", "loose")
    }  # fmt: skip
    for n in fixed:
        arms[f"fixed_{n}"] = common | {"batcher.max_batch_nodes": n}
    return arms


def psgs_bounds(profile_path: Path, slo_ms: float) -> dict[str, float]:
    """Summed-PSGS batch caps of PSGS-Strict (max curve) and -Loose (mean curve) at ``slo_ms``,
    routed at the profile's latency point (as the engine computes them)."""
    profile = read_profile(profile_path)
    point = profile.points["latency"]
    return {
        b: psgs_bound(profile, slo_ms, s, point) for b, s in (("strict", "max"), ("loose", "mean"))
    }


def run_slo(
    store: Path,
    ckpt: Path,
    profile_path: Path,
    rounds: int,
    window_s: float,
    slo_ms: float = 10.0,
    load_rps: float = LOAD_RPS,
    fixed: tuple[int, ...] = FIXED,
) -> dict[str, Any]:
    """PSGS-Strict, PSGS-Loose and fixed node bounds, open loop (Poisson arrivals): the share
    of requests answered within ``slo_ms`` of their arrival at ``load_rps``, and the throughput
    each sustains with >= 99% within the SLO (capacity searched with ``common.find_capacity``,
    probes of ``window_s / PROBES``). A closed loop cannot test an SLO: by Little's law its
    clients / throughput is the mean latency whatever the bound. ``targets``: rows for
    ``Targets.check(**row)``."""
    probe_s = max(window_s / PROBES, MIN_PROBE_S)
    cdf = degree_cdf(store)
    share: dict[str, list[float]] = {}
    start: dict[str, float] = {}
    throughput: dict[str, list[float]] = {}  # the rate each arm keeps up with (Quiver Fig. 10)
    share_at_80: dict[str, list[float]] = {}  # within the SLO at 80% of that throughput

    def arm(name: str, settings: dict[str, Any]) -> Callable[[], float]:
        def run() -> float:
            with engine_for(store, ckpt, profile_path, **settings) as engine:
                open_loop(engine, cdf, load_rps, WARM_S, seed=99)
                lat = open_loop(engine, cdf, load_rps, window_s / 2, seed=7)
                share.setdefault(name, []).append(float(np.mean(lat <= slo_ms)))

                def passes(rate: float) -> bool:
                    return bool(
                        np.mean(open_loop(engine, cdf, rate, probe_s, 11) <= slo_ms) >= 0.99
                    )

                cap = find_capacity(passes, start.get(name, load_rps), 1.5, 0.15, 10.0)

                def keeps_up(rate: float) -> bool:
                    return sustains(engine, cdf, rate, probe_s, 13)

                guess = float(np.median(throughput[name])) if name in throughput else load_rps
                most = find_capacity(keeps_up, guess, 1.5, 0.15, 10.0).rate
                throughput.setdefault(name, []).append(most)
                lat = open_loop(engine, cdf, 0.8 * most, window_s / 2, seed=17)
                share_at_80.setdefault(name, []).append(float(np.mean(lat <= slo_ms)))
            start[name] = max(cap.rate, 10.0)
            return cap.rate

        return run

    arms = slo_arms(slo_ms, fixed)
    rps = interleaved_rounds(
        {k: arm(k, v) for k, v in arms.items()},
        rounds,
        on_round=lambda r, v: log(f"slo round {r}: " + ", ".join(
            f"{k} {share[k][-1]:.1%} within at {load_rps:g}/s, {v[k]:.0f} req/s with 99% "
            f"within, throughput {throughput[k][-1]:.0f} req/s, {share_at_80[k][-1]:.1%} within "
            "at 80% of it" for k in v)),
    )  # fmt: skip
    fixed_names = [k for k in arms if k.startswith("fixed_")]
    best = max(fixed_names, key=lambda k: float(np.median(rps[k])))
    out: dict[str, Any] = {
        "workload": f"open loop (Poisson), sizes {MIX}; seeds ∝ degree; share within SLO at "
        f"{load_rps:g} req/s; throughput = highest rate with >= 99% within the SLO",
        "slo_ms": slo_ms,
        "load_rps": load_rps,
        "probe_s": probe_s,
        "within_slo": {k: median_range(v) for k, v in share.items()},
        "rps": {k: median_range(v) for k, v in rps.items()},
        "throughput_rps": {k: median_range(v) for k, v in throughput.items()},
        "within_slo_at_80pct_throughput": {k: median_range(v) for k, v in share_at_80.items()},
        "loose_over_strict_throughput": median_range(
            ratios(throughput["loose"], throughput["strict"])
        ),
        "psgs_bounds": psgs_bounds(profile_path, slo_ms),
        "best_fixed": best,
        "loose_over_strict_rps": median_range(ratios(rps["loose"], rps["strict"])),
        "strict_over_best_fixed_rps": median_range(ratios(rps["strict"], rps[best])),
        "loose_over_best_fixed_rps": median_range(ratios(rps["loose"], rps[best])),
    }
    for k in arms:
        within = fmt_range(out["within_slo"][k], ".3f")
        log(f"slo {k}: {fmt_range(out['rps'][k], '.0f', ' req/s')} with 99% within {slo_ms:g} ms; "
            f"{within} within at {load_rps:g}/s")  # fmt: skip
    out["targets"] = [
        {"name": "PSGS-Strict share within SLO at 80% of its throughput", "measured":
         out["within_slo_at_80pct_throughput"]["strict"]["median"], "goal": 0.99},
        {"name": "PSGS-Loose / Strict throughput (the rate each keeps up with)", "measured":
         out["loose_over_strict_throughput"]["median"], "goal": 1.3},
        {"name": f"PSGS-Strict share within SLO at {load_rps:g} req/s", "measured":
         out["within_slo"]["strict"]["median"], "goal": 0.99},
        {"name": "PSGS-Loose / Strict throughput (99% within SLO)", "measured":
         out["loose_over_strict_rps"]["median"], "goal": 1.3},
        {"name": f"PSGS-Strict / best fixed ({best}) throughput (99% within SLO)",
         "measured": out["strict_over_best_fixed_rps"]["median"], "goal": 1.0},
        {"name": f"PSGS-Loose / best fixed ({best}) throughput (99% within SLO)",
         "measured": out["loose_over_best_fixed_rps"]["median"], "goal": 1.0},
    ]  # fmt: skip
    return out


# 3. hybrid routing ----------------------------------------------------------------------------
ROUTING_ARMS: dict[str, dict[str, Any]] = {
    "hybrid_latency": {"sampler.routing": "latency"},
    "hybrid_throughput": {"sampler.routing": "throughput"},
    "inline": {"sampler.parallel_threshold": NEVER},
    "parallel": {"sampler.parallel_threshold": 1},
}


def same_as_single(point: float, cost: np.ndarray, max_batch_nodes: int) -> str | None:
    """The single path a hybrid routed at ``point`` (summed PSGS) runs for every batch, or None
    when batches fall on both sides: ``parallel`` when even the cheapest one-node batch reaches
    the point, ``inline`` when no batch of at most ``max_batch_nodes`` nodes can."""
    if not math.isfinite(point) or point > np.sort(cost)[-max_batch_nodes:].sum():
        return "inline"
    if point <= cost.min():
        return "parallel"
    return None


def run_routing(
    store: Path, ckpt: Path, profile_path: Path, rounds: int, window_s: float
) -> dict[str, Any]:
    """Throughput at p99 <= P99_MS of hybrid routing vs inline only vs parallel only (open
    loop, module docstring). A probe lasts ``window_s / PROBES`` (at least MIN_PROBE_S; a
    capacity search takes about PROBES probes: ~``window_s`` per arm and round). ``targets``:
    rows for ``Targets.check(**row)``."""
    probe_s = max(window_s / PROBES, MIN_PROBE_S)
    cdf = degree_cdf(store)
    profile = read_profile(profile_path)
    cost = psgs(open_graph_store(store), profile_fanouts(profile_path))
    max_batch = ServeConfig.load(None, **{"store.path": str(store)}).batcher.max_batch_nodes
    same = {  # a hybrid whose point routes every batch one way is that path: not run again
        k: same_as_single(profile.points[k.removeprefix("hybrid_")], cost, max_batch)
        for k in ("hybrid_latency", "hybrid_throughput")
    }
    for k, path in same.items():
        if path is not None:
            log(f"routing {k}: every batch of this workload goes {path}: not run (same arm)")
    arms = [k for k in ROUTING_ARMS if same.get(k) is None]
    start: dict[str, float] = {}
    detail: dict[str, list[dict[str, Any]]] = {k: [] for k in arms}

    def arm(name: str) -> Callable[[], float]:
        def run() -> float:
            answered: dict[float, float] = {}
            with engine_for(store, ckpt, profile_path, **ROUTING_ARMS[name]) as engine:
                open_loop(engine, cdf, start.get(name, 400.0), WARM_S, seed=99)  # both paths

                def passes(rate: float) -> bool:
                    lat = open_loop(engine, cdf, rate, probe_s, len(answered))
                    answered[rate] = float(np.isfinite(lat).sum() / probe_s)
                    return nearest_rank(lat, 99) <= P99_MS

                cap = find_capacity(passes, start.get(name, 400.0), 1.5, 0.15, 10.0)
            start[name] = max(cap.rate, 10.0)
            detail[name].append({"rate": cap.rate, "first_fail": cap.first_fail,
                                 "probes": cap.probes, "answered_rps": answered})  # fmt: skip
            return cap.rate

        return run

    rps = interleaved_rounds(
        {k: arm(k) for k in arms},
        rounds,
        on_round=lambda r, v: log(f"routing round {r}: req/s at p99 <= {P99_MS:g} ms " + ", ".join(
            f"{k} {x:.0f}" for k, x in v.items())),
    )  # fmt: skip
    single = [max(a, b) for a, b in zip(rps["inline"], rps["parallel"], strict=True)]
    hybrids = [k for k in ("hybrid_latency", "hybrid_throughput") if k in rps]
    out: dict[str, Any] = {
        "workload": f"open loop (Poisson), sizes {MIX}; seeds ∝ degree; p99 <= {P99_MS:g} ms",
        "probe_s": probe_s,
        "points": {k: profile.points[k.removeprefix("hybrid_")] for k in same},
        "hybrid_same_as": same,  # the single path a hybrid equals (None: it differs, was run)
        "rps": {k: median_range(v) for k, v in rps.items()},
        "capacity_search": detail,
        "over_best_single": {k: median_range(ratios(rps[k], single)) for k in hybrids},
    }
    for k in arms:
        log(f"routing {k}: {fmt_range(out['rps'][k], '.0f', ' req/s')} at p99 <= {P99_MS:g} ms")
    out["targets"] = [
        {"name": f"hybrid ({k.removeprefix('hybrid_')} point) / best single path, req/s at "
         f"p99 <= {P99_MS:g} ms", "measured": out["over_best_single"][k]["median"], "goal": 1.2}
        for k in hybrids
    ]  # fmt: skip
    return out
