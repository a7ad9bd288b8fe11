"""Choosing the column codec's widths by a measured accuracy budget, checked against plain
PyG forwards on independently quantized readings."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gnnserve.data.generators import sbm
from gnnserve.deploy.fog.quantizer import LADDER, choose_widths, upload_widths
from gnnserve.errors import InvalidInputError
from gnnserve.features.column_codec import column_bits
from gnnserve.features.quantize import DaqConfig, bits_per_vertex
from gnnserve.models.zoo import GNN, ModelConfig
from tests.embeddings.reference import layer_outputs

N, F = 1200, 12


@pytest.fixture(scope="module")
def case() -> tuple[GNN, np.ndarray, np.ndarray, np.ndarray]:
    data = sbm(num_nodes=N, num_classes=4, feature_dim=F, avg_degree=8.0, seed=3)
    order = np.lexsort((data.edge_index[0], data.edge_index[1]))
    src, dst = data.edge_index[0][order], data.edge_index[1][order]
    indptr = np.concatenate([[0], np.cumsum(np.bincount(dst, minlength=N))])
    torch.manual_seed(0)
    model = GNN(ModelConfig("sage", in_dim=F, hidden_dim=32, out_dim=4, num_layers=2)).eval()
    return model, indptr, src.astype(np.int64), np.asarray(data.x, np.float32)


def _answers(model: GNN, indptr: np.ndarray, indices: np.ndarray, x: np.ndarray) -> np.ndarray:
    dst = np.repeat(np.arange(N), np.diff(indptr))
    edges = torch.from_numpy(np.stack([indices, dst]))
    return layer_outputs(model, torch.from_numpy(x), edges)[-1].argmax(1).numpy()


def _quantized(x: np.ndarray, bits: np.ndarray) -> np.ndarray:
    """Per-column nearest codes at each row's width (float32 min and span, as the format)."""
    low = x.min(axis=0).astype(np.float64)
    span = (x.max(axis=0).astype(np.float64) - low).astype(np.float32).astype(np.float64)
    step = span[None, :] / (2.0 ** bits[:, None].astype(np.float64) - 1)
    return (low + np.round((x - low) / step) * step).astype(np.float32)


def _changed_pts(case: tuple, widths: tuple[int, int, int, int]) -> float:
    model, indptr, indices, x = case
    bits = column_bits(np.diff(indptr), widths)
    full = _answers(model, indptr, indices, x)
    return 100.0 * float(np.mean(_answers(model, indptr, indices, _quantized(x, bits)) != full))


@pytest.mark.parametrize("budget", [0.0, 2.0])
def test_each_trial_measures_the_answers_a_plain_forward_changes(case, budget: float) -> None:  # type: ignore[no-untyped-def]
    model, indptr, indices, x = case
    choice = choose_widths(model, indptr, indices, x, budget_pts=budget)
    assert 3 <= len(choice.trials) <= 8  # a bisection of 49 rungs, not a scan
    for trial in choice.trials:
        assert trial.changed_pts == pytest.approx(_changed_pts(case, trial.widths), abs=1e-9)
        assert trial.packed_ratio > 1.9  # at most 16 of float32's 32 bits
    assert choice.widths is not None and choice.chosen is not None
    assert choice.chosen.changed_pts <= budget
    np.testing.assert_array_equal(choice.bits, column_bits(np.diff(indptr), choice.widths))
    # the bisection's invariant: every rung tried below the choice failed, the one just below
    # was tried (or the choice is the first rung)
    rung = LADDER.index(choice.widths)
    below = [t for t in choice.trials if LADDER.index(t.widths) < rung]
    assert all(t.changed_pts > budget for t in below)
    assert rung == 0 or any(LADDER.index(t.widths) == rung - 1 for t in below)
    assert choice.trials[0].widths != choice.widths or rung == 0


def test_the_ladder_climbs_by_a_quarter_bit_low_degrees_first() -> None:
    assert LADDER[0] == (4, 4, 4, 4) and LADDER[-1] == (16, 16, 16, 16)
    means = [sum(w) / 4 for w in LADDER]
    assert np.allclose(np.diff(means), 0.25)
    assert all(list(w) == sorted(w, reverse=True) for w in LADDER)


def test_a_loose_budget_takes_the_fewest_bytes(case) -> None:  # type: ignore[no-untyped-def]
    model, indptr, indices, x = case
    loose = choose_widths(model, indptr, indices, x, budget_pts=100.0)
    assert loose.widths == LADDER[0] and loose.packed_ratio > 6.0
    with pytest.raises(InvalidInputError, match="budget_pts"):
        choose_widths(model, indptr, indices, x, budget_pts=-1.0)


def test_upload_widths_per_codec_and_the_lossless_fallback(case) -> None:  # type: ignore[no-untyped-def]
    model, indptr, indices, x = case
    degrees = np.diff(indptr)
    assert upload_widths(model, indptr, indices, x, False, "column").bits is None
    daq = upload_widths(model, indptr, indices, x, True, "daq", (32, 32, 16, 8))
    np.testing.assert_array_equal(
        daq.bits, bits_per_vertex(degrees, DaqConfig.for_degrees(degrees, (32, 32, 16, 8)))
    )
    lossless = upload_widths(model, indptr, indices, x, True, "lossless")
    assert lossless.codec == "daq" and (lossless.bits == 32).all()
    # a ladder with nothing within budget: lossless, with the trial kept for the report
    assert _changed_pts(case, (4, 4, 4, 4)) > 0.0
    none_fit = upload_widths(
        model, indptr, indices, x, True, "column", budget_pts=0.0, ladder=((4, 4, 4, 4),)
    )
    assert none_fit.codec == "daq" and (none_fit.bits == 32).all()
    assert none_fit.quantizer is not None and none_fit.quantizer.widths is None
    fits = upload_widths(model, indptr, indices, x, True, "column", budget_pts=100.0)
    assert fits.codec == "column" and set(np.unique(fits.bits)) == {4}
