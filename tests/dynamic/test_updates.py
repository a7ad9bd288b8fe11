"""parse_batch: feature values must be finite once cast to the feature table's float32."""

from __future__ import annotations

import numpy as np
import pytest

from gnnserve.dynamic.updates import UpdateRejectedError, parse_batch

DIM = 4
F32_MAX = float(np.finfo(np.float32).max)  # 3.4028235e38


def _parse(ops: list[dict]) -> object:
    return parse_batch(ops, num_nodes=10, feature_dim=DIM, edge_count=lambda u, v: 0)


@pytest.mark.parametrize(
    "bad",
    [
        1e39,  # finite as a Python float, inf in float32
        -1e39,
        3.5e38,  # just past float32's largest finite value
        10**39,  # an int that overflows float32
        10**400,  # an int that overflows even float64
        float("nan"),
        float("inf"),
    ],
)
@pytest.mark.parametrize("kind", ["add_node", "upsert_features"])
def test_values_not_finite_in_float32_are_rejected(kind: str, bad: float) -> None:
    op = {"op": kind, "features": [0.0, bad, 1.0, 2.0]}
    if kind == "upsert_features":
        op["node"] = 3
    with pytest.raises(UpdateRejectedError) as info:
        _parse([{"op": "add_edge", "src": 1, "dst": 2}, op])
    (error,) = info.value.errors
    assert error["index"] == 1 and error["field"] == "ops[1].features"
    assert "float32" in error["message"] and "features[1]" in error["message"]


def test_every_bad_op_is_listed() -> None:
    ops = [
        {"op": "add_node", "features": [1e39, 0.0, 0.0, 0.0]},
        {"op": "add_node", "features": [0.0, 0.0, 0.0, 0.0]},
        {"op": "upsert_features", "node": 0, "features": [0.0, 0.0, 0.0, -1e300]},
    ]
    with pytest.raises(UpdateRejectedError) as info:
        _parse(ops)
    assert [e["field"] for e in info.value.errors] == ["ops[0].features", "ops[2].features"]
    assert "features[3]" in info.value.errors[1]["message"]


def test_values_finite_in_float32_are_kept_as_sent() -> None:
    values = [F32_MAX, -F32_MAX, 1e-45, 7]  # extremes of float32; an int
    batch = _parse([{"op": "add_node", "features": values}])
    got = batch.ops[0]["features"]  # type: ignore[attr-defined]
    assert got == [F32_MAX, -F32_MAX, 1e-45, 7.0] and all(type(v) is float for v in got)
    assert np.isfinite(np.asarray(got, dtype=np.float32)).all()


@pytest.mark.parametrize("bad", [True, "1.0", None, [1.0], {"v": 1}])
def test_non_numbers_are_rejected(bad: object) -> None:
    with pytest.raises(UpdateRejectedError) as info:
        _parse([{"op": "add_node", "features": [0.0, 0.0, bad, 0.0]}])
    assert info.value.errors[0]["field"] == "ops[0].features"
    assert "features[2]" in info.value.errors[0]["message"]


def test_numpy_floats_are_numbers() -> None:
    batch = _parse([{"op": "add_node", "features": [np.float64(0.5), 1, 2.0, np.int64(3)]}])
    assert batch.ops[0]["features"] == [0.5, 1.0, 2.0, 3.0]  # type: ignore[attr-defined]
