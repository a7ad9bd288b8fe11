"""numba kernels of DGS pre-sampling: reservoir build, event maintenance, k-hop assembly.

Reservoirs of every one-hop query live in one table ``table`` int64 [N_cap, sum(fans)]: query q
owns columns ``cols[q] : cols[q] + fans[q]`` and ``counts[v, q]`` of them are filled for vertex v.
Rows and vertices: row r of the arrays belongs to one vertex (global id); in ``PreSampler`` row =
vertex id, a DGS sampling worker keeps only its partition's rows. Reservoir entries are global ids.

Randomness is counter-based (``kernels.row_key`` as a hash of (key, counter)) and PER VERTEX: the
build draws from a key per (seed, query, vertex); maintenance draw t of vertex v is
hash(hash(maintenance key, v), t), with t = ``draws[row of v]``, the number of draws v has made.
v's draws thus depend only on the seed, v and v's own event sequence, never on other vertices'
events: any partition of the vertices that applies each vertex's events in order reproduces the
reservoirs bit for bit.
"""

from __future__ import annotations

import numba
import numpy as np

from gnnserve.graph.events import DELETE, INSERT  # noqa: F401 (event kinds, re-exported)
from gnnserve.sampling.kernels import relabel, reserve, reset_map, row_key, unique_seeds


@numba.njit(inline="always")
def _below(key: np.uint64, v: int, draws: np.ndarray, r: int, n: int) -> np.int64:
    """Vertex v's (row r's) next maintenance draw, uniform in [0, n) (n >= 1)."""
    t = draws[r]
    draws[r] = t + 1
    return np.int64(row_key(row_key(key, 0, v), 0, t) % np.uint64(n))


@numba.njit(nogil=True, parallel=True, cache=True)
def build(indptr, indices, gids, cols, fans, seed, table, counts, deg):  # type: ignore[no-untyped-def]
    """Fill each row's reservoirs with min(f, deg) distinct edge slots (Floyd's algorithm).

    CSR row v is vertex ``gids[v]``, whose id keys the draws.
    """
    for v in numba.prange(indptr.shape[0] - 1):
        lo = indptr[v]
        d = indptr[v + 1] - lo
        deg[v] = d
        for q in range(fans.shape[0]):
            k = min(fans[q], d)
            c = cols[q]
            counts[v, q] = k
            if k == d:
                for j in range(k):
                    table[v, c + j] = indices[lo + j]
                continue
            key = row_key(seed, q, gids[v])
            for filled, j in enumerate(range(d - k, d)):
                t = np.int64(row_key(key, 0, filled) % np.uint64(j + 1))
                for p in range(filled):  # t already chosen -> take j, which cannot be
                    if table[v, c + p] == t:
                        t = np.int64(j)
                        break
                table[v, c + filled] = t
            for j in range(k):
                table[v, c + j] = indices[lo + table[v, c + j]]


@numba.njit(inline="always")
def _log(log, n_log, q, v, added, removed):  # type: ignore[no-untyped-def]
    """Append the change (query, vertex, added neighbour, removed neighbour) to ``log``."""
    i = n_log[0]
    log[i, 0] = q
    log[i, 1] = v
    log[i, 2] = added
    log[i, 3] = removed
    n_log[0] = i + 1


@numba.njit(inline="always")
def _insert(table, counts, deg, draws, cols, fans, key, q, r, v, u, log, n_log):  # type: ignore[no-untyped-def]
    """Algorithm R step for a new slot u of v (row r), whose degree is now deg[r]."""
    f = fans[q]
    c = counts[r, q]
    if c < f:
        table[r, cols[q] + c] = u
        counts[r, q] = c + 1
        _log(log, n_log, q, v, u, -1)
        return
    j = _below(key, v, draws, r, deg[r])
    if j < f:  # probability f / deg, then j is a uniform slot
        old = table[r, cols[q] + j]
        table[r, cols[q] + j] = u
        _log(log, n_log, q, v, u, old)


@numba.njit(inline="always")
def _copies(table, counts, cols, q, r, u):  # type: ignore[no-untyped-def]
    """How many slots of row r's reservoir for query q hold neighbour u."""
    n = 0
    for j in range(counts[r, q]):
        if table[r, cols[q] + j] == u:
            n += 1
    return n


@numba.njit(inline="always")
def _drop(table, counts, cols, q, r, u):  # type: ignore[no-untyped-def]
    """Remove one slot holding u from row r's reservoir for query q (the last slot fills in)."""
    c = cols[q]
    k = counts[r, q]
    for j in range(k):
        if table[r, c + j] == u:
            table[r, c + j] = table[r, c + k - 1]
            counts[r, q] = k - 1
            return


@numba.njit(nogil=True, cache=True)
def step_events(  # type: ignore[no-untyped-def]
    table, counts, deg, draws, cols, fans, key, kinds, srcs, dsts, rows, start, q_start, log, n_log
):
    """Apply events from (event ``start``, query ``q_start``) on; stop at a reservoir hit.

    Event i is the edge srcs[i] -> dsts[i]; ``rows[i]`` is the row of dsts[i].

    A delete whose source sits in a reservoir that did not hold every slot needs the current
    neighbour list: the kernel returns (event, query) of it for ``resolve_delete``;
    (len(kinds), 0) when all are applied.
    """
    for i in range(start, kinds.shape[0]):
        u = srcs[i]
        v = dsts[i]
        r = rows[i]
        q0 = q_start if i == start else 0
        if q0 == 0:
            deg[r] += 1 if kinds[i] == INSERT else -1
        for q in range(q0, fans.shape[0]):
            if kinds[i] == INSERT:
                _insert(table, counts, deg, draws, cols, fans, key, q, r, v, u, log, n_log)
            elif _copies(table, counts, cols, q, r, u) > 0:
                if counts[r, q] <= deg[r]:
                    return i, q
                _drop(table, counts, cols, q, r, u)  # it held every slot: nothing to refill
                _log(log, n_log, q, v, -1, u)
    return kinds.shape[0], 0


@numba.njit(nogil=True, cache=True)
def resolve_delete(table, counts, draws, cols, key, q, r, v, u, nbrs, log, n_log):  # type: ignore[no-untyped-def]
    """Delete of one u -> v (row r) slot maybe in v's reservoir; ``nbrs`` = v's neighbours now.

    Parallel edges: the removed copy is one of u's m + 1 copies, in the reservoir with
    probability copies / (m + 1). A removed slot is refilled by a uniform current slot not
    in the reservoir; candidates come from the sorted lists, so neighbour order does not matter.
    """
    c = cols[q]
    k = counts[r, q]
    nb = np.sort(nbrs)
    m = np.searchsorted(nb, u, side="right") - np.searchsorted(nb, u)
    copies = _copies(table, counts, cols, q, r, u)
    if m + 1 > copies and _below(key, v, draws, r, m + 1) >= copies:
        return
    _drop(table, counts, cols, q, r, u)
    k -= 1
    kept = np.sort(table[r, c : c + k])
    cand = np.empty(nb.shape[0], dtype=np.int64)
    n_cand = 0
    p = 0
    for x in nb:  # multiset difference nb - kept, both sorted
        while p < k and kept[p] < x:
            p += 1
        if p < k and kept[p] == x:
            p += 1
        else:
            cand[n_cand] = x
            n_cand += 1
    added = -1
    if n_cand > 0:
        added = cand[_below(key, v, draws, r, n_cand)]
        table[r, c + k] = added
        k += 1
    counts[r, q] = k
    _log(log, n_log, q, v, added, u)


@numba.njit(nogil=True, cache=True)
def neighbours_at(i, kinds, srcs, by_dst, run_lo, run_hi, adj_start, adj_degree, adj_cols, a):  # type: ignore[no-untyped-def]
    """dsts[i]'s in-neighbour multiset right after event i: its list after the whole batch
    (adjacency row ``a``) with the batch's later events on it undone. ``by_dst[run_lo:run_hi]``
    are the events on dsts[i], in batch order (a stable argsort of ``dsts``)."""
    lo, d = adj_start[a], adj_degree[a]
    later = 0
    for p in range(run_lo, run_hi):
        later += by_dst[p] > i and kinds[by_dst[p]] == DELETE
    out = np.empty(d + later, dtype=np.int64)
    out[:d] = adj_cols[lo : lo + d]
    k = d
    for p in range(run_lo, run_hi):
        j = by_dst[p]
        if j > i and kinds[j] == DELETE:  # removed later: present at event i
            out[k] = srcs[j]
            k += 1
    for p in range(run_lo, run_hi):
        j = by_dst[p]
        if j > i and kinds[j] == INSERT:  # added later: one copy absent at event i
            for x in range(k):
                if out[x] == srcs[j]:
                    out[x] = out[k - 1]
                    k -= 1
                    break
    return out[:k]


@numba.njit(nogil=True, cache=True)
def apply_events(  # type: ignore[no-untyped-def]
    table, counts, deg, draws, cols, fans, key, kinds, srcs, dsts, rows,
    adj_start, adj_degree, adj_cols, adj_rows, log, n_log,
):  # fmt: skip
    """Apply a batch of events in order, refills included, in one call without the GIL.

    ``adj_*`` are the in-neighbour lists after the WHOLE batch (row ``adj_rows[i]`` holds
    dsts[i]'s list); a delete that needs a refill rebuilds the list at its event from them
    (:func:`neighbours_at`). Changes go to ``log`` as ``step_events``."""
    n = kinds.shape[0]
    i, q = step_events(
        table, counts, deg, draws, cols, fans, key, kinds, srcs, dsts, rows, 0, 0, log, n_log
    )
    if i >= n:
        return
    by_dst = np.argsort(dsts, kind="mergesort")  # stable: each vertex's events in order
    sorted_dsts = dsts[by_dst]
    last = -1
    nbrs = np.empty(0, dtype=np.int64)
    while i < n:
        if i != last:  # the same event's later queries reuse its list
            v = dsts[i]
            run_lo = np.searchsorted(sorted_dsts, v)
            run_hi = np.searchsorted(sorted_dsts, v, side="right")
            nbrs = neighbours_at(
                i, kinds, srcs, by_dst, run_lo, run_hi, adj_start, adj_degree, adj_cols, adj_rows[i]
            )
            last = i
        resolve_delete(
            table, counts, draws, cols, key, q, rows[i], dsts[i], srcs[i], nbrs, log, n_log
        )
        i, q = step_events(
            table,
            counts,
            deg,
            draws,
            cols,
            fans,
            key,
            kinds,
            srcs,
            dsts,
            rows,
            i,
            q + 1,
            log,
            n_log,
        )


@numba.njit(nogil=True, cache=True)
def copy_rows(table, counts, deg, draws, from_table, from_counts, from_deg, from_draws, rows):  # type: ignore[no-untyped-def]
    """Copy rows ``rows`` (repeats allowed) of one reservoir table's arrays onto another's."""
    for r in rows:
        table[r, :] = from_table[r, :]
        counts[r, :] = from_counts[r, :]
        deg[r] = from_deg[r]
        draws[r] = from_draws[r]


@numba.njit(inline="always")
def _row(row_of: np.ndarray, v: int) -> int:
    """Row of vertex v: v itself when ``row_of`` is empty, else row_of[v] (-1 = not held)."""
    return v if row_of.shape[0] == 0 else row_of[v]


@numba.njit(nogil=True, cache=True)
def assemble(table, counts, cols, hop_query, seeds, local_id, row_of):  # type: ignore[no-untyped-def]
    """k-hop sample by reservoir look-ups, the output format of ``kernels.sample_inline``.

    ``row_of`` maps vertex -> row (empty: row = vertex); a reservoir that is not held (row -1 or
    count -1) stops the assembly. Returns (nodes, seed_rows, num_seeds, edges [2, >=E] local
    ids, hop_offsets [hops+1], layer_sizes [hops+1], missing vertex or -1); ``local_id`` is left
    all -1 again.
    """
    nodes = np.empty(max(seeds.shape[0] * 4, 64), dtype=np.int64)
    n_nodes, seed_rows = unique_seeds(seeds, nodes, local_id)
    num_seeds = n_nodes
    hops = hop_query.shape[0]
    hop_offsets = np.zeros(hops + 1, dtype=np.int64)
    layer_sizes = np.empty(hops + 1, dtype=np.int64)
    layer_sizes[0] = n_nodes
    edges = np.empty((2, 256), dtype=np.int64)
    missing = -1
    for hop in range(hops):
        q = hop_query[hop]
        c = cols[q]
        start = hop_offsets[hop]
        total = 0
        for i in range(n_nodes):
            r = _row(row_of, nodes[i])
            if r < 0 or counts[r, q] < 0:
                missing = nodes[i]
                break
            total += counts[r, q]
        if missing >= 0:
            break
        need = start + total
        edges, nodes = reserve(edges, nodes, start, n_nodes, total)
        e = start
        for i in range(n_nodes):
            r = _row(row_of, nodes[i])
            for j in range(counts[r, q]):
                edges[0, e] = table[r, c + j]
                edges[1, e] = i
                e += 1
        n_nodes = relabel(edges[:, start:need], nodes, n_nodes, local_id)
        hop_offsets[hop + 1] = need
        layer_sizes[hop + 1] = n_nodes
    reset_map(local_id, nodes, n_nodes)
    return nodes[:n_nodes].copy(), seed_rows, num_seeds, edges, hop_offsets, layer_sizes, missing
