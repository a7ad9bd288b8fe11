"""bench/fog_data.py and bench/fog.py helpers: the kept feature columns are the most frequent
ones, copied exactly; the targets read the right fields."""

from __future__ import annotations

import io

import numpy as np
import scipy.sparse as sp

from tests.bench.loader import load_bench

fog_data = load_bench("fog_data")
fog = load_bench("fog")


def _npz(dense: np.ndarray) -> np.lib.npyio.NpzFile:
    m = sp.csr_matrix(dense)
    buf = io.BytesIO()
    np.savez(buf, x_indptr=m.indptr, x_indices=m.indices, x_data=m.data, x_shape=np.array(m.shape))
    buf.seek(0)
    return np.load(buf)


def test_top_columns_keep_the_most_frequent_columns_exactly() -> None:
    rng = np.random.default_rng(0)
    dense = (rng.random((300, 40)) < np.linspace(0.01, 0.6, 40)).astype(np.float32)
    dense *= rng.integers(1, 4, dense.shape)
    got = fog_data._top_columns(_npz(dense), 8)
    order = np.argsort(-(dense != 0).sum(0), kind="stable")[:8]
    np.testing.assert_array_equal(got, dense[:, order])


def test_targets_compare_fograph_with_each_baseline() -> None:
    def arm(ms: float, sent: int, acc: float) -> dict:
        return {"latency_ms": {"median": ms}, "bytes_uploaded": sent, "accuracy": acc}

    row = {
        "graph": "g", "arch": "gcn", "net": "4g",
        "cloud_over_fograph": {"median": 5.0}, "strawman_over_fograph": {"median": 1.2},
        "cloud": arm(500, 1000, 0.80), "strawman": arm(120, 1000, 0.80),
        "greedy": arm(200, 100, 0.80), "fograph": arm(100, 100, 0.7995),
    }  # fmt: skip
    targets = fog.Targets()
    trace = {"runs": [{}] * 3, "rounds_to_recover": [99, 2, 99], "median_rounds_to_recover": 99}
    quantizer = [
        {"graph": "s", "readings": "gaussian", "chosen": {"ratio": 4.3, "changed_pts": 0.12}},
        {"graph": "b", "readings": "binary", "chosen": {"ratio": 50.0, "changed_pts": 0.0}},
    ]
    fog.check({"compare": [row], "trace": trace, "quantizer": quantizer}, targets)
    got = {r["name"].split(": ")[1]: (r["measured"], r["met"]) for r in targets.rows}
    assert got["cloud / fograph latency"] == (5.0, True)
    assert got["straw-man / fograph latency"] == (1.2, False)
    assert got["IEP / METIS+Greedy latency"] == (0.5, True)
    assert got["raw / DAQ+LZ4 bytes"] == (10.0, True)
    assert got["DAQ+LZ4 accuracy loss (points)"] == (0.05, True)
    assert got["rounds to within 1.2x of unloaded (median of [99, 2, 99])"] == (99, False)
    assert got["column codec, float32 / uploaded bytes"] == (4.3, True)
    assert got["column codec, answers changed (% of vertices)"] == (0.12, False)
    assert sum("column codec" in r["name"] for r in targets.rows) == 2  # binary rows skipped
