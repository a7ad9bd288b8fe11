"""Fograph's profiler (§III-B): per fog node, a linear latency model of a subgraph's cardinality,
fitted offline on calibration subgraphs, rescaled online by a load factor.

A subgraph's cardinality is ``c = <|V|, |N_V|>``: its vertices and their one-hop in-neighbours
outside it (the halo a node must receive to compute V). The model (Eq. 3) is
``omega(c) = beta_v |V| + beta_n |N_V| + eps`` in milliseconds, fitted by least squares on the
mean latency of calibration subgraphs (uniformly sampled vertex sets of several sizes, 20 per
size to keep the degree distribution). Online, a round's measured time against the model gives
the load factor ``eta = T_real / omega(c)``, and every other cardinality is predicted as
``eta * omega(c')``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from gnnserve.errors import InvalidInputError

SAMPLES_PER_SIZE = 20  # calibration subgraphs per cardinality (Fograph §III-B)


@dataclass(frozen=True)
class LatencyModel:
    """omega(c) = beta_v |V| + beta_n |N_V| + eps, in ms; ``eta`` scales it (load factor)."""

    beta_v: float  # ms per vertex
    beta_n: float  # ms per halo vertex
    eps: float  # ms, fixed cost of a round
    eta: float = 1.0  # measured / predicted time of the latest round (1: unloaded)

    def predict(self, vertices: float | np.ndarray, halo: float | np.ndarray) -> np.ndarray:
        """Predicted ms for subgraphs of ``vertices`` vertices and ``halo`` halo vertices."""
        base = self.beta_v * np.asarray(vertices, float) + self.beta_n * np.asarray(halo, float)
        return self.eta * (base + self.eps)

    def observed(self, vertices: int, halo: int, real_ms: float) -> LatencyModel:
        """This model with the load factor of a round that took ``real_ms`` (Fograph's
        two-step online estimate: eta = T_real / omega(c) on the unloaded model)."""
        unloaded = float(LatencyModel(self.beta_v, self.beta_n, self.eps).predict(vertices, halo))
        if not np.isfinite(real_ms) or real_ms < 0:
            raise InvalidInputError(f"a round's time must be finite and >= 0, got {real_ms}", "ms")
        eta = real_ms / unloaded if unloaded > 0 else 1.0
        return LatencyModel(self.beta_v, self.beta_n, self.eps, eta)


def halo_sizes(
    indptr: np.ndarray, indices: np.ndarray, membership: np.ndarray, parts: int | None = None
) -> np.ndarray:
    """int64 [parts]: per part p of ``membership`` (vertex -> part), the distinct in-neighbours
    of its vertices that lie in another part (|N_V| of the part)."""
    membership = np.asarray(membership, np.int64)
    dst = np.repeat(np.arange(membership.size), np.diff(indptr))
    src = np.asarray(indices, np.int64)
    cross = membership[src] != membership[dst]
    pairs = np.unique(membership[dst[cross]] * membership.size + src[cross])
    if parts is None:
        parts = int(membership.max()) + 1 if membership.size else 0
    return np.bincount(pairs // max(membership.size, 1), minlength=parts).astype(np.int64)


def rows_sent(
    indptr: np.ndarray, indices: np.ndarray, membership: np.ndarray, parts: int
) -> np.ndarray:
    """int64 [parts]: per part, the rows it sends in each layer's boundary exchange: its
    vertices that another part holds as halo, once per part that holds them."""
    membership = np.asarray(membership, np.int64)
    n = membership.size
    dst = np.repeat(np.arange(n), np.diff(indptr))
    src = np.asarray(indices, np.int64)
    cross = membership[src] != membership[dst]
    pairs = np.unique(membership[dst[cross]] * n + src[cross])
    return np.bincount(membership[pairs % max(n, 1)], minlength=parts).astype(np.int64)


def cardinality(indptr: np.ndarray, indices: np.ndarray, vertices: np.ndarray) -> tuple[int, int]:
    """(|V|, |N_V|) of the vertex set ``vertices`` (distinct ids)."""
    n = indptr.size - 1
    member = np.ones(n, np.int64)
    member[np.asarray(vertices, np.int64)] = 0
    return int(np.asarray(vertices).size), int(halo_sizes(indptr, indices, member)[0])


def calibration_sets(
    num_nodes: int, sizes: list[int], rng: np.random.Generator, per_size: int = SAMPLES_PER_SIZE
) -> list[np.ndarray]:
    """``per_size`` uniformly sampled vertex sets (int64, distinct) of every size in ``sizes``."""
    if not sizes or min(sizes) < 1 or max(sizes) > num_nodes:
        raise InvalidInputError(f"calibration sizes must lie in [1, {num_nodes}]", "sizes")
    return [
        np.sort(rng.choice(num_nodes, size, replace=False))
        for size in sizes
        for _ in range(per_size)
    ]


def fit_latency(cardinalities: np.ndarray, latency_ms: np.ndarray) -> LatencyModel:
    """Least-squares fit of Eq. 3 to rows ``(|V|, |N_V|)`` and their measured ms."""
    cards = np.asarray(cardinalities, float).reshape(-1, 2)
    y = np.asarray(latency_ms, float)
    if cards.shape[0] != y.size or y.size < 3:
        raise InvalidInputError("need at least 3 (cardinality, latency) pairs of equal count", "ms")
    if not np.all(np.isfinite(y)):
        raise InvalidInputError("calibration latencies must be finite", "ms")
    design = np.column_stack([cards, np.ones(y.size)])
    (beta_v, beta_n, eps), *_ = np.linalg.lstsq(design, y, rcond=None)
    return LatencyModel(float(beta_v), float(beta_n), float(eps))


def time_together(cores: list[float | None], hosts: list[str | None] | None, cpus: float) -> bool:
    """Whether the nodes can be timed on the calibration subgraphs all at once without changing
    any node's time: each on a machine of its own (distinct ``hosts``), or each under a CPU quota
    (``cores``; None: no quota) and the quotas together within this machine's ``cpus``, so every
    node still gets its whole quota. Otherwise they are timed one at a time."""
    if hosts is not None and all(hosts):
        return len(set(hosts)) == len(hosts)
    if any(c is None for c in cores):
        return False
    return sum(c for c in cores if c is not None) <= cpus


def profile_cluster(
    time_all: Callable[[np.ndarray], list[float]],
    indptr: np.ndarray,
    indices: np.ndarray,
    sizes: list[int],
    rng: np.random.Generator,
    per_size: int = SAMPLES_PER_SIZE,
) -> tuple[list[LatencyModel], np.ndarray]:
    """Calibrate every node on the same subgraphs: ``time_all(vertices)`` runs the model on that
    subgraph on each node (one at a time) and returns their ms. Returns (a fitted model per
    node, each node's compute ms per vertex: mean ms over size on the largest subgraphs)."""
    sets = calibration_sets(indptr.size - 1, sizes, rng, per_size)
    cards = np.array([cardinality(indptr, indices, s) for s in sets], dtype=np.int64)
    ms = np.array([time_all(s) for s in sets], dtype=float)  # [sets, nodes]
    largest = [i for i, s in enumerate(sets) if s.size == sets[-1].size]
    per_vertex = np.maximum(ms[largest].mean(axis=0), 1e-6) / sets[-1].size
    return [fit_latency(cards, ms[:, j]) for j in range(ms.shape[1])], per_vertex
