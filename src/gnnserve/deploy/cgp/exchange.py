"""Collectives of a CGP worker's gloo group, counting the bytes each rank sends."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence

import torch
import torch.distributed as dist

__all__ = ["Exchange"]


class Exchange:
    """Collectives of the gloo group, counting the bytes this rank sends to other ranks: the
    payload of the tensors handed to ``all_to_all_single`` (rows kept by this rank excluded),
    in total and per ``tag`` (which step of the request sent them)."""

    def __init__(self, rank: int, world: int) -> None:
        self.rank, self.world = rank, world
        self.bytes_sent = 0
        self.bytes_by: dict[str, int] = defaultdict(int)

    def reset(self) -> None:
        """Zero the counters (start of a request)."""
        self.bytes_sent = 0
        self.bytes_by = defaultdict(int)

    def all_to_all(
        self, send: torch.Tensor, send_rows: Sequence[int], recv_rows: Sequence[int], tag: str
    ) -> torch.Tensor:
        """Rows ``send`` (grouped by receiver, ``send_rows[r]`` for rank r) -> rows received,
        grouped by sender (``recv_rows[r]`` from rank r)."""
        row_bytes = math.prod(send.shape[1:]) * send.element_size()
        sent = row_bytes * (sum(send_rows) - send_rows[self.rank])
        self.bytes_sent += sent
        self.bytes_by[tag] += sent
        if self.world == 1:
            return send.clone()
        out = send.new_empty((sum(recv_rows), *send.shape[1:]))
        dist.all_to_all_single(out, send.contiguous(), list(recv_rows), list(send_rows))
        return out

    def broadcast_rows(self, mine: torch.Tensor, counts: Sequence[int], tag: str) -> torch.Tensor:
        """Every rank's rows, concatenated in rank order (``counts[r]`` rows from rank r)."""
        send = mine.repeat(self.world, *([1] * (mine.dim() - 1)))
        return self.all_to_all(send, [mine.size(0)] * self.world, counts, tag)
