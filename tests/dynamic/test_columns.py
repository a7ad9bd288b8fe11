"""Columnar (bulk) update batches against the JSON path as reference: the same errors for the
same rows, the same graph after applying, the same graph after replaying binary log frames."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from gnnserve.dynamic import bulk, columns
from gnnserve.dynamic.store import DynamicStore
from gnnserve.dynamic.updates import UpdateRejectedError
from gnnserve.dynamic.wal import replay
from gnnserve.errors import InvalidInputError
from gnnserve.features import open_feature_store
from gnnserve.graph import open_graph_store

DIM = 16


def _open(store: Path, log: Path) -> DynamicStore:
    return DynamicStore(open_graph_store(store), open_feature_store(store), log, fsync="never")


def _table(ops: list[dict]) -> pa.Table:
    """The Arrow form of JSON operations, as a client would build it (nulls where unused)."""
    features = [op.get("features") for op in ops]
    width = next((len(f) for f in features if f is not None), DIM)
    flat = [x for f in features for x in (f if f is not None else [0.0] * width)]
    lists = pa.FixedSizeListArray.from_arrays(pa.array(flat, pa.float64()), width)
    null = pa.array([f is None for f in features])
    return pa.table(
        {
            "op": pa.array([op.get("op") for op in ops], pa.string()),
            "src": pa.array([op.get("src") for op in ops], pa.int64()),
            "dst": pa.array([op.get("dst") for op in ops], pa.int64()),
            "node": pa.array([op.get("node") for op in ops], pa.int64()),
            "features": pc.if_else(null, pa.nulls(len(ops), lists.type), lists),
        }
    )


def _columns(ops: list[dict]) -> columns.ColumnBatch:
    return bulk.read_stream(bulk.to_stream(_table(ops)))


def _random_ops(rng: np.random.Generator, store: DynamicStore, bad: float) -> list[dict]:
    """A batch of every kind of operation; with probability ``bad`` an operation is invalid
    (unknown op, node beyond the graph, missing edge, non-finite or missing features)."""
    n, ops = store.graph.num_nodes, []
    indptr, indices = store.graph.csr()
    for _ in range(int(rng.integers(1, 60))):
        r, wrong = rng.random(), rng.random() < bad
        if r < 0.35:
            u, v = (int(x) for x in rng.integers(0, n, 2))
            ops.append({"op": "add_edge", "src": u + (n + 5) * wrong, "dst": v})
        elif r < 0.7:
            v = int(rng.integers(indptr.size - 1))
            if indptr[v + 1] > indptr[v] and not wrong:
                u = int(indices[rng.integers(indptr[v], indptr[v + 1])])
            else:
                u = int(rng.integers(n))  # most likely no such edge
            ops.append({"op": "delete_edge", "src": u, "dst": v})
        elif r < 0.85:
            feats = rng.standard_normal(DIM).tolist()
            if wrong:
                feats[3] = float("inf")
            ops.append({"op": "add_node", "features": feats})
            n += 1
        elif r < 0.97:
            node = int(rng.integers(n))
            ops.append({"op": "upsert_features", "node": node, "features": [1.0] * DIM})
            if wrong:
                del ops[-1]["features"]
        else:
            ops.append({"op": "rename" if wrong else "add_edge", "src": 0, "dst": 1})
    return ops


def test_columns_report_exactly_the_rows_json_reports(small_store: Path, tmp_path) -> None:
    store = _open(small_store, tmp_path / "log")
    g = store.graph
    rng = np.random.default_rng(0)
    compared = 0
    for _ in range(40):
        ops = _random_ops(rng, store, bad=0.08)
        try:
            store._parse(ops)
            want = None
        except UpdateRejectedError as exc:
            want = exc.errors
        try:
            columns.check_columns(_columns(ops), g.num_nodes, DIM, g.count_edges_many)
            got = None
        except UpdateRejectedError as exc:
            got = exc.errors
        if want is not None:
            compared += 1
        # the messages agree except how a non-finite value prints (JSON's own text vs float32)
        strip = [{**e, "message": e["message"].split(" is ")[0]} for e in want or []]
        assert [{**e, "message": e["message"].split(" is ")[0]} for e in got or []] == strip
    assert compared >= 10
    store.close()


def test_bulk_and_json_batches_build_the_same_store(small_store: Path, tmp_path) -> None:
    by_json, by_arrow = _open(small_store, tmp_path / "a"), _open(small_store, tmp_path / "b")
    rng = np.random.default_rng(1)
    for _ in range(25):
        ops = _random_ops(rng, by_json, bad=0.0)
        try:
            expected = by_json.apply(ops)
        except UpdateRejectedError:  # a delete drawn twice in one batch: both must refuse
            with pytest.raises(UpdateRejectedError):
                by_arrow.apply_columns(_columns(ops))
            continue
        got = by_arrow.apply_columns(_columns(ops))
        assert got == expected
    by_arrow.close()
    replayed = _open(small_store, tmp_path / "b")  # the binary frames rebuild the same graph
    assert replayed.replayed == by_json.graph.seq
    for store in (by_arrow, replayed):
        for a, b in zip(store.graph.csr(), by_json.graph.csr(), strict=True):
            np.testing.assert_array_equal(a, b)
        ids = np.arange(by_json.graph.num_nodes)
        np.testing.assert_array_equal(store.features.get(ids), by_json.features.get(ids))
    by_json.close()
    replayed.close()


def test_encode_round_trips_and_refuses_a_short_payload() -> None:
    ops = [
        {"op": "add_node", "features": [2.0] * 4},
        {"op": "add_edge", "src": 1, "dst": 3},
        {"op": "upsert_features", "node": 2, "features": [-1.0] * 4},
    ]
    batch = columns.from_ops(ops, 4)
    again = columns.decode(columns.encode(batch))
    for a, b in zip(columns._arrays(batch), columns._arrays(again), strict=True):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(ValueError, match="length"):
        columns.decode(columns.encode(batch)[:-4])


@pytest.mark.parametrize(
    ("table", "field"),
    [
        (pa.table({"src": [1], "dst": [2]}), "columns"),
        (pa.table({"op": ["add_edge"], "src": ["1"], "dst": [2]}), "src"),
        (pa.table({"op": ["add_edge"], "src": [1], "dst": [2], "weight": [1.0]}), "columns"),
        (pa.table({"op": [1.5], "src": [1], "dst": [2]}), "op"),
    ],
)
def test_malformed_columns_are_named(table: pa.Table, field: str) -> None:
    with pytest.raises(InvalidInputError) as info:
        bulk.read_stream(bulk.to_stream(table))
    assert info.value.field == field


def test_a_body_that_is_not_arrow_is_refused() -> None:
    with pytest.raises(InvalidInputError, match="not an Arrow IPC stream"):
        bulk.read_stream(b'{"ops": []}')


def test_csv_rows_read_as_the_same_batch(tmp_path) -> None:
    path = tmp_path / "u.csv"
    path.write_text(
        "op,src,dst,node,f0,f1\nadd_edge,1,2,,,\nadd_node,,,,0.5,1.5\n"
        "upsert_features,,,3,2.0,-1.0\ndelete_edge,1,2,,,\n"
    )
    (table,) = bulk.read_file(path, batch_rows=10)
    batch = bulk.from_table(table)
    assert batch.op.tolist() == [0, 2, 3, 1]
    assert batch.src.tolist()[::3] == [1, 1] and batch.node[2] == 3
    np.testing.assert_array_equal(batch.features, [[0.5, 1.5], [2.0, -1.0]])
    assert batch.features_missing is None


def test_a_bulk_batch_whose_delete_fails_changes_nothing(small_store: Path, tmp_path) -> None:
    """The delete check runs by applying to the unread copy: a failure rebuilds that copy, so
    the store, its log and its readers are as before, and every refused row is named."""
    store = _open(small_store, tmp_path / "log")
    store.apply([{"op": "add_edge", "src": 4, "dst": 9}])
    version, edges, n = store.graph.version, store.graph.csr(), store.graph.num_nodes
    features = store.features.get(np.arange(n))
    log_size = (tmp_path / "log").stat().st_size
    ops = [
        {"op": "add_node", "features": [5.0] * DIM},
        {"op": "add_edge", "src": n, "dst": 9},
        {"op": "delete_edge", "src": 4, "dst": 9},
        {"op": "delete_edge", "src": 4, "dst": 9},  # the second copy does not exist
        {"op": "upsert_features", "node": 9, "features": [7.0] * DIM},
        {"op": "delete_edge", "src": 5, "dst": 9},
    ]
    missing_5 = 5 not in store.graph.neighbors(9)
    with pytest.raises(UpdateRejectedError) as info:
        store.apply_columns(_columns(ops))
    assert [e["index"] for e in info.value.errors] == [3, 5] if missing_5 else [3]
    for side in store._replicas.both():  # both copies, the one tried on included
        assert side.graph.version == version and side.graph.num_nodes == n
        for a, b in zip(side.graph.csr(), edges, strict=True):
            np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(side.features.get(np.arange(n)), features)
        assert not side.listeners
    assert (tmp_path / "log").stat().st_size == log_size
    assert store.apply_columns(_columns(ops[:3])).seq == 2  # the store goes on
    store.close()


# -- JSON operations straight to columns (the update API's path) -------------------------------

EDGE_NUMBERS = [0.1, -2, 2**60, 1e-45, 3.4028234e38, -0.0, 1 / 3, 7]  # ints, denormals, extremes


def _columns_of_parse(store: DynamicStore, ops: list[dict]) -> columns.ColumnBatch:
    """The reference: op-by-op validation, then the normalised operations as columns."""
    return columns.from_ops(store._parse(ops), DIM)


def test_json_columns_equal_the_op_by_op_parse(small_store: Path, tmp_path) -> None:
    store = _open(small_store, tmp_path / "log")
    rng = np.random.default_rng(2)
    for i in range(40):
        ops = _random_ops(rng, store, bad=0.0)
        ops.append({"op": "add_node", "features": EDGE_NUMBERS * (DIM // len(EDGE_NUMBERS))})
        ops.append({"op": "add_edge", "src": 1, "dst": 2, "note": "extra keys are ignored"})
        try:
            want = _columns_of_parse(store, ops)
        except UpdateRejectedError:  # a delete drawn twice: from_json does not count edges
            continue
        got = columns.from_json(ops, DIM)
        assert got is not None, f"batch {i} fell back to the op-by-op path"
        for name in ("op", "src", "dst", "node", "features"):
            a, b = getattr(got, name), getattr(want, name)
            assert a.dtype == b.dtype and a.tobytes() == b.tobytes(), name  # bit for bit
    store.close()


@pytest.mark.parametrize(
    "ops",
    [
        [],
        [["add_edge", 1, 2]],
        [{"src": 1, "dst": 2}],
        [{"op": "rename", "src": 1, "dst": 2}],
        [{"op": ["add_edge"], "src": 1, "dst": 2}],
        [{"op": "add_edge", "src": True, "dst": 2}],
        [{"op": "add_edge", "src": 1.0, "dst": 2}],
        [{"op": "delete_edge", "src": 1}],
        [{"op": "upsert_features", "node": "3", "features": [0.0] * DIM}],
        [{"op": "add_edge", "src": 2**64, "dst": 2}],
        [{"op": "add_node", "features": [0.0] * (DIM - 1)}],
        [{"op": "add_node", "features": [True] + [0.0] * (DIM - 1)}],
        [{"op": "add_node", "features": [None] * DIM}],
        [{"op": "add_node", "features": [1e39] + [0.0] * (DIM - 1)}],
        [{"op": "add_node", "features": [10**400] + [0.0] * (DIM - 1)}],
        [{"op": "add_node"}],
    ],
)
def test_non_plain_operations_are_left_to_the_op_by_op_check(ops: list) -> None:
    assert columns.from_json(ops, DIM) is None


def test_json_batches_are_refused_exactly_as_op_by_op(small_store: Path, tmp_path) -> None:
    """Through ``DynamicStore.apply`` (columns first): every refused batch names the problems
    ``parse_batch`` names, word for word; every accepted one is what it accepts."""
    store = _open(small_store, tmp_path / "log")
    reference = _open(small_store, tmp_path / "ref")
    rng = np.random.default_rng(3)
    refused = 0
    for _ in range(40):
        ops = _random_ops(rng, store, bad=0.08)
        try:
            want = reference._parse(ops)
        except UpdateRejectedError as exc:
            refused += 1
            with pytest.raises(UpdateRejectedError) as got:
                store.apply(ops)
            assert got.value.errors == exc.errors
            continue
        assert store.apply(ops) == reference.apply(want)
    assert refused >= 10
    for a, b in zip(store.graph.csr(), reference.graph.csr(), strict=True):
        np.testing.assert_array_equal(a, b)
    store.close()
    reference.close()


def test_a_plain_json_batch_is_logged_as_one_binary_frame(small_store: Path, tmp_path) -> None:
    store = _open(small_store, tmp_path / "log")
    ops = [{"op": "add_edge", "src": 1, "dst": 2}, {"op": "add_node", "features": [0.5] * DIM}]
    store.apply(ops)
    store.close()
    records = list(replay(tmp_path / "log"))
    assert [seq for seq, _ in records] == [0, 1]
    payload = records[1][1]
    assert isinstance(payload, bytes)  # the columns, not a JSON line
    logged = columns.decode(payload)
    np.testing.assert_array_equal(logged.op, [columns.ADD_EDGE, columns.ADD_NODE])
    np.testing.assert_array_equal(logged.features, np.full((1, DIM), 0.5, np.float32))
