"""Fograph's inference execution planner (IEP, §III-C, Algorithm 1).

Step 1: METIS (pymetis) cuts the graph into n min-cut parts, one per fog node (equal, as in
Fograph, or, beyond it, sized by target weights such as the nodes' profiled speeds, so that the
mapping has parts that fit unequal nodes). Step 2: each
(part k, fog j) pair costs, by Eq. 8, ``|P_k| phi / b_j + omega_j(P_k) + K delta`` (upload of the
part's features over the fog's link, its execution on the fog, K layer synchronisations), and
parts are mapped to fogs by a linear bottleneck assignment: the smallest threshold tau such that
the pairs costing at most tau hold a perfect matching (binary search over the sorted weights,
each probe a Hungarian matching: ``scipy.optimize.linear_sum_assignment``). Among the matchings
with that bottleneck the one of least total cost is returned. O(n^3 log n).

Baselines of Fograph's Fig. 8: METIS+Random (a random mapping) and METIS+Greedy (the parts,
largest first, in turn take the free fog that costs them least).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from scipy.optimize import linear_sum_assignment

from gnnserve.deploy.fog.partition import symmetric_adjacency
from gnnserve.deploy.fog.profiler import LatencyModel, halo_sizes
from gnnserve.errors import InvalidInputError


@dataclass(frozen=True)
class FogSpec:
    """What the planner knows of one fog node."""

    name: str
    bandwidth: float  # bytes/s of its device -> fog link
    model: LatencyModel  # its profiled latency model (ms)


@dataclass
class ExecutionPlan:
    """Where every vertex runs, and the costs that chose it."""

    membership: np.ndarray  # int64 [N]: fog index of each vertex
    part_to_fog: np.ndarray  # int64 [n]: fog of each METIS part
    costs: np.ndarray  # float [n, n] ms: Eq. 8 weight of (part k, fog j)
    predicted_ms: np.ndarray  # float [n]: Eq. 8 cost of each fog under this plan
    version: int = 0  # bumped by every re-plan or migration
    notes: dict[str, float] = field(default_factory=dict)

    @property
    def bottleneck_ms(self) -> float:
        """The plan's predicted round time: the slowest fog's cost."""
        return float(self.predicted_ms.max())


def metis_parts(
    indptr: np.ndarray,
    indices: np.ndarray,
    n: int,
    seed: int = 0,
    weights: np.ndarray | None = None,
) -> np.ndarray:
    """int64 [N] part of every vertex, n min-cut parts of the undirected simple graph; with
    ``weights`` (n positive numbers) part k targets that share of the vertices (METIS tpwgts),
    else all parts are equal."""
    import pymetis

    num_nodes = indptr.size - 1
    if n < 1 or n > num_nodes:
        raise InvalidInputError(f"need 1 <= parts <= {num_nodes}, got {n}", "nodes")
    if n == 1:
        return np.zeros(num_nodes, np.int64)
    undirected = symmetric_adjacency(indptr, indices)
    options = pymetis.Options(seed=seed)
    adjacency = pymetis.CSRAdjacency(undirected.indptr, undirected.indices)
    tpwgts = None
    if weights is not None:
        w = np.asarray(weights, float)
        if w.shape != (n,) or not np.all(np.isfinite(w)) or (w <= 0).any():
            raise InvalidInputError(f"part weights must be {n} positive numbers", "weights")
        tpwgts = (w / w.sum()).tolist()
    _, membership = pymetis.part_graph(n, adjacency, tpwgts=tpwgts, options=options)
    return np.asarray(membership, np.int64)


def cost_matrix(
    indptr: np.ndarray,
    indices: np.ndarray,
    parts: np.ndarray,
    fogs: list[FogSpec],
    phi_bytes: float,
    layers: int,
    delta_ms: float,
) -> np.ndarray:
    """float [n parts, n fogs] ms: Eq. 8, ``|P_k| phi / b_j + omega_j(|P_k|, |N_Pk|) + K delta``."""
    n = len(fogs)
    sizes = np.bincount(parts, minlength=n).astype(float)
    halos = halo_sizes(indptr, indices, parts, n).astype(float)
    bandwidth = np.array([f.bandwidth for f in fogs], float)
    upload = sizes[:, None] * phi_bytes / bandwidth[None, :] * 1e3
    execute = np.column_stack([f.model.predict(sizes, halos) for f in fogs])
    return upload + execute + layers * delta_ms


def _perfect(allowed: np.ndarray) -> np.ndarray | None:
    """A perfect matching (col of each row) using only ``allowed`` pairs, or None."""
    rows, cols = linear_sum_assignment(np.where(allowed, 0.0, 1.0))
    if allowed[rows, cols].all():
        return cols
    return None


def bottleneck_assignment(costs: np.ndarray) -> np.ndarray:
    """int64 [n]: fog of each part minimising the largest cost (then the total), by binary
    search over the sorted distinct weights with a Hungarian feasibility probe each."""
    costs = np.asarray(costs, float)
    if costs.ndim != 2 or costs.shape[0] != costs.shape[1] or not np.all(np.isfinite(costs)):
        raise InvalidInputError("the cost matrix must be square and finite", "costs")
    weights = np.unique(costs)
    lo, hi = 0, weights.size - 1  # the full graph always has a perfect matching
    while lo < hi:
        mid = (lo + hi) // 2
        if _perfect(costs <= weights[mid]) is None:
            lo = mid + 1
        else:
            hi = mid
    tau = weights[lo]
    big = costs.sum() + 1.0
    _, cols = linear_sum_assignment(np.where(costs <= tau, costs, big))
    return cols.astype(np.int64)


def greedy_assignment(costs: np.ndarray, sizes: np.ndarray | None = None) -> np.ndarray:
    """METIS+Greedy: the parts, largest first (by ``sizes``; ties and no sizes: by index), in
    turn take the free fog that costs them least, so the largest part gets first pick."""
    n = costs.shape[0]
    order = np.arange(n) if sizes is None else np.argsort(-np.asarray(sizes), kind="stable")
    free = np.ones(n, bool)
    out = np.empty(n, np.int64)
    for k in order:
        j = int(np.argmin(np.where(free, costs[k], np.inf)))
        out[k], free[j] = j, False
    return out


def random_assignment(n: int, rng: np.random.Generator) -> np.ndarray:
    """METIS+Random: a uniformly random mapping of parts to fogs."""
    return rng.permutation(n).astype(np.int64)


ASSIGNERS = ("iep", "greedy", "random")


def plan(
    indptr: np.ndarray,
    indices: np.ndarray,
    fogs: list[FogSpec],
    phi_bytes: float,
    layers: int,
    delta_ms: float = 0.0,
    assign: str = "iep",
    seed: int = 0,
    parts: np.ndarray | None = None,
) -> ExecutionPlan:
    """Algorithm 1: METIS parts (or the given ``parts``), Eq. 8 costs, then the mapping by
    ``assign`` (iep | greedy | random)."""
    if assign not in ASSIGNERS:
        raise InvalidInputError(f"assign must be one of {ASSIGNERS}, got {assign!r}", "assign")
    n = len(fogs)
    if parts is None:
        parts = metis_parts(indptr, indices, n, seed)
    costs = cost_matrix(indptr, indices, parts, fogs, phi_bytes, layers, delta_ms)
    if assign == "iep":
        part_to_fog = bottleneck_assignment(costs)
    elif assign == "greedy":
        part_to_fog = greedy_assignment(costs, np.bincount(parts, minlength=n))
    else:
        part_to_fog = random_assignment(n, np.random.default_rng(seed))
    predicted = np.empty(n)
    predicted[part_to_fog] = costs[np.arange(n), part_to_fog]
    return ExecutionPlan(part_to_fog[parts], part_to_fog, costs, predicted)
