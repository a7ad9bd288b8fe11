"""Fograph's dual-mode adaptive workload scheduler (§III-F, Algorithm 2).

After a round, each fog's measured time ``T_j`` gives its skew ``mu_j = T_j / mean(T)`` (Eq. 9).
When no ``mu_j`` exceeds the slack ``lambda`` (> 1) the plan stays. Otherwise, with ``n+`` fogs
over it: ``n+/n <= theta`` (default 0.5) -> diffusion, a light local fix; else global re-
planning with IEP on the load-factor-updated latency models.

Diffusion moves vertices from the slowest fog to the fastest, one boundary vertex at a time: the
vertex of the slow side with the most neighbours on the fast side. How many: the pair's times
are predicted per unit of work (``T_j / W_j``, W_j the fog's summed vertex work, which already
holds the fog's load), and vertices move until a (damped) share of the gap is closed. Pairs are
repeated (slowest with fastest, on the predicted times) until every predicted ``mu`` is within
lambda or nothing more can move. Everything is computed on a copy: the caller applies the new
membership between rounds (Fograph: "at system idle time")."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from gnnserve.errors import InvalidInputError

DEFAULT_SLACK = 1.2  # lambda: tolerated max / mean round time
DEFAULT_SKEW_THRESHOLD = 0.5  # theta: share of overloaded fogs above which IEP re-plans
DEFAULT_DAMPING = 0.5  # share of a pair's evening move made per round
DEFAULT_SURGE = 2.0  # mu above surge x slack acts at once; smaller skews must show twice


@dataclass(frozen=True)
class Decision:
    """What the scheduler decided after one round."""

    mode: str  # "keep" | "diffusion" | "replan"
    membership: np.ndarray  # int64 [N] fog of each vertex after the decision
    moved: np.ndarray  # int64 [m] vertices whose fog changed
    mu: np.ndarray  # float [n] measured skew of each fog (Eq. 9)
    predicted_ms: np.ndarray  # float [n] predicted round time per fog after the decision
    over: np.ndarray | None = None  # bool [n]: fogs past the slack this round (next ``previous``)


def skew(times_ms: np.ndarray) -> np.ndarray:
    """Eq. 9: each fog's time over the mean time of all fogs."""
    t = np.asarray(times_ms, float)
    if t.ndim != 1 or t.size == 0 or not np.all(np.isfinite(t)) or (t < 0).any():
        raise InvalidInputError("round times must be a non-empty list of finite ms >= 0", "times")
    mean = t.mean()
    return t / mean if mean > 0 else np.ones_like(t)


def diffuse_pair(
    adjacency: sp.csr_matrix,
    membership: np.ndarray,
    slow: int,
    fast: int,
    budget: float,
    work: np.ndarray | None = None,
) -> np.ndarray:
    """Move vertices from fog ``slow`` to fog ``fast`` in place, each time the slow side's vertex
    with the most neighbours on the fast side (ties: lowest id), while their summed ``work``
    (default 1 per vertex) stays within ``budget`` (at least one moves); returns them."""
    weight = np.ones(membership.size) if work is None else np.asarray(work, float)
    on_fast = (membership == fast).astype(np.int32)
    links = np.asarray(adjacency @ on_fast).ravel()  # neighbours on the fast side
    links = np.where(membership == slow, links, -1)
    moved: list[int] = []
    spent = 0.0
    while True:
        v = int(np.argmax(links))
        if links[v] < 0 or (moved and spent + weight[v] > budget):
            break
        membership[v], links[v] = fast, -1
        nbrs = adjacency.indices[adjacency.indptr[v] : adjacency.indptr[v + 1]]
        links[nbrs[links[nbrs] >= 0]] += 1
        moved.append(v)
        spent += weight[v]
    return np.asarray(moved, np.int64)


def diffusion(
    adjacency: sp.csr_matrix,
    membership: np.ndarray,
    times_ms: np.ndarray,
    slack: float = DEFAULT_SLACK,
    max_pairs: int | None = None,
    damping: float = DEFAULT_DAMPING,
    work: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Diffusion on a copy of ``membership``: (new membership, moved vertices, predicted ms).

    A fog's time is taken as proportional to its vertices' summed ``work`` (default 1 each; the
    service passes in-degree + 1, since aggregation costs an edge), so the vertices it moves
    first, the boundary hubs, count for what they cost. ``damping`` (0, 1] scales each pair's
    move (1: the full amount that evens the pair). Beyond Fograph: times on a CPU quota are not
    linear in the load (a short round runs at full speed from the period's slice), the full
    amount overshoots and swings back round after round; part steps converge."""
    member = np.asarray(membership, np.int64).copy()
    weight = np.ones(member.size) if work is None else np.asarray(work, float)
    n = times_ms.size
    load = np.bincount(member, weights=weight, minlength=n)
    per_work = np.where(load > 0, times_ms / np.maximum(load, 1e-12), 0.0)
    per_work = np.where(per_work > 0, per_work, per_work[per_work > 0].min(initial=1.0))
    predicted = np.asarray(times_ms, float).copy()
    moved: list[np.ndarray] = []
    for _ in range(max_pairs or 2 * n):
        if predicted.max() <= slack * predicted.mean():
            break
        slow, fast = int(np.argmax(predicted)), int(np.argmin(predicted))
        # T_s - w c_s = T_f + w c_f: the work that evens the pair
        budget = damping * (predicted[slow] - predicted[fast]) / (per_work[slow] + per_work[fast])
        step = diffuse_pair(adjacency, member, slow, fast, budget, weight)
        if step.size == 0:
            break
        shifted = float(weight[step].sum())
        predicted[slow] -= shifted * per_work[slow]
        predicted[fast] += shifted * per_work[fast]
        moved.append(step)
    all_moved = np.unique(np.concatenate(moved)) if moved else np.empty(0, np.int64)
    return member, all_moved, predicted


def schedule(
    adjacency: sp.csr_matrix,
    membership: np.ndarray,
    times_ms: np.ndarray,
    replan: Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]],
    slack: float = DEFAULT_SLACK,
    skew_threshold: float = DEFAULT_SKEW_THRESHOLD,
    min_excess_ms: float = 0.0,
    damping: float = DEFAULT_DAMPING,
    work: np.ndarray | None = None,
    previous: np.ndarray | None = None,
    surge: float = DEFAULT_SURGE,
) -> Decision:
    """Algorithm 2 after a round that took ``times_ms`` per fog. ``replan(times_ms)`` runs IEP
    with the load-factor-updated models and returns (membership, predicted ms per fog).

    Beyond Fograph, two noise filters (round times on CPU quotas swing by +-50% at a fixed
    load, and a placement change costs more than it can win):

    - ``min_excess_ms``: a fog counts as overloaded only when it is also that many ms above
      the mean;
    - ``previous`` (the last decision's ``over``): with it, a fog whose skew is below
      ``surge`` x slack counts only when it was past the slack in the previous round too; a
      surge (a real load change) acts at once, and its diffusion evens the pair in one step
      (undamped)."""
    if slack <= 1.0 or skew_threshold <= 0 or min_excess_ms < 0 or not 0 < damping <= 1:
        raise InvalidInputError(
            "need slack > 1, skew threshold > 0, min_excess_ms >= 0 and damping in (0, 1]",
            "scheduler",
        )
    times = np.asarray(times_ms, float)
    mu = skew(times)
    current = np.asarray(membership, np.int64)
    over = (mu > slack) & (times - times.mean() > min_excess_ms)
    counted = over
    if previous is not None:
        counted = over & ((mu > surge * slack) | np.asarray(previous, bool))
    overloaded = int(counted.sum())
    if overloaded == 0:
        return Decision("keep", current.copy(), np.empty(0, np.int64), mu, times.copy(), over)
    if overloaded / mu.size <= skew_threshold:
        # a surge (a real load change, not noise) is evened in one step
        step = 1.0 if (mu > surge * slack).any() else damping
        member, moved, predicted = diffusion(
            adjacency, current, times, slack, damping=step, work=work
        )
        return Decision("diffusion", member, moved, mu, predicted, over)
    member, predicted = replan(times)
    moved = np.flatnonzero(member != current).astype(np.int64)
    return Decision("replan", np.asarray(member, np.int64), moved, mu, np.asarray(predicted), over)
