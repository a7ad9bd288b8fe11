"""Importers (npz, PyG Data, edge-list CSV) and the ``prepare`` command, on the shared datasets."""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pytest
import torch

from gnnserve.data import edgelist, importers, layout, prepare
from gnnserve.data.writer import write_store
from gnnserve.errors import InvalidInputError

DATASETS = Path(__file__).resolve().parents[2].parent / "shared" / "datasets"


def dataset(name: str) -> Path:
    """Path of a shared dataset file; skips the test when it is not there."""
    path = DATASETS / name
    if not path.is_file():
        pytest.skip(f"shared dataset {path} not available (tests read ../shared/datasets)")
    return path


# --- npz ------------------------------------------------------------------------------------


def test_npz_sparse_features_are_densified() -> None:
    path = dataset("cora.npz")
    g = importers.load_npz(path)
    raw = np.load(path)
    assert g.name == "cora" and g.num_nodes == 2708 and g.x.shape == (2708, 1433)
    assert g.x.dtype == np.float32
    assert np.count_nonzero(g.x) == raw["x_data"].size
    row = 5
    lo, hi = raw["x_indptr"][row], raw["x_indptr"][row + 1]
    np.testing.assert_array_equal(np.flatnonzero(g.x[row]), np.sort(raw["x_indices"][lo:hi]))
    assert g.y is not None and g.train_mask is not None and int(g.train_mask.sum()) == 140
    assert "npz:cora.npz" in g.source


def test_npz_structure_only_gets_degree_features() -> None:
    g = importers.load_npz(dataset("wiki_vote.npz"))
    assert g.x.shape == (8298, 16) and "degree(dim=16)" in g.source
    out_deg = np.bincount(g.edge_index[0], minlength=g.num_nodes)
    np.testing.assert_allclose(g.x[:, 1], np.log1p(out_deg), rtol=1e-6)
    np.testing.assert_array_equal(g.x[:, 2:].sum(axis=1), np.ones(g.num_nodes))


def test_npz_structure_only_random_features_are_seeded() -> None:
    path = dataset("wiki_vote.npz")
    a = importers.load_npz(path, "random", feature_dim=8, seed=3)
    b = importers.load_npz(path, "random", feature_dim=8, seed=3)
    c = importers.load_npz(path, "random", feature_dim=8, seed=4)
    assert a.x.shape == (8298, 8) and "random(dim=8,seed=3)" in a.source
    np.testing.assert_array_equal(a.x, b.x)
    assert not np.array_equal(a.x, c.x)
    with pytest.raises(InvalidInputError) as info:
        importers.load_npz(path, "bogus")
    assert info.value.field == "structure_features"


def _npz_copy(tmp_path: Path, **changes: object) -> Path:
    arrays = dict(np.load(dataset("cora.npz")))
    arrays.update(changes)
    arrays = {k: v for k, v in arrays.items() if v is not None}
    path = tmp_path / "bad.npz"
    np.savez(path, **arrays)
    return path


def test_npz_bad_files(tmp_path: Path) -> None:
    with pytest.raises(InvalidInputError, match="not found") as info:
        importers.load_npz(tmp_path / "missing.npz")
    assert info.value.field == "input"
    (tmp_path / "junk.npz").write_bytes(b"not a zip file")
    with pytest.raises(InvalidInputError, match="cannot read") as info:
        importers.load_npz(tmp_path / "junk.npz")
    assert info.value.field == "input"
    with pytest.raises(InvalidInputError) as info:
        importers.load_npz(_npz_copy(tmp_path, edge_index=None))
    assert info.value.field == "edge_index"


def test_npz_inconsistent_sparse_features(tmp_path: Path) -> None:
    raw = np.load(dataset("cora.npz"))
    bad_indices = raw["x_indices"].copy()
    bad_indices[7] = 99_999  # column outside x_shape
    with pytest.raises(InvalidInputError) as info:
        importers.load_npz(_npz_copy(tmp_path, x_indices=bad_indices))
    assert info.value.field == "x"


def test_npz_out_of_range_ids_fail_at_write(tmp_path: Path) -> None:
    ei = np.load(dataset("cora.npz"))["edge_index"].copy()
    ei[1, 3] = 2708
    g = importers.load_npz(_npz_copy(tmp_path, edge_index=ei))
    with pytest.raises(InvalidInputError, match="2708") as info:
        write_store(g, tmp_path / "s")
    assert info.value.field == "edge_index"


# --- PyG ------------------------------------------------------------------------------------


def test_pyg_data_round_trip(tmp_path: Path) -> None:
    from torch_geometric.data import Data

    cora = importers.load_npz(dataset("cora.npz"))
    data = Data(
        x=torch.from_numpy(cora.x),
        edge_index=torch.from_numpy(cora.edge_index),
        y=torch.from_numpy(cora.y if cora.y is not None else np.zeros(0)),
        train_mask=torch.from_numpy(np.asarray(cora.train_mask)),
    )
    torch.save(data, tmp_path / "cora.pt")
    g = importers.load_pyg(tmp_path / "cora.pt")
    assert g.num_nodes == 2708 and g.source == "pyg:cora.pt"
    np.testing.assert_array_equal(g.x, cora.x)
    np.testing.assert_array_equal(g.edge_index, cora.edge_index)
    np.testing.assert_array_equal(np.asarray(g.y), np.asarray(cora.y))
    np.testing.assert_array_equal(np.asarray(g.train_mask), np.asarray(cora.train_mask))
    assert g.val_mask is None
    assert write_store(g, tmp_path / "s").num_classes == 7


def test_pyg_without_features_and_with_num_nodes(tmp_path: Path) -> None:
    from torch_geometric.data import Data

    torch.save(Data(edge_index=torch.tensor([[0, 1], [1, 2]]), num_nodes=5), tmp_path / "d.pt")
    g = importers.load_pyg(tmp_path / "d.pt", feature_dim=4)
    assert g.num_nodes == 5 and g.x.shape == (5, 4) and "degree(dim=4)" in g.source


class _NotAllowed:
    """A class a weights-only load must refuse to instantiate."""


def test_pyg_refuses_arbitrary_pickles(tmp_path: Path) -> None:
    torch.save(
        {"edge_index": torch.zeros(2, 1, dtype=torch.long), "e": _NotAllowed()},
        tmp_path / "evil.pt",
    )
    with pytest.raises(InvalidInputError, match="cannot load") as info:
        importers.load_pyg(tmp_path / "evil.pt")
    assert info.value.field == "input"
    torch.save(torch.zeros(3), tmp_path / "tensor.pt")
    with pytest.raises(InvalidInputError, match="expected a PyG Data"):
        importers.load_pyg(tmp_path / "tensor.pt")


# --- edge-list CSV --------------------------------------------------------------------------


def test_csv_with_header_from_raw_facebook(tmp_path: Path) -> None:
    csv = dataset("raw/facebook_pagepage/edges.csv")
    npz = np.load(dataset("facebook_pagepage.npz"))
    n = int(npz["num_nodes"])
    np.save(tmp_path / "x.npy", np.random.default_rng(0).standard_normal((n, 8)))
    np.save(tmp_path / "y.npy", npz["y"])
    g = edgelist.load_edge_list(csv, tmp_path / "x.npy", tmp_path / "y.npy")
    assert g.num_nodes == n and g.edge_index.shape == (2, 171_002)
    keys = set((npz["edge_index"][0] * n + npz["edge_index"][1]).tolist())
    loops = g.edge_index[0] == g.edge_index[1]
    assert set((g.edge_index[0] * n + g.edge_index[1])[~loops].tolist()) <= keys
    assert g.train_mask is not None and g.test_mask is not None
    assert abs(int(g.train_mask.sum()) - round(0.6 * n)) <= 1
    assert not (g.train_mask & g.test_mask).any()
    meta = write_store(g, tmp_path / "s")
    assert meta.num_classes == 4 and meta.feature_dim == 8


def test_snap_whitespace_edge_list_matches_npz() -> None:
    edges = edgelist.read_edge_csv(dataset("raw/snap/wiki-Vote.txt"), delimiter=None)
    np.testing.assert_array_equal(edges, np.load(dataset("wiki_vote.npz"))["edge_index"])


def test_csv_header_is_optional(tmp_path: Path) -> None:
    (tmp_path / "a.csv").write_text("src,dst\n0,1\n1,2\n")
    (tmp_path / "b.csv").write_text("# comment\n0,1\n\n1,2\n")
    a = edgelist.read_edge_csv(tmp_path / "a.csv")
    np.testing.assert_array_equal(a, [[0, 1], [1, 2]])
    np.testing.assert_array_equal(edgelist.read_edge_csv(tmp_path / "b.csv"), a)


@pytest.mark.parametrize(
    ("text", "line"),
    [("src,dst\n0,1\n1,x\n", 3), ("0,1\n2.5,1\n", 2), ("0,1\n1,2\n3\n", 3)],
)
def test_csv_bad_row_names_its_line(tmp_path: Path, text: str, line: int) -> None:
    (tmp_path / "e.csv").write_text(text)
    with pytest.raises(InvalidInputError, match=f"line {line}:") as info:
        edgelist.read_edge_csv(tmp_path / "e.csv")
    assert info.value.field == "edges"


def test_csv_missing_and_mismatched_files(tmp_path: Path) -> None:
    (tmp_path / "e.csv").write_text("0,1\n1,5\n")
    np.save(tmp_path / "x.npy", np.ones((3, 2), dtype=np.float32))
    with pytest.raises(InvalidInputError) as info:
        edgelist.load_edge_list(tmp_path / "nope.csv", tmp_path / "x.npy")
    assert info.value.field == "edges"
    with pytest.raises(InvalidInputError) as info:
        edgelist.load_edge_list(tmp_path / "e.csv", tmp_path / "nope.npy")
    assert info.value.field == "x"
    (tmp_path / "empty.csv").write_text("# nothing\n")
    with pytest.raises(InvalidInputError, match="no edges"):
        edgelist.read_edge_csv(tmp_path / "empty.csv")
    g = edgelist.load_edge_list(tmp_path / "e.csv", tmp_path / "x.npy")  # id 5 >= N = 3
    with pytest.raises(InvalidInputError) as info:
        write_store(g, tmp_path / "s")
    assert info.value.field == "edge_index"
    np.save(tmp_path / "y.npy", np.zeros(2, dtype=np.int64))
    g = edgelist.load_edge_list(tmp_path / "e.csv", tmp_path / "x.npy", tmp_path / "y.npy")
    with pytest.raises(InvalidInputError) as info:
        write_store(g, tmp_path / "s2")
    assert info.value.field in ("edge_index", "y")


# --- gnnserve prepare -----------------------------------------------------------------------


def _prepare(*argv: str) -> int:
    parser = argparse.ArgumentParser()
    prepare.add_arguments(parser)
    return prepare.run(parser.parse_args(list(argv)))


def test_prepare_npz_and_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cora, out = str(dataset("cora.npz")), str(tmp_path / "cora")
    assert _prepare("npz", "--input", cora, "--out", out) == 0
    meta = layout.verify_checksum(out)
    printed = capsys.readouterr().out
    assert meta.checksum in printed and "2,708" in printed
    assert _prepare("npz", "--input", cora, "--out", out) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "--overwrite" in err and "Traceback" not in err
    assert _prepare("npz", "--input", cora, "--out", out, "--overwrite", "--dtype", "float16") == 0
    assert layout.read_meta(out).feature_dtype == "float16"
    assert _prepare("npz", "--input", str(tmp_path / "missing.npz"), "--out", out + "2") == 2
    assert "not found" in capsys.readouterr().err


def test_prepare_generators_and_csv(tmp_path: Path) -> None:
    assert _prepare("sbm", "--nodes", "400", "--classes", "4", "--out", str(tmp_path / "a")) == 0
    assert layout.read_meta(tmp_path / "a").num_classes == 4
    args = ("rmat", "--nodes", "1024", "--edges", "5000", "--feature-dim", "4")
    assert _prepare(*args, "--out", str(tmp_path / "b"), "--name", "r") == 0
    meta = layout.read_meta(tmp_path / "b")
    assert (meta.name, meta.num_edges, meta.feature_dim) == ("r", 5000, 4)
    (tmp_path / "e.tsv").write_text("0\t1\n1\t2\n")
    np.save(tmp_path / "x.npy", np.ones((3, 2), dtype=np.float32))
    csv = ("csv", "--edges", str(tmp_path / "e.tsv"), "--features", str(tmp_path / "x.npy"))
    assert _prepare(*csv, "--delimiter", "tab", "--out", str(tmp_path / "c")) == 0
    assert _prepare(*csv, "--out", str(tmp_path / "d")) == 2  # wrong delimiter: bad line 1
