"""On-demand sampling from a remote CSR equals local sampling; it reads only what it samples."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from gnnserve.data.blobs import open_blobs
from gnnserve.data.publish import publish
from gnnserve.data.writer import GraphData, write_store
from gnnserve.errors import InvalidInputError
from gnnserve.graph import open_graph_store
from gnnserve.graph.remote import RemoteCSR
from gnnserve.sampling.ondemand import OnDemandSampler
from gnnserve.sampling.sampler import NeighborSampler
from tests.conftest import random_simple_graph


@pytest.mark.parametrize("fanouts", [[5, 3], [-1, 2], [2, 2, 2]])
def test_equals_the_local_sampler(small_store: Path, fanouts: list[int]) -> None:
    local = NeighborSampler(open_graph_store(small_store), fanouts)
    remote = OnDemandSampler(RemoteCSR(open_blobs(small_store.as_uri())), fanouts)
    graph = open_graph_store(small_store)
    for rng_seed, seeds in enumerate([[3], [7, 7, 100], list(range(0, 2000, 97))]):
        ids = np.array(seeds, dtype=np.int64)
        want = local.sample(ids, rng_seed=rng_seed)
        got = remote.sample(ids, rng_seed=rng_seed)
        np.testing.assert_array_equal(got.subgraph.nodes, want.nodes)
        np.testing.assert_array_equal(got.subgraph.seed_rows, want.seed_rows)
        assert got.subgraph.num_seeds == want.num_seeds
        for a, b in zip(got.subgraph.blocks, want.blocks, strict=True):
            assert (a.n_src, a.n_dst) == (b.n_src, b.n_dst)
            np.testing.assert_array_equal(a.edge_index.numpy(), b.edge_index.numpy())
        np.testing.assert_array_equal(got.degree, graph.in_degree(got.subgraph.nodes))


@pytest.fixture(scope="module")
def published(small_store: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """small_store published to a directory: with its self-loop table."""
    out = tmp_path_factory.mktemp("published")
    publish(small_store, str(out), progress=False)
    return out


def test_each_vertex_is_expanded_once(published: Path) -> None:
    sampler = OnDemandSampler(RemoteCSR(open_blobs(str(published))), [4, 4])
    got = sampler.sample(np.array([11, 12]), rng_seed=1)
    blocks = got.subgraph.blocks
    # hop 0 expands the seeds, hop 1 the nodes hop 0 reached; the last round reads degrees only
    assert [h.expanded for h in got.hops] == [2, blocks[1].n_src - 2, 0]
    assert got.requests == sum(h.requests for h in got.hops) > 0


def _store(tmp: Path, n: int, seed: int) -> Path:
    ei = random_simple_graph(n, 8 * n, seed=seed)
    x = np.zeros((n, 4), dtype=np.float32)
    out = tmp / f"g{n}"
    write_store(GraphData(f"g{n}", n, ei, x), out)
    publish(out, str(tmp / f"p{n}"), progress=False)
    return tmp / f"p{n}"


def test_bytes_read_follow_the_sample_not_the_graph(tmp_path: Path) -> None:
    """Bytes read = 16 per row-index pair (at most) + 4 per neighbour of an expanded vertex,
    whatever the graph size: a 10x larger graph with the same degree reads about the same."""
    reads = []
    for n in (20_000, 200_000):
        remote = RemoteCSR(open_blobs(str(_store(tmp_path, n, seed=n))))
        sampler = OnDemandSampler(remote, [10, 5])
        total = 0
        for q in range(20):
            got = sampler.sample(np.array([q * 37 % n]), rng_seed=q)
            expanded = got.subgraph.blocks[-1].n_src  # seeds + hop-1 nodes
            bound = 16 * len(got.subgraph.nodes) + 4 * int(got.degree[:expanded].sum())
            assert got.bytes_read <= bound
            total += got.bytes_read
        reads.append(total)
        graph_bytes = remote.blobs.size("indptr.bin") + remote.blobs.size("indices.bin")
        assert total < graph_bytes / 20
    assert 0.5 < reads[1] / reads[0] < 2.0


def test_bad_seeds_are_refused(small_store: Path) -> None:
    sampler = OnDemandSampler(RemoteCSR(open_blobs(small_store.as_uri())), [2])
    with pytest.raises(InvalidInputError, match="seeds"):
        sampler.sample(np.array([2000]))
    with pytest.raises(InvalidInputError, match="empty"):
        sampler.sample(np.array([], dtype=np.int64))


def test_without_a_loop_table_loops_are_counted_in_fetched_rows(tmp_path: Path) -> None:
    """A store served where it was written (no self_loops.npy): the last hop's rows are read
    whole and the self loops counted in them give the exact GCN degree."""
    n = 500
    ei = random_simple_graph(n, 4000, seed=3)
    loops = np.array([[7, 7, 42], [7, 7, 42]])  # vertex 7 has two self loops, 42 one
    write_store(
        GraphData("loops", n, np.concatenate([ei, loops], axis=1), np.zeros((n, 2), np.float32)),
        tmp_path / "s",
    )
    local = open_graph_store(tmp_path / "s")
    sampler = OnDemandSampler(RemoteCSR(open_blobs(str(tmp_path / "s"))), [-1, -1])
    got = sampler.sample(np.array([7, 42, 3]), rng_seed=0)
    assert got.loops is not None and got.hops[-1].expanded > 0
    assert got.loops[got.subgraph.seed_rows].tolist() == [2, 1, 0]  # the writer kept them
    want = local.in_degree_without_self_loops()[got.subgraph.nodes]
    np.testing.assert_array_equal(got.degree - got.loops, want)
