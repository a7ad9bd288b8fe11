"""PreSampler (DGS): reservoir uniformity under updates, samples hold only current edges."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from gnnserve.data.writer import build_csr
from gnnserve.errors import InvalidInputError
from gnnserve.graph import open_graph_store
from gnnserve.sampling import NeighborSampler
from gnnserve.sampling.presample import DELETE, INSERT, PreSampler
from tests.conftest import random_simple_graph
from tests.sampling.checks import check_sample, edge_set


class ListGraph:
    """The test's own dynamic graph: in-neighbour multisets as Python lists."""

    def __init__(self, num_nodes: int, edges: list[tuple[int, int]]) -> None:
        self.nbrs: list[list[int]] = [[] for _ in range(num_nodes)]
        for u, v in edges:
            self.nbrs[v].append(u)

    def csr(self) -> tuple[np.ndarray, np.ndarray]:
        ei = np.array([(u, v) for v, us in enumerate(self.nbrs) for u in us], np.int64)
        return build_csr(ei.reshape(-1, 2).T, len(self.nbrs))

    def neighbors_of(self, v: int) -> np.ndarray:
        return np.array(self.nbrs[v], dtype=np.int64)

    def apply(self, kind: int, u: int, v: int) -> None:
        if kind == INSERT:
            self.nbrs[v].append(u)
        else:
            self.nbrs[v].remove(u)

    def edge_set(self) -> set[tuple[int, int]]:
        return {(u, v) for v, us in enumerate(self.nbrs) for u in us}


def _run(graph_edges, n, events, fanouts, seed, batched=False):  # type: ignore[no-untyped-def]
    """Build a PreSampler, replay ``events`` [(kind, u, v)]; return (sampler, graph, changes)."""
    g = ListGraph(n, graph_edges)
    ps = PreSampler(*g.csr(), fanouts, seed=seed)
    if batched:
        for kind, u, v in events:
            g.apply(kind, u, v)
        kinds, srcs, dsts = (np.array(c) for c in zip(*events, strict=True))
        return ps, g, [ps.apply_events(kinds, srcs, dsts, g.neighbors_of)]
    changes = []
    for kind, u, v in events:
        g.apply(kind, u, v)
        step = ps.on_insert if kind == INSERT else ps.on_delete
        changes.append(step(u, v, g.neighbors_of))
    return ps, g, changes


def _check_reservoir(ps: PreSampler, g: ListGraph, v: int) -> None:
    """min(f, deg) entries, each slot a current neighbour slot (multiset inclusion)."""
    have = Counter(g.nbrs[v])
    for hop, f in enumerate(ps.fanouts):
        res = ps.reservoir(v, hop)
        assert res.size == min(f, len(g.nbrs[v]))
        assert not Counter(res.tolist()) - have, (v, res, g.nbrs[v])


def _uniformity(edges, n, events, v, fanout, runs=2500):  # type: ignore[no-untyped-def]
    """Chi-square over ``runs`` seeds: slot counts of v's reservoir match multiplicities."""
    counts: Counter[int] = Counter()
    refills = 0
    for r in range(runs):
        ps, g, changes = _run(edges, n, events, [fanout], seed=r)
        _check_reservoir(ps, g, v)
        counts.update(ps.reservoir(v, 0).tolist())
        deletes = [c for (kind, _, _), c in zip(events, changes, strict=True) if kind == DELETE]
        refills += sum(int(np.sum(c[:, 2] >= 0)) for c in deletes)
    mult = Counter(g.nbrs[v])
    keys = sorted(mult)
    observed = np.array([counts[k] for k in keys], dtype=np.float64)
    expected = np.array([mult[k] for k in keys], dtype=np.float64)
    expected *= runs * min(fanout, len(g.nbrs[v])) / expected.sum()
    assert set(counts) <= set(keys)
    result = stats.chisquare(observed, expected)
    assert result.pvalue > 1e-3, (result, observed, expected)
    return refills


def test_uniform_after_interleaved_inserts_and_deletes() -> None:
    """Star into 0: deletes hit reservoir members (refills counted), inserts past capacity."""
    edges = [(u, 0) for u in range(1, 13)] + [(0, 5), (3, 4)]
    events = [(INSERT, u, 0) for u in range(13, 19)]
    events += [(DELETE, u, 0) for u in (1, 2, 3, 4, 5, 6, 14)]
    events += [(INSERT, u, 0) for u in (19, 20, 1)] + [(DELETE, 3, 4), (INSERT, 2, 5)]
    refills = _uniformity(edges, 21, events, v=0, fanout=4)
    assert refills > 1000  # many runs deleted a reservoir member and refilled it


def test_uniform_when_degree_drops_below_fanout_then_rises() -> None:
    edges = [(u, 0) for u in range(1, 7)]
    events = [(DELETE, u, 0) for u in (1, 2, 3, 4)]  # deg 6 -> 2 < f = 4
    events += [(INSERT, u, 0) for u in range(7, 13)] + [(DELETE, 8, 0), (INSERT, 1, 0)]
    _uniformity(edges, 13, events, v=0, fanout=4)


def test_uniform_over_parallel_edge_slots() -> None:
    """Parallel edges are slots: u appears in proportion to its multiplicity."""
    edges = [(1, 0), (1, 0), (1, 0), (2, 0), (3, 0), (4, 0), (5, 0), (5, 0)]
    events = [(DELETE, 1, 0), (INSERT, 2, 0), (INSERT, 2, 0), (DELETE, 5, 0), (INSERT, 6, 0)]
    events += [(DELETE, 3, 0), (INSERT, 6, 0), (INSERT, 6, 0), (DELETE, 1, 0)]
    _uniformity(edges, 7, events, v=0, fanout=3)


def test_batched_events_equal_single_events() -> None:
    """apply_events replays the batch exactly like one call per event (same seed)."""
    n = 60
    ei = random_simple_graph(n, 400, seed=3)
    edges = list(zip(ei[0].tolist(), ei[1].tolist(), strict=True))
    rng = np.random.default_rng(4)
    events, present = [], list(edges)
    for _ in range(600):
        if rng.random() < 0.5 and present:
            u, v = present.pop(int(rng.integers(len(present))))
            events.append((DELETE, u, v))
        else:
            u, v = (int(x) for x in rng.integers(0, n, 2))
            present.append((u, v))  # parallel edges allowed
            events.append((INSERT, u, v))
    single, g, changes = _run(edges, n, events, [3, 2, 3], seed=9)
    batch, _, batch_changes = _run(edges, n, events, [3, 2, 3], seed=9, batched=True)
    np.testing.assert_array_equal(np.concatenate(changes), batch_changes[0])
    for v in range(n):
        _check_reservoir(batch, g, v)
        for hop in range(3):
            np.testing.assert_array_equal(single.reservoir(v, hop), batch.reservoir(v, hop))


@pytest.mark.parametrize("fanouts", [[5, 3], [4, 4], [3, 2, 3]])
def test_samples_hold_only_current_edges(fanouts: list[int]) -> None:
    n = 300
    ei = random_simple_graph(n, 2500, seed=1)
    g = ListGraph(n, list(zip(ei[0].tolist(), ei[1].tolist(), strict=True)))
    edges = g.edge_set()
    ps = PreSampler(*g.csr(), fanouts, seed=2)
    rng = np.random.default_rng(5)
    for _ in range(30):
        if rng.random() < 0.2:
            assert ps.on_add_node() == len(g.nbrs)
            g.nbrs.append([])
        batch = []
        for _ in range(60):
            if rng.random() < 0.5:
                u, v = (int(x) for x in rng.integers(0, len(g.nbrs), 2))
                if (u, v) in edges:
                    continue
                edges.add((u, v))
                batch.append((INSERT, u, v))
            else:
                u, v = sorted(edges)[int(rng.integers(len(edges)))]
                edges.discard((u, v))
                batch.append((DELETE, u, v))
            g.apply(*batch[-1])
        ps.apply_events(*(np.array(c) for c in zip(*batch, strict=True)), g.neighbors_of)
        assert ps.num_nodes == len(g.nbrs)
        deg = np.array([len(us) for us in g.nbrs])
        seeds = rng.integers(0, len(g.nbrs), 40)
        check_sample(ps.sample(seeds), seeds, fanouts, edges, deg)
    for v in range(len(g.nbrs)):
        _check_reservoir(ps, g, v)


def test_add_node_grows_capacity() -> None:
    g = ListGraph(2, [(0, 1)])
    ps = PreSampler(*g.csr(), [2], seed=0)
    for want in range(2, 40):
        assert ps.on_add_node() == want
        g.nbrs.append([])
        ps.on_insert(want - 1, want)
        g.apply(INSERT, want - 1, want)
        ps.on_insert(0, want)
        g.apply(INSERT, 0, want)
    for v in range(40):
        _check_reservoir(ps, g, v)
    sg = ps.sample(np.array([39]))
    assert sorted(sg.nodes[sg.blocks[0].edge_index[0].numpy()].tolist()) == [0, 38]


@pytest.mark.parametrize("fanouts", [[5, 3], [10], [3, 3, 3]])
def test_static_graph_matches_neighbor_sampler_guarantees(small_store: Path, fanouts) -> None:
    graph = open_graph_store(small_store)
    indptr, indices = graph.csr()
    edges = edge_set(graph)
    deg = graph.in_degree()
    seeds = np.random.default_rng(2).integers(0, graph.num_nodes, 64)
    sg = PreSampler(indptr, indices, fanouts, seed=1).sample(seeds)
    check_sample(sg, seeds, fanouts, edges, deg)
    ref = NeighborSampler(graph, fanouts, seed=1).sample(seeds)
    np.testing.assert_array_equal(ref.seed_rows, sg.seed_rows)
    assert [b.n_dst for b in ref.blocks][-1] == sg.blocks[-1].n_dst
    np.testing.assert_array_equal(ref.blocks[-1].edge_index[1], sg.blocks[-1].edge_index[1])


@pytest.mark.parametrize(
    ("call", "field"),
    [
        (lambda g: PreSampler(*g, [-1]), "fanouts"),
        (lambda g: PreSampler(*g, [3, 0]), "fanouts"),
        (lambda g: PreSampler(*g, []), "fanouts"),
        (lambda g: PreSampler(g[0], g[1] + 5, [2]), "indices"),
        (lambda g: PreSampler(g[0] * 2, g[1], [2]), "indptr"),
        (lambda g: PreSampler(*g, [2]).sample(np.array([0, 4])), "seeds"),
        (lambda g: PreSampler(*g, [2]).sample(np.array([-1])), "seeds"),
        (lambda g: PreSampler(*g, [2]).sample(np.array([], dtype=np.int64)), "seeds"),
        (lambda g: PreSampler(*g, [2]).on_insert(0, 9), "dst"),
        (lambda g: PreSampler(*g, [2]).on_delete(7, 1, lambda v: []), "src"),
        (lambda g: PreSampler(*g, [2]).apply_events([2], [0], [1], None), "kinds"),
        (lambda g: PreSampler(*g, [2]).on_delete(0, 1, None), "neighbors_of"),
        (lambda g: PreSampler(*g, [2]).reservoir(0, 1), "hop"),
    ],
)
def test_bad_input_names_the_field(call, field: str) -> None:
    graph = ListGraph(4, [(0, 1), (2, 1), (3, 0)]).csr()
    with pytest.raises(InvalidInputError) as err:
        call(graph)
    assert err.value.field == field


def test_draws_depend_only_on_the_vertex_own_events() -> None:
    """Per-vertex randomness: other vertices' events, interleaved or not, never change v's draws.

    This is what lets DGS sampling workers, each applying only its partition's events, hold
    bit-identical reservoirs.
    """
    n = 80
    ei = random_simple_graph(n, 900, seed=11)
    edges = list(zip(ei[0].tolist(), ei[1].tolist(), strict=True))
    rng = np.random.default_rng(12)
    events, present = [], list(edges)
    for _ in range(800):
        if rng.random() < 0.5:
            u, v = present.pop(int(rng.integers(len(present))))
            events.append((DELETE, u, v))
        else:
            u, v = (int(x) for x in rng.integers(0, n, 2))
            present.append((u, v))
            events.append((INSERT, u, v))
    full, _, _ = _run(edges, n, events, [4, 2], seed=5, batched=True)
    for part in range(2):  # vertices v % 2 == part, their events only
        mine = [e for e in events if e[2] % 2 == part]
        ps, _, _ = _run(edges, n, mine, [4, 2], seed=5, batched=True)
        for v in range(part, n, 2):
            for hop in range(2):
                np.testing.assert_array_equal(ps.reservoir(v, hop), full.reservoir(v, hop))
