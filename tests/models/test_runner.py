"""ModelRunner.shape_output: outputs that are NaN or inf are refused, never answered."""

from __future__ import annotations

import subprocess
import sys

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


def test_read_only_rows_are_shaped_without_a_warning() -> None:
    """Rows that arrive read-only (a Ray object's buffer) raise no torch warning: run where
    every warning is an error, in a fresh process (torch warns about such arrays once)."""
    script = (
        "import numpy as np, torch\n"
        "from gnnserve.models.runner import ModelRunner\n"
        "from gnnserve.types import OutputKind\n"
        "rows = np.array([1, 0]); rows.flags.writeable = False\n"
        "out = ModelRunner.shape_output(OutputKind.LABEL, torch.eye(2), torch.eye(2), rows)\n"
        "print(out.tolist())\n"
    )
    proc = subprocess.run(
        [sys.executable, "-W", "error", "-c", script], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "[1, 0]"
