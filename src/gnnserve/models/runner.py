"""ModelRunner: a loaded model's forward over a MiniBatch, and per-request output shaping."""

from __future__ import annotations

import numpy as np
import torch

from gnnserve.models.zoo import GNN
from gnnserve.types import MiniBatch, OutputKind


class ModelRunner:
    """Runs ``model.forward_blocks`` under inference mode and shapes outputs per request."""

    def __init__(self, model: GNN, version: str) -> None:
        self.model = model.eval()
        self.version = version

    @torch.inference_mode()
    def forward(self, batch: MiniBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """(logits [num_seeds, C], embedding [num_seeds, H]) of the batch's unique seeds."""
        logits, embedding = self.model.forward_blocks(
            batch.x, batch.subgraph.blocks, batch.in_degree
        )
        return logits, embedding

    @staticmethod
    def shape_output(
        kind: OutputKind, logits: torch.Tensor, embedding: torch.Tensor, rows: np.ndarray
    ) -> torch.Tensor:
        """The values a request asked for: labels [n], probabilities [n, C] or embeddings [n, H]."""
        index = torch.from_numpy(rows)
        if kind is OutputKind.LABEL:
            return logits.index_select(0, index).argmax(dim=1)
        if kind is OutputKind.PROBS:
            return torch.softmax(logits.index_select(0, index), dim=1)
        return embedding.index_select(0, index)
