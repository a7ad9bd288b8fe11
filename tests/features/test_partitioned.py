"""Features placed across P feature-server Ray actors: every server reads exact rows, its own
locally and the rest from their owners, and counts what it read remotely."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from gnnserve.errors import InvalidInputError
from gnnserve.features import open_feature_store
from gnnserve.features.partitioned import FeatureCluster, FeatureServer, held_rows

pytestmark = [pytest.mark.distributed, pytest.mark.usefixtures("ray_instance")]
P = 3


def _owner(n: int) -> np.ndarray:
    owner = np.random.default_rng(0).integers(0, P, n)
    owner[:100] = -1  # replicated
    return owner


def test_every_server_reads_exact_rows_and_counts_remote_ones(small_store: Path) -> None:
    x = open_feature_store(small_store).get(np.arange(2000))
    owner = _owner(2000)
    cluster = FeatureCluster(small_store, owner, P)
    try:
        ids = np.random.default_rng(1).integers(0, 2000, 700)
        ids[:50] = ids[50]  # duplicates
        for p in range(P):
            store = cluster.store(p)
            torch.testing.assert_close(store.get(ids), x[ids], rtol=0, atol=0)
            remote = ~np.isin(owner[ids], [-1, p])
            assert store.stats.remote_rows == int(remote.sum())
            assert store.stats.local_rows == int((~remote).sum())
            assert store.stats.remote_bytes == int(remote.sum()) * x.shape[1] * 4
            assert store.stats.remote_calls == len(np.unique(owner[ids][remote]))
            assert store.stats.remote_share == pytest.approx(remote.mean())
        with pytest.raises(InvalidInputError, match="ids"):
            cluster.store(0).get(np.array([2000]))
        with pytest.raises(InvalidInputError, match="server"):
            cluster.store(P)
    finally:
        cluster.shutdown()


def test_a_server_holds_the_replicated_rows_and_its_own(small_store: Path) -> None:
    owner = _owner(2000)
    rows = held_rows(owner, 1)
    np.testing.assert_array_equal(rows, np.flatnonzero((owner == -1) | (owner == 1)))
    server = FeatureServer(str(small_store), rows)
    x = open_feature_store(small_store).get(rows[::7])
    np.testing.assert_array_equal(server.read(rows[::7]), x.numpy())
    with pytest.raises(InvalidInputError, match="ids"):
        server.read(np.flatnonzero(owner == 2)[:3])


@pytest.mark.parametrize(
    ("owner", "servers"),
    [(np.zeros(1999, np.int64), 3), (np.full(2000, 3), 3), (np.full(2000, -2), 3), (None, 0)],
)
def test_bad_placements_are_refused(small_store: Path, owner, servers) -> None:
    with pytest.raises(InvalidInputError, match="owner|servers"):
        FeatureCluster(small_store, np.zeros(2000, np.int64) if owner is None else owner, servers)


def test_routed_reads_go_to_the_server_holding_most_and_are_exact(small_store: Path) -> None:
    from gnnserve.features.partitioned import RoutedFeatures

    x = open_feature_store(small_store).get(np.arange(2000))
    owner = _owner(2000)
    store = RoutedFeatures(FeatureCluster(small_store, owner, P))
    try:
        rng = np.random.default_rng(2)
        for favoured in range(P):
            mostly = np.flatnonzero(owner == favoured)[:60]  # 60 of one server's rows
            others = rng.choice(np.flatnonzero(owner != favoured), 20)  # 20 of any other
            ids = np.concatenate([mostly, others, [0, 0]])  # and a replicated row, twice
            assert store.route(ids) == favoured
            before = store.stats.local_rows, store.stats.remote_calls
            torch.testing.assert_close(store.get(ids), x[ids], rtol=0, atol=0)
            held = np.isin(owner[ids], [-1, favoured])
            assert store.stats.local_rows - before[0] == int(held.sum())
            away = owner[ids][~held]
            assert store.stats.remote_calls - before[1] == len(np.unique(away))
        assert store.routed.tolist() == [1] * P
        assert store.get(np.empty(0, dtype=np.int64)).shape == (0, x.shape[1])
    finally:
        store.close()
