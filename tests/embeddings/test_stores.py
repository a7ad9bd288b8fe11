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
    load_embeddings_for,
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
    with pytest.raises(StaleEmbeddingsError, match="model"):
        load_embeddings_for(good, "m@other", graph)
    stale = tmp_path / "stale"
    _write(stale, graph_version="an-older-graph")
    with pytest.raises(StaleEmbeddingsError, match="an-older-graph") as info:
        load_embeddings_for(stale, "m@abc", graph, "mmap")
    assert info.value.field == "graph_version"
    # right versions but another node count (the graph has 2000 nodes, the PEs 50)
    with pytest.raises(StaleEmbeddingsError, match="2000"):
        load_embeddings_for(good, "m@abc", graph)
    pes = open_embeddings(good)
    pes.check("m@abc", graph.version)  # open_embeddings alone does not check
    with pytest.raises(StaleEmbeddingsError):
        pes.check("m@abc", "other")


def test_load_embeddings_for_accepts_matching_pes(tmp_path: Path) -> None:
    class _Graph:  # the two attributes load_embeddings_for reads
        version = "g1"
        num_nodes = N

    arrays = _write(tmp_path)
    pes = load_embeddings_for(tmp_path, "m@abc", _Graph(), "mmap")  # type: ignore[arg-type]
    np.testing.assert_array_equal(pes.layer(2), arrays[1])


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
