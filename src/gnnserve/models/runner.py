"""ModelRunner: a loaded model's forward over a MiniBatch, and per-request output shaping."""

from __future__ import annotations

import numpy as np
import torch

from gnnserve.errors import NonFiniteOutputError
from gnnserve.models.zoo import GNN
from gnnserve.types import MiniBatch, OutputKind

_forwards = 0  # forwards run in this process (models.heap trims the heap once it stops)


def forwards_run() -> int:
    """How many forwards this process has run (any model)."""
    return _forwards


class ModelRunner:
    """Runs ``model.forward_blocks`` under inference mode and shapes outputs per request."""

    def __init__(self, model: GNN, version: str) -> None:
        self.model = model.eval()
        self.version = version

    @torch.inference_mode()
    def forward(self, batch: MiniBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """(logits [num_seeds, C], embedding [num_seeds, H]) of the batch's unique seeds."""
        global _forwards
        _forwards += 1  # unlocked: a lost count only delays a trim
        logits, embedding = self.model.forward_blocks(
            batch.x, batch.subgraph.blocks, batch.in_degree
        )
        return logits, embedding

    @staticmethod
    def shape_output(
        kind: OutputKind,
        logits: torch.Tensor,
        embedding: torch.Tensor,
        rows: np.ndarray,
        nodes: np.ndarray | None = None,
    ) -> torch.Tensor:
        """The values a request asked for: labels [n], probabilities [n, C] or embeddings [n, H].

        ``rows`` index the request's nodes in ``logits``/``embedding``; ``nodes`` are their ids
        (default: ``rows``), named by the NonFiniteOutputError raised when a row the output is
        computed from holds NaN or inf (argmax over NaN would answer a label silently).
        """
        # rows read from a Ray object (faas, dgs) are read-only views of its buffer: torch would
        # warn on every such request; they are a request's few rows, so copy those
        index = torch.from_numpy(rows if rows.flags.writeable else rows.copy())
        source = embedding if kind is OutputKind.EMBEDDING else logits
        picked = source.index_select(0, index)
        if not _all_finite(picked):
            finite = torch.isfinite(picked).all(dim=1).cpu().numpy()
            _refuse(kind, rows if nodes is None else nodes, finite)
        if kind is OutputKind.LABEL:
            return picked.argmax(dim=1)
        if kind is OutputKind.PROBS:
            return torch.softmax(picked, dim=1)
        return picked


_NAMED = 10  # node ids listed in the error message at most


def _all_finite(values: torch.Tensor) -> bool:
    if values.device.type == "cpu":  # numpy's reduction is ~4x cheaper on a request's rows
        return bool(np.isfinite(values.detach().numpy()).all())
    return bool(torch.isfinite(values).all())


def _refuse(kind: OutputKind, nodes: np.ndarray, finite: np.ndarray) -> None:
    bad = np.asarray(nodes)[~finite]
    shown = bad[:_NAMED].tolist()
    more = f" and {bad.size - _NAMED} more" if bad.size > _NAMED else ""
    raise NonFiniteOutputError(
        f"the model's {kind.value} output is NaN or inf for node(s) {shown}{more}: their "
        "features, or their neighbours', hold values the model overflows on"
    )
