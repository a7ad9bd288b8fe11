"""Store writer, layout and validation: round trips through both backends, checksum, bad input."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gnnserve.data import layout
from gnnserve.data.importers import load_npz
from gnnserve.data.writer import GraphData, write_store
from gnnserve.errors import InvalidInputError, StoreFormatError
from gnnserve.features import open_feature_store
from gnnserve.graph import open_graph_store

DATASETS = Path(__file__).resolve().parents[2].parent / "shared" / "datasets"


@pytest.fixture(scope="module")
def cora() -> GraphData:
    path = DATASETS / "cora.npz"
    if not path.is_file():
        pytest.skip(f"shared dataset {path} not available (tests read ../shared/datasets)")
    return load_npz(path)


def _sorted_edges(src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    order = np.lexsort((dst, src))
    return np.stack([src[order], dst[order]])


def _store_edges(store_dir: Path, backend: str) -> np.ndarray:
    graph = open_graph_store(store_dir, backend)
    indptr, indices = graph.csr()
    dst = np.repeat(np.arange(graph.num_nodes), np.diff(np.asarray(indptr)))
    return _sorted_edges(np.asarray(indices, dtype=np.int64), dst)


@pytest.mark.parametrize("backend", ["memory", "mmap"])
def test_round_trip_gives_the_original_graph(cora: GraphData, tmp_path: Path, backend: str) -> None:
    meta = write_store(cora, tmp_path / "cora")
    assert (meta.num_nodes, meta.num_edges, meta.feature_dim) == (2708, 10556, 1433)
    assert meta.num_classes == 7 and meta.has_labels
    assert meta.masks == ["train_mask", "val_mask", "test_mask"]
    expected = _sorted_edges(cora.edge_index[0], cora.edge_index[1])
    np.testing.assert_array_equal(_store_edges(tmp_path / "cora", backend), expected)
    features = open_feature_store(tmp_path / "cora", backend)
    assert (features.num_nodes, features.dim) == (2708, 1433)
    np.testing.assert_array_equal(features.get(np.arange(2708)).numpy(), cora.x)
    np.testing.assert_array_equal(np.load(tmp_path / "cora" / layout.LABELS), cora.y)
    assert cora.train_mask is not None
    train = np.load(tmp_path / "cora" / "train_mask.npy")
    np.testing.assert_array_equal(train, cora.train_mask)
    assert int(train.sum()) == 140


def test_meta_json_round_trips(cora: GraphData, tmp_path: Path) -> None:
    written = write_store(cora, tmp_path / "s")
    assert layout.read_meta(tmp_path / "s") == written
    assert written.indices_dtype == "int32" and written.source.startswith("npz:cora.npz")


def test_checksum_verifies_and_detects_a_corrupted_byte(cora: GraphData, tmp_path: Path) -> None:
    store = tmp_path / "s"
    meta = write_store(cora, store)
    assert layout.verify_checksum(store).checksum == meta.checksum
    with open(store / layout.FEATURES, "r+b") as fh:
        fh.seek(12345)
        byte = fh.read(1)
        fh.seek(12345)
        fh.write(bytes([byte[0] ^ 0x01]))
    with pytest.raises(StoreFormatError, match="checksum mismatch"):
        layout.verify_checksum(store)


def test_truncated_file_is_a_store_format_error(cora: GraphData, tmp_path: Path) -> None:
    write_store(cora, tmp_path / "s")
    with open(tmp_path / "s" / layout.INDICES, "r+b") as fh:
        fh.truncate(100)
    with pytest.raises(StoreFormatError):
        open_graph_store(tmp_path / "s", "memory")
    with pytest.raises(StoreFormatError, match="not a gnnserve store"):
        open_graph_store(tmp_path / "missing")


def test_float16_features(cora: GraphData, tmp_path: Path) -> None:
    meta = write_store(cora, tmp_path / "s", feature_dtype="float16")
    assert meta.feature_dtype == "float16"
    assert (tmp_path / "s" / layout.FEATURES).stat().st_size == 2708 * 1433 * 2
    for backend in ("memory", "mmap"):
        got = open_feature_store(tmp_path / "s", backend).get(np.arange(2708)).numpy()
        assert got.dtype == np.float32
        np.testing.assert_allclose(got, cora.x, rtol=1e-3, atol=1e-4)


def _tiny() -> GraphData:
    """A valid 4-node graph to break one field at a time."""
    return GraphData(
        name="tiny",
        num_nodes=4,
        edge_index=np.array([[0, 1, 2, 3], [1, 2, 3, 0]]),
        x=np.ones((4, 3), dtype=np.float32),
        y=np.array([0, 1, 0, -1]),
        train_mask=np.array([True, False, False, False]),
    )


def _nan_x() -> np.ndarray:
    x = np.ones((4, 3), dtype=np.float32)
    x[2, 1] = np.nan
    return x


def _inf_x() -> np.ndarray:
    x = np.ones((4, 3), dtype=np.float32)
    x[3, 0] = np.inf
    return x


INVALID: dict[str, tuple[dict[str, Any], str]] = {
    "id_too_large": ({"edge_index": np.array([[0, 1], [1, 4]])}, "edge_index"),
    "negative_id": ({"edge_index": np.array([[0, -1], [1, 2]])}, "edge_index"),
    "edge_index_shape": ({"edge_index": np.array([[0, 1, 2]])}, "edge_index"),
    "no_edges": ({"edge_index": np.zeros((2, 0), dtype=np.int64)}, "edge_index"),
    "string_ids": ({"edge_index": np.array([["a", "b"], ["c", "d"]])}, "edge_index"),
    "fractional_ids": ({"edge_index": np.array([[0.5, 1.0], [1.0, 2.0]])}, "edge_index"),
    "empty_graph": ({"num_nodes": 0}, "num_nodes"),
    "feature_rows": ({"x": np.ones((3, 3), dtype=np.float32)}, "x"),
    "feature_1d": ({"x": np.ones(4, dtype=np.float32)}, "x"),
    "feature_no_columns": ({"x": np.ones((4, 0), dtype=np.float32)}, "x"),
    "feature_nan": ({"x": _nan_x()}, "x"),
    "feature_inf": ({"x": _inf_x()}, "x"),
    "label_shape": ({"y": np.array([0, 1])}, "y"),
    "label_float": ({"y": np.array([0.0, 1.0, 0.0, 1.0])}, "y"),
    "label_below_minus_one": ({"y": np.array([0, -2, 0, 1])}, "y"),
    "mask_shape": ({"train_mask": np.array([True])}, "train_mask"),
}


@pytest.mark.parametrize("case", sorted(INVALID))
def test_invalid_input_names_the_field(case: str, tmp_path: Path) -> None:
    changes, field = INVALID[case]
    with pytest.raises(InvalidInputError) as info:
        write_store(replace(_tiny(), **changes), tmp_path / "s")
    assert info.value.field == field
    assert not (tmp_path / "s" / layout.META).exists()


def test_bad_dtype_and_float16_overflow(tmp_path: Path) -> None:
    with pytest.raises(InvalidInputError) as info:
        write_store(_tiny(), tmp_path / "a", feature_dtype="float64")
    assert info.value.field == "dtype"
    big = replace(_tiny(), x=np.full((4, 3), 1e6, dtype=np.float32))
    with pytest.raises(InvalidInputError) as info:
        write_store(big, tmp_path / "b", feature_dtype="float16")
    assert info.value.field == "dtype"


@pytest.mark.parametrize("value", [65520.0, -65520.0, 1e5, 3e38])
def test_values_overflowing_float16_are_refused(tmp_path: Path, value: float) -> None:
    x = np.ones((4, 3), dtype=np.float32)
    x[2, 1] = value  # finite in float32, inf in float16 (65520 rounds up to inf)
    with pytest.raises(InvalidInputError) as info:
        write_store(replace(_tiny(), x=x), tmp_path / "s", feature_dtype="float16")
    assert info.value.field == "dtype" and "node 2" in info.value.message
    assert not (tmp_path / "s" / layout.META).exists()


def test_float16_keeps_values_that_round_to_its_largest(tmp_path: Path) -> None:
    x = np.ones((4, 3), dtype=np.float32)
    x[1] = [65519.0, -65510.0, 0.5]  # beyond float16's max 65504, but they round to it
    write_store(replace(_tiny(), x=x), tmp_path / "s", feature_dtype="float16")
    got = open_feature_store(tmp_path / "s").get(np.arange(4)).numpy()
    np.testing.assert_array_equal(got, x.astype(np.float16).astype(np.float32))
    assert got[1].tolist() == [65504.0, -65504.0, 0.5]


@pytest.mark.parametrize("value", [1e39, -1e300])
def test_float64_values_overflowing_float32_are_refused(tmp_path: Path, value: float) -> None:
    x = np.ones((4, 3), dtype=np.float64)
    x[3, 2] = value
    with pytest.raises(InvalidInputError) as info:
        write_store(replace(_tiny(), x=x), tmp_path / "s")
    assert info.value.field == "x"
    assert "float32" in info.value.message and "node 3" in info.value.message


def test_existing_output_needs_overwrite(tmp_path: Path) -> None:
    write_store(_tiny(), tmp_path / "s")
    with pytest.raises(InvalidInputError) as info:
        write_store(_tiny(), tmp_path / "s")
    assert info.value.field == "out"
    meta = write_store(replace(_tiny(), name="again"), tmp_path / "s", overwrite=True)
    assert layout.read_meta(tmp_path / "s").name == "again" == meta.name


def test_tiny_store_counts(tmp_path: Path) -> None:
    meta = write_store(_tiny(), tmp_path / "s")
    assert meta.num_classes == 2 and meta.masks == ["train_mask"]
    graph = open_graph_store(tmp_path / "s", "mmap")
    np.testing.assert_array_equal(graph.in_degree(), [1, 1, 1, 1])
    np.testing.assert_array_equal(graph.neighbors(0), [3])
