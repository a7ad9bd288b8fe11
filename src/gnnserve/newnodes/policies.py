"""Recomputation policies of SRPE (OMEGA §5.2): which candidate PEs to recompute.

Candidates are the existing nodes that receive an edge from a query node (for undirected edges:
the query nodes' existing direct neighbours); their precomputed embeddings miss the query's
messages. A policy scores every candidate and the top ``ceil(gamma * |candidates|)`` are
recomputed (ties broken by node id, so every process picks the same set).

- ``query_edges_ratio`` (default): ``|N_Q(u)| / |N(u)|`` with ``N(u)`` counting the query edges;
  OMEGA's approximation of the variance-optimal probabilities of Theorem 1.
- ``importance``: ``IS(u) = 1/deg(u) * sum_{w in N(u)} 1/deg(w)`` on the stored graph.
- ``random``: uniform scores from a seeded generator.
- ``oracle``: the true approximation error ``sum_l ||f_u^(l) - p_u^(l)||`` (evaluation only).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from gnnserve.errors import InvalidInputError, echo
from gnnserve.registry import Registry
from gnnserve.sampling.sampler import seed_bits

DEFAULT_POLICY = "query_edges_ratio"
SEED_MIN, SEED_MAX = -(1 << 63), (1 << 64) - 1  # a seed is any 64-bit integer, signed or not


@dataclass(frozen=True)
class Candidates:
    """Recomputation candidates of one request, sorted by node id."""

    nodes: np.ndarray  # int64 [c] existing node ids that receive at least one query edge
    query_edges: np.ndarray  # int64 [c] |N_Q(u)|: edges into u from query nodes
    degree: np.ndarray  # int64 [c] in-degree of u in the stored graph (query edges excluded)

    @property
    def count(self) -> int:
        """c: number of candidates."""
        return int(self.nodes.size)


@dataclass(frozen=True)
class PolicyInputs:
    """Side information some policies need; ``None`` where a policy does not use it."""

    importance: np.ndarray | None = None  # float64 [N] importance score of every node
    errors: np.ndarray | None = None  # float64 [c] true PE error per candidate (oracle)
    seed: int = 0  # random policy seed


POLICIES: Registry[np.ndarray] = Registry("recompute_policy")


@POLICIES.register("query_edges_ratio")
def _query_edges_ratio(cands: Candidates, inputs: PolicyInputs) -> np.ndarray:
    total = cands.degree + cands.query_edges
    return cands.query_edges / np.maximum(total, 1)


@POLICIES.register("importance")
def _importance(cands: Candidates, inputs: PolicyInputs) -> np.ndarray:
    if inputs.importance is None:
        raise InvalidInputError("the importance policy needs importance scores", "policy")
    return np.asarray(inputs.importance, dtype=np.float64)[cands.nodes]


@POLICIES.register("random")
def _random(cands: Candidates, inputs: PolicyInputs) -> np.ndarray:
    return np.random.default_rng(seed_bits(inputs.seed)).random(cands.count)


@POLICIES.register("oracle")
def _oracle(cands: Candidates, inputs: PolicyInputs) -> np.ndarray:
    if inputs.errors is None or len(inputs.errors) != cands.count:
        raise InvalidInputError("the oracle policy needs one true error per candidate", "policy")
    return np.asarray(inputs.errors, dtype=np.float64)


def check_gamma(gamma: object) -> float:
    """``gamma`` as a float in [0, 1], else InvalidInputError naming ``gamma``."""
    if isinstance(gamma, bool) or not isinstance(gamma, int | float) or not 0.0 <= gamma <= 1.0:
        raise InvalidInputError(f"gamma must be a number in [0, 1], got {echo(gamma)}", "gamma")
    return float(gamma)


def check_policy(policy: object) -> str:
    """``policy`` when it names one of :data:`POLICIES`, else InvalidInputError naming it."""
    if not isinstance(policy, str) or policy not in POLICIES.names():
        raise InvalidInputError(
            f"unknown policy {echo(policy)}; choose one of {POLICIES.names()}", "policy"
        )
    return policy


def budget(gamma: float, count: int) -> int:
    """Number of candidates recomputed: ceil(gamma * count)."""
    return min(count, math.ceil(check_gamma(gamma) * count - 1e-9))


def select_targets(
    policy: str, gamma: float, cands: Candidates, inputs: PolicyInputs | None = None
) -> np.ndarray:
    """Sorted int64 ids of the candidates ``policy`` recomputes under budget ``gamma``."""
    k = budget(gamma, cands.count)
    if k == 0:
        return np.empty(0, np.int64)
    if k == cands.count:
        return np.array(cands.nodes, dtype=np.int64)
    scores = POLICIES.create(policy, cands, inputs or PolicyInputs())
    order = np.lexsort((cands.nodes, -scores))  # highest score first, then lowest id
    return np.sort(cands.nodes[order[:k]]).astype(np.int64)


def importance_scores(degree: np.ndarray, indptr: np.ndarray, indices: np.ndarray) -> np.ndarray:
    """float64 [N] ``IS(v) = 1/deg(v) * sum_{u in N(v)} 1/deg(u)`` from an in-neighbour CSR."""
    deg = np.asarray(degree, dtype=np.float64)
    inv = np.divide(1.0, deg, out=np.zeros_like(deg), where=deg > 0)
    dst = np.repeat(np.arange(deg.size), np.diff(indptr))
    sums = np.bincount(dst, weights=inv[np.asarray(indices)], minlength=deg.size)
    return sums * inv
