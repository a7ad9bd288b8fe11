"""Feature placement by access score (Quiver §5.2): over storage tiers and across P servers.

Pure numpy, no I/O. A score is any non-negative float per node, higher = read more often: the
feature access probability (FAP, ``sampling.metrics.fap``), a degree (AliGraph-style baseline)
or a random draw (baseline). Ties are broken by node id, so every plan is deterministic.

* :func:`tier_plan`: nodes sorted by score fill the tiers fastest first, each up to its byte
  budget; the last tier takes the rest.
* :func:`server_plan`: Quiver §5.2 step (iv) across P servers: the hottest nodes replicated on
  every server, the rest partitioned. With one score vector the rest is dealt round-robin in
  score order (Quiver); with one vector per server (``[P, N]``: server ``p``'s access
  probability under its own traffic) each node goes to the server whose traffic reads it most,
  subject to capacity: the greedy over (server, node) pairs by score, computed exactly as the
  node-proposing deferred acceptance (stable matching) in vectorised rounds.
* :func:`remote_share`: share of feature bytes read from another server under a plan.
* Baselines: :func:`hash_partition` (DGL default), :func:`degree_partition` /
  :func:`degree_tier_plan` (AliGraph), :func:`random_server_plan` / :func:`random_tier_plan`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from gnnserve.errors import InvalidInputError

REPLICATED = -1  # owner of a node held by every server (= features.partitioned.REPLICATED)


@dataclass(frozen=True)
class TierPlan:
    """Which tier holds each node, and at which row of that tier."""

    names: tuple[str, ...]  # tier names, fastest first
    tier: np.ndarray  # int64 [N]: index into ``names`` of the tier holding node v
    row: np.ndarray  # int64 [N]: row of node v inside its tier (0 = the tier's hottest)
    nodes: tuple[np.ndarray, ...]  # per tier: int64 node ids in row order (score descending)
    row_bytes: int  # bytes of one feature row, as budgeted

    @property
    def num_nodes(self) -> int:
        """Number of nodes N placed."""
        return int(self.tier.size)

    def sizes(self) -> dict[str, int]:
        """Rows held per tier."""
        return {name: int(ids.size) for name, ids in zip(self.names, self.nodes, strict=True)}

    def index(self, name: str) -> int:
        """Index of tier ``name``; InvalidInputError when the plan has no such tier."""
        if name not in self.names:
            raise InvalidInputError(f"no tier {name!r} in plan {list(self.names)}", "tier")
        return self.names.index(name)


@dataclass(frozen=True)
class ServerPlan:
    """Which server owns each node; replicated nodes are held by every server."""

    owner: np.ndarray  # int64 [N]: REPLICATED (-1) or the server in [0, P) holding node v
    replicated: np.ndarray  # int64 ids held by every server, score descending
    owned: tuple[np.ndarray, ...]  # per server: int64 ids only it holds, sorted
    per_server_rows: int  # capacity of each server in rows (replicated + owned <= this)

    @property
    def num_servers(self) -> int:
        """Number of servers P."""
        return len(self.owned)

    def held(self, server: int) -> np.ndarray:
        """Sorted int64 ids server ``server`` holds: the replicated ones and its own."""
        return np.sort(np.concatenate([self.replicated, self.owned[server]]))


def _check_scores(scores: object, ndim: tuple[int, ...]) -> np.ndarray:
    """``scores`` as float64 with finite, non-negative values and an allowed ndim."""
    arr = np.asarray(scores, dtype=np.float64)
    if arr.ndim not in ndim:
        raise InvalidInputError(f"scores must have {' or '.join(map(str, ndim))} dims", "scores")
    if arr.size and (not np.isfinite(arr).all() or arr.min() < 0):
        raise InvalidInputError("scores must be finite and non-negative", "scores")
    return arr


def rank_nodes(scores: np.ndarray) -> np.ndarray:
    """Node ids by score descending, ties by id ascending (int64 [N])."""
    return np.argsort(-np.asarray(scores, dtype=np.float64), kind="stable").astype(np.int64)


def _tier_rows(budgets: Mapping[str, float | None], row_bytes: int, n: int) -> list[int]:
    """Rows each tier may hold (the last: every node left); checks the budgets."""
    if not budgets:
        raise InvalidInputError("budgets must name at least one tier", "budgets")
    rows: list[int] = []
    for i, (name, budget) in enumerate(budgets.items()):
        last = i == len(budgets) - 1
        if budget is None or math.isinf(budget):
            if not last:
                raise InvalidInputError(f"only the last tier may be unbounded ({name})", "budgets")
            rows.append(n)
            continue
        if not budget >= 0:
            raise InvalidInputError(f"budget of tier {name} must be >= 0, got {budget}", "budgets")
        rows.append(int(budget // row_bytes))
    left = n - sum(rows[:-1])
    if left > rows[-1]:
        name = list(budgets)[-1]
        raise InvalidInputError(f"{left} rows do not fit the last tier {name}", "budgets")
    return rows


def tier_plan(scores: np.ndarray, row_bytes: int, budgets: Mapping[str, float | None]) -> TierPlan:
    """Fill tiers fastest first with the nodes sorted by score (descending, ties by id).

    ``row_bytes``: bytes of one feature row (F * itemsize). ``budgets``: tier name -> bytes it
    may hold, fastest first (e.g. ``{"gpu": 2**30, "ram": 2**33, "disk": 2**36, "remote":
    None}``); the last tier takes every node left and may be None (unbounded).
    """
    s = _check_scores(scores, (1,))
    if row_bytes <= 0:
        raise InvalidInputError(f"row_bytes must be > 0, got {row_bytes}", "row_bytes")
    n = s.size
    caps = _tier_rows(budgets, int(row_bytes), n)
    order = rank_nodes(s)
    ends = np.minimum(np.cumsum(caps), n)
    ends[-1] = n
    starts = np.concatenate([[0], ends[:-1]])
    tier = np.empty(n, dtype=np.int64)
    row = np.empty(n, dtype=np.int64)
    nodes = []
    for t, (a, b) in enumerate(zip(starts.tolist(), ends.tolist(), strict=True)):
        ids = order[a:b]
        tier[ids] = t
        row[ids] = np.arange(b - a)
        nodes.append(ids)
    return TierPlan(tuple(budgets), tier, row, tuple(nodes), int(row_bytes))


def degree_tier_plan(
    degrees: np.ndarray, row_bytes: int, budgets: Mapping[str, float | None]
) -> TierPlan:
    """AliGraph-style baseline: :func:`tier_plan` with the degree as the score."""
    return tier_plan(np.asarray(degrees, dtype=np.float64), row_bytes, budgets)


def random_tier_plan(
    num_nodes: int, row_bytes: int, budgets: Mapping[str, float | None], seed: int = 0
) -> TierPlan:
    """Baseline: :func:`tier_plan` with a seeded random order."""
    return tier_plan(np.random.default_rng(seed).random(num_nodes), row_bytes, budgets)


def default_replicated(num_nodes: int, num_servers: int, per_server_rows: int) -> int:
    """The most nodes that can be replicated while every node is still held somewhere:
    the largest R with R + P * (C - R) >= N (0 for one server)."""
    if num_servers == 1:
        return 0
    spare = num_servers * per_server_rows - num_nodes
    return max(0, min(per_server_rows, num_nodes, spare // (num_servers - 1)))


def _deferred_acceptance(
    pref: np.ndarray, key: np.ndarray, ids: np.ndarray, capacity: int
) -> np.ndarray:
    """Server of each of M nodes: node-proposing deferred acceptance in vectorised rounds.

    ``pref`` int64 [M, P]: node i's servers, best first. ``key`` float [P, M] (may be a
    broadcast view): how much server p wants node i; ties go to the lower ``ids[i]``. Every
    server holds at most ``capacity`` nodes (P * capacity >= M). When both sides rank by the
    same pair scores this is the unique stable matching, which is the sequential greedy over
    pairs sorted by score.
    """
    m, p = pref.shape
    owner = np.full(m, -1, dtype=np.int64)
    nxt = np.zeros(m, dtype=np.int64)
    free = np.arange(m, dtype=np.int64)
    while free.size:
        if int(nxt[free].max()) >= p:
            raise RuntimeError("deferred acceptance: a node was refused by every server")
        owner[free] = pref[free, nxt[free]]
        nxt[free] += 1
        load = np.bincount(owner[owner >= 0], minlength=p)
        full = np.flatnonzero(load > capacity)
        if full.size == 0:
            break
        cand = np.flatnonzero(np.isin(owner, full))
        srv = owner[cand]
        order = np.lexsort((ids[cand], -key[srv, cand], srv))
        cand, srv = cand[order], srv[order]
        first = np.searchsorted(srv, srv, side="left")
        rejected = cand[np.arange(cand.size) - first >= capacity]
        owner[rejected] = -1
        free = rejected
    return owner


def _check_home(home: object, n: int, servers: int) -> np.ndarray:
    arr = np.asarray(home)
    if arr.shape != (n,) or not np.issubdtype(arr.dtype, np.integer):
        raise InvalidInputError(f"home must be an int array of shape ({n},)", "home")
    if n and (arr.min() < 0 or arr.max() >= servers):
        raise InvalidInputError(f"home values must be in [0, {servers})", "home")
    return arr.astype(np.int64)


def _partition_rest(
    s: np.ndarray, rest: np.ndarray, servers: int, capacity: int, home: np.ndarray | None
) -> np.ndarray:
    """Server of each node in ``rest`` (ids, score descending)."""
    if s.ndim == 1 and home is None:  # Quiver: dealt round-robin in score order
        return np.arange(rest.size, dtype=np.int64) % servers
    if s.ndim == 2:  # each node's servers by their score for it, ties by server index
        key = s[:, rest]
        pref = np.argsort(-key, axis=0, kind="stable").T
    else:  # its home server first, then the next ones cyclically; servers want the hottest
        assert home is not None
        key = np.broadcast_to(s[rest], (servers, rest.size))
        pref = (home[rest][:, None] + np.arange(servers)[None, :]) % servers
    return _deferred_acceptance(np.ascontiguousarray(pref), key, rest, capacity)


def server_plan(
    scores: np.ndarray,
    num_servers: int,
    per_server_rows: int,
    home: np.ndarray | None = None,
    replicated: int | None = None,
) -> ServerPlan:
    """Place N nodes on ``num_servers`` servers of ``per_server_rows`` rows each (Quiver §5.2).

    ``scores``: float [N] (one access score per node) or [P, N] (server p's access score of
    node v under its own traffic; a node's overall score is the sum over servers). The
    ``replicated`` hottest nodes (default :func:`default_replicated`: as many as still lets
    every node be held) go on every server; the rest are partitioned:

    * 1-D scores, no ``home``: dealt round-robin in score order (Quiver);
    * 1-D scores with ``home`` (int [N], the server whose traffic reads node v): each node on
      its home server while it has room, the hottest first; the overflow on the next servers
      (home + 1, home + 2, ... mod P) with room;
    * [P, N] scores: each node on the server that reads it most, subject to capacity: the
      greedy over (server, node) pairs by score descending (ties by node id, then server).
    """
    if num_servers < 1:
        raise InvalidInputError(f"num_servers must be >= 1, got {num_servers}", "num_servers")
    s = _check_scores(scores, (1, 2))
    n = s.shape[-1]
    if s.ndim == 2 and s.shape[0] != num_servers:
        raise InvalidInputError(f"scores must have shape ({num_servers}, N)", "scores")
    if s.ndim == 2 and home is not None:
        raise InvalidInputError("home is for 1-D scores; [P, N] scores say it already", "home")
    h = None if home is None else _check_home(home, n, num_servers)
    cap = int(per_server_rows)
    if cap < 0:
        raise InvalidInputError("per_server_rows must be >= 0", "per_server_rows")
    r = default_replicated(n, num_servers, cap) if replicated is None else int(replicated)
    if not 0 <= r <= min(cap, n):
        raise InvalidInputError(f"replicated must be in [0, {min(cap, n)}]", "replicated")
    if r + num_servers * (cap - r) < n:
        raise InvalidInputError(
            f"{n} nodes do not fit {num_servers} servers of {cap} rows with {r} replicated",
            "per_server_rows",
        )
    order = rank_nodes(s if s.ndim == 1 else s.sum(axis=0))
    rest = order[r:]
    owner = np.full(n, REPLICATED, dtype=np.int64)
    owner[rest] = _partition_rest(s, rest, num_servers, cap - r, h)
    owned = tuple(np.flatnonzero(owner == p).astype(np.int64) for p in range(num_servers))
    return ServerPlan(owner, order[:r], owned, cap)


def hash_partition(num_nodes: int, num_servers: int) -> ServerPlan:
    """DGL's default baseline: node v on server ``v mod P``, nothing replicated."""
    if num_servers < 1:
        raise InvalidInputError(f"num_servers must be >= 1, got {num_servers}", "num_servers")
    owner = np.arange(num_nodes, dtype=np.int64) % num_servers
    owned = tuple(np.flatnonzero(owner == p).astype(np.int64) for p in range(num_servers))
    cap = -(-num_nodes // num_servers)
    return ServerPlan(owner, np.empty(0, dtype=np.int64), owned, cap)


def degree_partition(
    degrees: np.ndarray, num_servers: int, per_server_rows: int, replicated: int | None = None
) -> ServerPlan:
    """AliGraph-style baseline: :func:`server_plan` with the degree as the one score vector."""
    s = np.asarray(degrees, dtype=np.float64)
    return server_plan(s, num_servers, per_server_rows, replicated=replicated)


def random_server_plan(
    num_nodes: int,
    num_servers: int,
    per_server_rows: int,
    seed: int = 0,
    replicated: int | None = None,
) -> ServerPlan:
    """Baseline: :func:`server_plan` with a seeded random score per node."""
    s = np.random.default_rng(seed).random(num_nodes)
    return server_plan(s, num_servers, per_server_rows, replicated=replicated)


def remote_share(plan: ServerPlan, access_counts: np.ndarray, row_bytes: int | np.ndarray) -> float:
    """Share of feature bytes read from another server: ``access_counts`` float [P, N] holds
    how often server p's traffic reads node v; ``row_bytes`` bytes per row (scalar or [N])."""
    counts = np.asarray(access_counts, dtype=np.float64)
    p, n = plan.num_servers, plan.owner.size
    if counts.shape != (p, n):
        raise InvalidInputError(f"access_counts must have shape ({p}, {n})", "access_counts")
    weight = np.broadcast_to(np.asarray(row_bytes, dtype=np.float64), (n,))
    read = counts * weight
    away = (plan.owner[None, :] != np.arange(p)[:, None]) & (plan.owner[None, :] != REPLICATED)
    total = float(read.sum())
    return float(read[away].sum()) / total if total else 0.0
