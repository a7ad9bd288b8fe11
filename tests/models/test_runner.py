"""ModelRunner.shape_output: outputs that are NaN or inf are refused, never answered."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gnnserve.errors import NonFiniteOutputError
from gnnserve.models.runner import ModelRunner
from gnnserve.types import OutputKind

LOGITS = torch.tensor([[0.1, 2.0], [float("nan"), 1.0], [3.0, -1.0], [float("inf"), 0.0]])
EMBEDDING = torch.tensor([[1.0], [2.0], [float("-inf")], [4.0]])


@pytest.mark.parametrize(
    ("kind", "rows", "bad"),
    [
        (OutputKind.LABEL, [0, 1, 3], [11, 13]),  # argmax over NaN must not answer
        (OutputKind.PROBS, [3, 0], [13]),
        (OutputKind.EMBEDDING, [1, 2], [12]),
    ],
)
def test_non_finite_rows_raise_naming_the_nodes(kind, rows, bad) -> None:
    nodes = np.array(rows) + 10  # the request's node ids
    with pytest.raises(NonFiniteOutputError) as info:
        ModelRunner.shape_output(kind, LOGITS, EMBEDDING, np.array(rows), nodes)
    err = info.value
    assert err.http_status == 500 and err.kind == "non_finite_output"
    assert f"node(s) {bad}" in err.message and kind.value in err.message


@pytest.mark.parametrize(
    ("kind", "rows", "want"),
    [
        (OutputKind.LABEL, [2, 0], torch.tensor([0, 1])),
        (OutputKind.PROBS, [0], torch.softmax(LOGITS[[0]], 1)),
        (OutputKind.EMBEDDING, [3, 0, 1], EMBEDDING[[3, 0, 1]]),  # logits of row 1: NaN
    ],
)
def test_finite_rows_are_shaped(kind, rows, want) -> None:
    got = ModelRunner.shape_output(kind, LOGITS, EMBEDDING, np.array(rows))
    torch.testing.assert_close(got, want, atol=0, rtol=0)


def test_without_node_ids_the_rows_are_named() -> None:
    with pytest.raises(NonFiniteOutputError, match=r"node\(s\) \[1\]"):
        ModelRunner.shape_output(OutputKind.PROBS, LOGITS, EMBEDDING, np.array([0, 1]))
