"""The on-disk embeddings format: round trip, backends, staleness and corrupt files."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from gnnserve.embeddings.base import EmbeddingMeta
from gnnserve.embeddings.stores import (
    EMBEDDING_STORES,
    create_layer,
    default_embeddings_dir,
    layer_file,
    open_embeddings,
    read_meta,
    write_meta,
)
from gnnserve.errors import InvalidInputError, StaleEmbeddingsError, StoreFormatError
from gnnserve.graph import open_graph_store

N = 50
DIMS = [7, 3]


def _write(directory: Path, graph_version: str = "g1", seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    arrays = [rng.standard_normal((N, d)).astype(np.float32) for d in DIMS]
    for layer, arr in enumerate(arrays, start=1):
        out = create_layer(directory, layer, N, arr.shape[1])
        out[:] = arr
        assert isinstance(out, np.memmap)
        out.flush()
    write_meta(directory, EmbeddingMeta("m@abc", graph_version, N, list(DIMS)))
    return arrays


def test_backends_are_registered() -> None:
    assert EMBEDDING_STORES.names() == ["memory", "mmap"]


def test_round_trip_memory_and_mmap_give_identical_arrays(tmp_path: Path) -> None:
    arrays = _write(tmp_path)
    doc = json.loads((tmp_path / "meta.json").read_text())
    assert doc["format"] == "gnnserve-embeddings" and doc["format_version"] == 1
    assert doc["dims"] == DIMS and doc["num_nodes"] == N and doc["dtype"] == "float32"
    # raw little-endian float32, nothing else in the file
    raw = np.fromfile(tmp_path / "layer1.bin", dtype="<f4").reshape(N, DIMS[0])
    np.testing.assert_array_equal(raw, arrays[0])
    mem, mapped = open_embeddings(tmp_path, "memory"), open_embeddings(tmp_path, "mmap")
    assert mem.meta == mapped.meta == read_meta(tmp_path)
    assert mem.num_layers == 2
    for layer, want in enumerate(arrays, start=1):
        np.testing.assert_array_equal(mem.layer(layer), want)
        np.testing.assert_array_equal(mapped.layer(layer), want)
        assert isinstance(mapped.layer(layer), np.memmap)
        assert not isinstance(mem.layer(layer), np.memmap)
        assert not mem.layer(layer).flags.writeable and not mapped.layer(layer).flags.writeable
    ids = np.array([3, 0, 49, 3])
    assert mem.get(2, ids).dtype == mapped.get(2, ids).dtype
    np.testing.assert_array_equal(mem.get(2, ids).numpy(), arrays[1][ids])
    np.testing.assert_array_equal(mapped.get(2, ids).numpy(), arrays[1][ids])


def test_unknown_backend_is_an_input_error(tmp_path: Path) -> None:
    _write(tmp_path)
    with pytest.raises(InvalidInputError, match="memory"):
        open_embeddings(tmp_path, "gpu")


def test_default_directory_is_under_the_store(tmp_path: Path) -> None:
    got = default_embeddings_dir(tmp_path / "store", tmp_path / "ckpts" / "sage-3")
    assert got == tmp_path / "store" / "embeddings" / "sage-3"


def test_check_refuses_another_model_or_graph(small_store: Path, tmp_path: Path) -> None:
    graph = open_graph_store(small_store)
    good = tmp_path / "good"
    _write(good, graph_version=graph.version)
    pes = open_embeddings(good)
    pes.check("m@abc", graph.version)  # the right model and graph: accepted
    with pytest.raises(StaleEmbeddingsError, match="model"):
        pes.check("m@other", graph.version)
    stale = tmp_path / "stale"
    _write(stale, graph_version="an-older-graph")
    with pytest.raises(StaleEmbeddingsError, match="an-older-graph") as info:
        open_embeddings(stale, "mmap").check("m@abc", graph.version)
    assert info.value.field == "graph_version"


@pytest.mark.parametrize("backend", ["memory", "mmap"])
def test_truncated_or_missing_layer_file_names_the_file(tmp_path: Path, backend: str) -> None:
    _write(tmp_path)
    path = tmp_path / layer_file(2)
    path.write_bytes(path.read_bytes()[:-4])
    with pytest.raises(StoreFormatError, match="layer2.bin") as info:
        open_embeddings(tmp_path, backend)
    assert "bytes" in info.value.message
    path.unlink()
    with pytest.raises(StoreFormatError, match="layer2.bin.*missing"):
        open_embeddings(tmp_path, backend)


def _meta_doc(tmp_path: Path) -> dict[str, object]:
    _write(tmp_path)
    return json.loads((tmp_path / "meta.json").read_text())


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"format": "gnnserve-checkpoint"}, "not a gnnserve-embeddings"),
        ({"format_version": 2}, "format version 2"),
        ({"dims": []}, "dims"),
        ({"dims": [7, 0]}, "dims"),
        ({"dims": "7,3"}, "dims"),
        ({"num_nodes": -1}, "num_nodes"),
        ({"num_nodes": True}, "num_nodes"),
        ({"dtype": "float16"}, "dtype"),
        ({"model_version": ""}, "model_version"),
        ({"surprise": 1}, "malformed"),
        ({"model_version": None, "graph_version": 3}, "model_version.*graph_version"),
    ],
)
def test_bad_meta_is_a_format_error_naming_the_file(
    tmp_path: Path, change: dict[str, object], message: str
) -> None:
    doc = {**_meta_doc(tmp_path), **change}
    (tmp_path / "meta.json").write_text(json.dumps(doc))
    with pytest.raises(StoreFormatError, match=message) as info:
        open_embeddings(tmp_path)
    assert "meta.json" in info.value.message


def test_missing_key_unreadable_or_absent_meta(tmp_path: Path) -> None:
    doc = _meta_doc(tmp_path)
    del doc["graph_version"]
    (tmp_path / "meta.json").write_text(json.dumps(doc))
    with pytest.raises(StoreFormatError, match="meta.json is malformed"):
        open_embeddings(tmp_path)
    (tmp_path / "meta.json").write_text("{not json")
    with pytest.raises(StoreFormatError, match="meta.json is unreadable"):
        open_embeddings(tmp_path)
    (tmp_path / "meta.json").write_text("[1, 2]")
    with pytest.raises(StoreFormatError, match="meta.json"):
        open_embeddings(tmp_path)
    (tmp_path / "meta.json").unlink()
    with pytest.raises(StoreFormatError, match="meta.json missing"):
        open_embeddings(tmp_path)
    with pytest.raises(StoreFormatError, match="missing"):
        open_embeddings(tmp_path / "nowhere")


def test_empty_graph_round_trips(tmp_path: Path) -> None:
    for layer, dim in enumerate(DIMS, start=1):
        assert create_layer(tmp_path, layer, 0, dim).shape == (0, dim)
    write_meta(tmp_path, EmbeddingMeta("m@abc", "g", 0, list(DIMS)))
    pes = open_embeddings(tmp_path, "mmap")
    assert pes.layer(2).shape == (0, 3)


def test_serving_check_refuses_pes_of_another_node_count(tmp_path: Path) -> None:
    from types import SimpleNamespace

    from gnnserve.embeddings.base import check_serving_stores
    from gnnserve.models.zoo import ModelConfig

    _write(tmp_path)  # N = 50 rows, dims [7, 3]
    config = ModelConfig(arch="sage", in_dim=4, hidden_dim=7, out_dim=3, num_layers=2)
    pes = open_embeddings(tmp_path)
    # the two attributes check_serving_stores reads of a feature store
    features = SimpleNamespace(num_nodes=N, dim=4)
    check_serving_stores(config, N, features, pes)  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError, match="50 rows, the graph has 60") as info:
        features = SimpleNamespace(num_nodes=60, dim=4)
        check_serving_stores(config, 60, features, pes)  # type: ignore[arg-type]
    assert info.value.field == "embeddings"
