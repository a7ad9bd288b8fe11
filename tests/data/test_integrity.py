"""Store structure checks at open: corrupt stores written by the real writer are refused, with the
file, the first bad position and its value, by both backends and by a real `gnnserve serve`."""

from __future__ import annotations

import io
import json
import logging
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from gnnserve.config import ServeConfig, StoreConfig
from gnnserve.data import layout
from gnnserve.data.writer import GraphData, write_store
from gnnserve.engine.loader import build_engine
from gnnserve.errors import StoreFormatError
from gnnserve.features import open_feature_store
from gnnserve.graph import open_graph_store
from tests.conftest import make_checkpoint, random_simple_graph

BACKENDS = ["memory", "mmap"]
N, F = 2000, 16


@pytest.fixture(scope="module", params=["float32", "float16"])
def store(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2,000-node store with 16 features, written by ``write_store`` in either feature dtype."""
    rng = np.random.default_rng(1)
    ei = random_simple_graph(N, 20_000, seed=1)
    x = rng.standard_normal((N, F)).astype(np.float32)
    out = tmp_path_factory.mktemp("integrity") / request.param
    write_store(GraphData("g", N, ei, x, rng.integers(0, 3, N)), out, feature_dtype=request.param)
    return out


def _dtype(store: Path, name: str) -> str:
    meta = layout.read_meta(store)
    return {
        layout.INDPTR: "<i8",
        layout.INDICES: f"<{np.dtype(meta.indices_dtype).str[1:]}",
        layout.FEATURES: f"<{np.dtype(meta.feature_dtype).str[1:]}",
    }[name]


def corrupt(store: Path, out: Path, name: str, edits: dict[int, float]) -> np.ndarray:
    """Copy ``store`` to ``out`` with flat entries of file ``name`` overwritten; the new array."""
    shutil.copytree(store, out)
    arr = np.fromfile(out / name, dtype=_dtype(store, name))
    for pos, value in edits.items():
        arr[pos] = value
    arr.tofile(out / name)
    return arr


def _open(store: Path, backend: str, check: bool = True) -> None:
    """Open graph and features; the default call, unless the check is turned off."""
    off = {} if check else {"check_structure": False}
    open_graph_store(store, backend, **off)
    open_feature_store(store, backend, **off)


def first_bad_indptr(indptr: np.ndarray, num_edges: int) -> int:
    """Reference: the first entry outside [0, E] or smaller than its predecessor; -1 if none."""
    bad = (indptr < 0) | (indptr > num_edges)
    bad[1:] |= indptr[1:] < indptr[:-1]
    hits = np.flatnonzero(bad)
    return int(hits[0]) if hits.size else -1


@pytest.mark.parametrize("backend", BACKENDS)
def test_indptr_beyond_the_edges_is_refused(store: Path, tmp_path: Path, backend: str) -> None:
    corrupt(store, tmp_path / "s", layout.INDPTR, {1000: 10**12})
    with pytest.raises(StoreFormatError) as err:
        _open(tmp_path / "s", backend)
    assert err.value.field == "store"
    assert re.search(
        r"indptr\.bin: entry 1000 = 1000000000000 is outside \[0, \d+\]", str(err.value)
    )


@pytest.mark.parametrize("backend", BACKENDS)
def test_decreasing_indptr_is_refused(store: Path, tmp_path: Path, backend: str) -> None:
    indptr = np.fromfile(store / layout.INDPTR, dtype="<i8")
    e = int(indptr[-1])
    # row 700 pointing past row 701's start, row 1500 pointing back: both stay inside [0, E]
    arr = corrupt(store, tmp_path / "s", layout.INDPTR, {700: indptr[702] + 1, 1500: indptr[1490]})
    i = first_bad_indptr(arr, e)
    with pytest.raises(StoreFormatError, match=rf"indptr\.bin: entry {i} = {arr[i]} is less than "):
        _open(tmp_path / "s", backend)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("where", ["first", "last"])
def test_indptr_ends_must_be_zero_and_num_edges(
    store: Path, tmp_path: Path, backend: str, where: str
) -> None:
    indptr = np.fromfile(store / layout.INDPTR, dtype="<i8")
    # first: every row pointer shifted up by one (still monotone, still <= E) breaks indptr[0]
    # last: the final row pointer one short of E
    edits = (
        {i: int(v) + 1 for i, v in enumerate(indptr[:-1])}
        if where == "first"
        else {N: int(indptr[-1]) - 1}
    )
    arr = corrupt(store, tmp_path / "s", layout.INDPTR, edits)
    assert first_bad_indptr(arr, int(indptr[-1])) == -1  # only the end entry is wrong
    pos, want = (0, 0) if where == "first" else (N, int(indptr[-1]))
    with pytest.raises(StoreFormatError, match=rf"entry {pos} = {arr[pos]}, must be {want}"):
        _open(tmp_path / "s", backend)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("value", [10**9, -1, N])
def test_indices_outside_the_nodes_are_refused(
    store: Path, tmp_path: Path, backend: str, value: int
) -> None:
    # two bad entries: the message names the first one
    corrupt(store, tmp_path / "s", layout.INDICES, {5000: N + 7, 1234: value})
    msg = f"indices.bin: entry 1234 = {value} is not a node id (N = {N})"
    with pytest.raises(StoreFormatError, match=re.escape(msg)):
        _open(tmp_path / "s", backend)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
def test_non_finite_features_are_refused(
    store: Path, tmp_path: Path, backend: str, value: float
) -> None:
    row, col = 1999, 15
    corrupt(store, tmp_path / "s", layout.FEATURES, {row * F + col: value})
    msg = f"features.bin: row {row}, column {col} = {value} is not finite"
    with pytest.raises(StoreFormatError, match=re.escape(msg)):
        open_feature_store(tmp_path / "s", backend)


def test_first_non_finite_feature_is_named(store: Path, tmp_path: Path) -> None:
    rng = np.random.default_rng(5)
    positions = rng.choice(N * F, 20, replace=False)
    arr = corrupt(store, tmp_path / "s", layout.FEATURES, {int(p): np.nan for p in positions})
    first = int(np.flatnonzero(~np.isfinite(arr))[0])  # reference: numpy's isfinite
    row, col = divmod(first, F)
    with pytest.raises(StoreFormatError, match=f"row {row}, column {col} = nan"):
        open_feature_store(tmp_path / "s", "mmap")


def test_the_switch_turns_the_scans_off_and_the_loader_honours_it(
    store: Path, tmp_path: Path
) -> None:
    corrupt(store, tmp_path / "s", layout.FEATURES, {0: np.nan})
    for backend in BACKENDS:
        _open(tmp_path / "s", backend, check=False)  # trusted: no scan, no error
    ckpt = make_checkpoint(store, tmp_path / "ckpt")
    on = ServeConfig(store=StoreConfig(path=str(tmp_path / "s")), model_path=str(ckpt))
    assert on.store.check_structure is True  # on by default
    with pytest.raises(StoreFormatError, match="not finite"):
        build_engine(on)
    off = on.model_copy(update={"store": on.store.model_copy(update={"check_structure": False})})
    assert build_engine(off).graph.num_nodes == N


def test_valid_store_opens_and_logs_the_time(store: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="gnnserve.data.integrity"):
        _open(store, "memory")
    logged = [r.getMessage() for r in caplog.records]
    assert any(
        re.fullmatch(r"checked store structure \(graph: .*\) of .* in \d+\.\d\d s", m)
        for m in logged
    )
    assert any(
        re.fullmatch(r"checked store structure \(features: .*\) of .* in \d+\.\d\d s", m)
        for m in logged
    )


@pytest.mark.parametrize(
    "change, message",
    [
        ({"indices_dtype": "int16"}, "indices_dtype must be one of"),
        ({"feature_dtype": "float64"}, "feature_dtype must be one of"),
        ({"num_nodes": -5}, "num_nodes must be a non-negative int"),
        ({"num_edges": "many"}, "num_edges must be a non-negative int"),
    ],
)
def test_unusable_meta_is_refused(store: Path, tmp_path: Path, change: dict, message: str) -> None:
    shutil.copytree(store, tmp_path / "s")
    doc = json.loads((tmp_path / "s" / layout.META).read_text())
    (tmp_path / "s" / layout.META).write_text(json.dumps({**doc, **change}))
    for backend in BACKENDS:
        with pytest.raises(StoreFormatError, match=message):
            _open(tmp_path / "s", backend)


def serve_processes(runs: dict[str, tuple[Path, Path]], timeout_s: float = 240) -> dict:
    """Start ``gnnserve serve --store S --model M`` for every ``name: (S, M)`` at once, as real
    processes; ``name: (exit code, stderr)``, exit code None when one was still running after
    ``timeout_s`` (it is killed)."""
    procs = {}
    for name, (store, model) in runs.items():
        cmd = [sys.executable, "-m", "gnnserve.cli", "serve", "--store", str(store),
               "--model", str(model), "--port", "0"]  # fmt: skip
        procs[name] = subprocess.Popen(
            cmd, stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"}
        )
    results = {}
    try:
        for name, proc in procs.items():
            try:
                _, err = proc.communicate(timeout=timeout_s)
                results[name] = (proc.returncode, err)
            except subprocess.TimeoutExpired:
                proc.kill()
                results[name] = (None, proc.communicate()[1])
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return results


@pytest.mark.slow
def test_serve_exits_2_on_a_corrupt_store_instead_of_crashing(
    small_store: Path, small_ckpt: Path, tmp_path: Path
) -> None:
    """Real `gnnserve serve` processes. The old code died of SIGSEGV on the first two (numba
    kernels reading out of bounds in the start-up warm-up) and served the third (500s)."""
    cases = {
        "indptr": (layout.INDPTR, {1000: 10**12}, "indptr.bin: entry 1000 = 1000000000000"),
        "indices": (
            layout.INDICES,
            {1234: 10**9},
            "indices.bin: entry 1234 = 1000000000 is not a node id (N = 2000)",
        ),
        "nan": (layout.FEATURES, {50: np.nan}, "features.bin: row 3, column 2 = nan is not finite"),
    }
    for name, (file, edits, _) in cases.items():
        corrupt(small_store, tmp_path / name, file, edits)
    results = serve_processes({name: (tmp_path / name, small_ckpt) for name in cases})
    for name, (code, err) in results.items():
        assert code == 2, (name, code, err[-2000:])
        assert f"error: {tmp_path / name / cases[name][2]}" in err, err[-2000:]
        assert "Traceback" not in err


# -- labels, split masks and precomputed embeddings --------------------------------------------

M = 300  # nodes of the labelled store


@pytest.fixture(scope="module")
def labelled(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 300-node store with 3 classes and the three split masks."""
    rng = np.random.default_rng(2)
    x = rng.standard_normal((M, 8)).astype(np.float32)
    masks = np.zeros((3, M), dtype=bool)
    masks[rng.integers(0, 3, M), np.arange(M)] = True
    data = GraphData("g", M, random_simple_graph(M, 1500, seed=2), x, rng.integers(0, 3, M))
    data.train_mask, data.val_mask, data.test_mask = masks
    out = tmp_path_factory.mktemp("labelled") / "s"
    write_store(data, out)
    return out


def _npy(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, arr, allow_pickle=True)
    return buf.getvalue()


def _damages(good: np.ndarray, bad_value: int) -> dict[str, tuple[bytes | None, str]]:
    """Damaged file contents (None: the file is removed) and the message each must give."""
    raw = _npy(good)
    out_of_range = good.astype(np.int64)
    out_of_range[7] = bad_value
    return {
        "bad header": (b"\x93NUMPY\x01\x00\x10\x00{'descr': '<i8'," + raw[26:], "not a readable"),
        "truncated": (raw[: len(raw) - 100], "not a readable"),
        "wrong length": (_npy(good[:-1]), f"shape [{M - 1}], need [{M}]"),
        "2-D": (_npy(np.stack([good, good], 1)), f"shape [{M}, 2], need [{M}]"),
        "value": (_npy(out_of_range), f"entry 7 = {bad_value} is not"),
        "object array": (_npy(good.astype(object)), "not a readable"),
        "float": (_npy(good.astype(np.float64)), "dtype float64"),
        "missing": (None, "missing"),
    }


LABEL_CASES = list(_damages(np.zeros(M, dtype=np.int64), 10**9))
MASK_CASES = list(_damages(np.zeros(M, dtype=bool), 2))


def _damage(store: Path, out: Path, name: str, case: str, bad_value: int) -> str:
    """Copy ``store`` to ``out`` with file ``name`` damaged as ``case``; the expected message."""
    shutil.copytree(store, out)
    good = np.load(out / name)
    content, message = _damages(good, bad_value)[case]
    if content is None:
        (out / name).unlink()
    else:
        (out / name).write_bytes(content)
    return message


def _train(store: Path, out: Path) -> list[str]:
    args = ["--arch", "sage", "--hidden", "8", "--epochs", "1", "--fanouts", "2,2"]
    return ["train", "--store", str(store), "--out", str(out), *args, "--no-progress"]


@pytest.mark.parametrize(
    ("name", "case", "bad_value"),
    [(layout.LABELS, c, 10**9) for c in LABEL_CASES]
    + [("train_mask.npy", c, 2) for c in MASK_CASES],
)
def test_damaged_labels_and_masks_are_refused_at_open_and_by_train(
    labelled: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    name: str,
    case: str,
    bad_value: int,
) -> None:
    from gnnserve.cli import main

    store = tmp_path / "s"
    message = _damage(labelled, store, name, case, bad_value)
    with pytest.raises(StoreFormatError) as err:
        open_graph_store(store, "mmap")
    assert err.value.message.startswith(f"{store / name}: ") and message in err.value.message
    capsys.readouterr()
    assert main(_train(store, tmp_path / "ckpt")) == 2
    stderr = capsys.readouterr().err
    assert f"error: {store / name}: " in stderr and "Traceback" not in stderr, stderr
    open_graph_store(store, check_structure=False)  # the switch turns these checks off too


def test_labels_and_masks_that_pass_are_what_train_reads(labelled: Path) -> None:
    from gnnserve.data import integrity

    meta = layout.read_meta(labelled)
    np.testing.assert_array_equal(
        integrity.load_labels(labelled, meta), np.load(labelled / layout.LABELS)
    )
    mask = integrity.load_mask(labelled, meta, "val_mask")
    assert mask.dtype == np.bool_
    np.testing.assert_array_equal(mask, np.load(labelled / "val_mask.npy"))


def test_precompute_and_serve_refuse_a_damaged_mask(labelled: Path, tmp_path: Path) -> None:
    from gnnserve.cli import main

    store = tmp_path / "s"
    _damage(labelled, store, "test_mask.npy", "truncated", 2)
    ckpt = make_checkpoint(labelled, tmp_path / "ckpt")
    assert main(["precompute", "--store", str(store), "--model", str(ckpt), "--no-progress"]) == 2
    config = ServeConfig.load(None, **{"store.path": str(store), "model_path": str(ckpt)})
    with pytest.raises(StoreFormatError, match="test_mask.npy: not a readable"):
        build_engine(config)


@pytest.mark.parametrize("backend", BACKENDS)
def test_non_finite_precomputed_embeddings_are_refused(
    labelled: Path, tmp_path: Path, backend: str
) -> None:
    from gnnserve.embeddings.stores import layer_file, open_embeddings

    ckpt = make_checkpoint(labelled, tmp_path / "ckpt")
    pes = tmp_path / "pes"
    from gnnserve.cli import main

    args = ["precompute", "--store", str(labelled), "--model", str(ckpt), "--out", str(pes)]
    assert main([*args, "--no-progress"]) == 0
    open_embeddings(pes, backend)  # intact: opens
    table = np.fromfile(pes / layer_file(1), dtype="<f4")
    table[5 * (table.size // M) + 1] = np.inf
    table.tofile(pes / layer_file(1))
    with pytest.raises(StoreFormatError) as err:
        open_embeddings(pes, backend)
    assert err.value.field == "embeddings"
    assert f"{pes / layer_file(1)}: row 5, column 1 = inf is not finite" in err.value.message
