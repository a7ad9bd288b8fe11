"""Collectives of a CGP worker's gloo group, counting the bytes each rank sends."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.distributed as dist

__all__ = ["Exchange"]


class Exchange:
    """Collectives of the gloo group, counting the bytes this rank sends to other ranks."""

    def __init__(self, rank: int, world: int) -> None:
        self.rank, self.world = rank, world
        self.bytes_sent = 0

    def all_to_all(
        self, send: torch.Tensor, send_rows: Sequence[int], recv_rows: Sequence[int]
    ) -> torch.Tensor:
        """Rows ``send`` (grouped by receiver, ``send_rows[r]`` for rank r) -> rows received,
        grouped by sender (``recv_rows[r]`` from rank r)."""
        row_bytes = math.prod(send.shape[1:]) * send.element_size()
        self.bytes_sent += row_bytes * (sum(send_rows) - send_rows[self.rank])
        if self.world == 1:
            return send.clone()
        out = send.new_empty((sum(recv_rows), *send.shape[1:]))
        dist.all_to_all_single(out, send.contiguous(), list(recv_rows), list(send_rows))
        return out

    def broadcast_rows(self, mine: torch.Tensor, counts: Sequence[int]) -> torch.Tensor:
        """Every rank's rows, concatenated in rank order (``counts[r]`` rows from rank r)."""
        send = mine.repeat(self.world, *([1] * (mine.dim() - 1)))
        return self.all_to_all(send, [mine.size(0)] * self.world, counts)

    def all_gather(self, mine: torch.Tensor) -> torch.Tensor:
        """Rows of every rank concatenated in rank order; row counts may differ (sent first)."""
        sizes = self.broadcast_rows(
            torch.tensor([mine.size(0)], dtype=torch.int64), [1] * self.world
        )
        return self.broadcast_rows(mine, sizes.tolist())
