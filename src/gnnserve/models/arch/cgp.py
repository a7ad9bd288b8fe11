"""What a CGP worker hands an architecture's layer, and what the layer gives back (no PyG).

A :class:`CGPLayer` is one layer's weights as plain tensors, exported by
:meth:`Architecture.export <gnnserve.models.arch.base.Architecture.export>` and shipped to every
worker. Its :meth:`~CGPLayer.run` aggregates the messages of the worker's own sources into
partials (:mod:`gnnserve.models.arch.merge`), hands them to ``shuffle`` (the all-to-all to the
destinations' owners) and merges what it receives for the destinations it owns, then applies the
self term and bias (OMEGA §6.1, equation 3). Source rows are aggregated in place
(:meth:`SourceRows.aggregate`: a sparse matmul per row table, no per-edge message tensor), and a
layer whose linear map narrows may project the partial first (:func:`narrow`), so the exchange
carries ``min(in, out)`` columns.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import overload

import numpy as np
import torch
import torch.nn.functional as F

from gnnserve.models.arch import merge

__all__ = [
    "CGPLayer",
    "Gather",
    "LayerInputs",
    "LocalBlock",
    "Shuffle",
    "SourceRows",
    "narrow",
    "plain",
]


@dataclass(frozen=True)
class LocalBlock:
    """One layer's edges whose source is owned here, into that layer's destinations."""

    sources: np.ndarray  # int64 [n_src] distinct global source ids
    src: torch.Tensor  # int64 [E] row of each edge's source in ``sources``
    dst: torch.Tensor  # int64 [E] position of each edge's destination in C
    loop: torch.Tensor  # bool [E] the edge is a self loop (source == destination)
    n_dst: int  # destinations of the layer: |C| (layers 1..k-1) or m (layer k)


# a partial per destination of the layer -> the P partials (one per worker, rank order) of the
# destinations owned here; every worker must call it, in the same order
Shuffle = Callable[[merge.Partial], list[merge.Partial]]
# (rows [n_mine, ...] of the destinations owned here, step name) -> [n_dst, ...] rows of every
# destination of the layer (an all-gather); every worker must call it, in the same order
Gather = Callable[[torch.Tensor, str], torch.Tensor]


@dataclass(frozen=True)
class SourceRows:
    """Where the input rows of owned nodes live at one layer: two tables, and ``locate`` giving
    each id's table (True = ``first``) and row. Layer 1: stored features | query features;
    layers >= 2: rows computed here for C | PEs."""

    first: torch.Tensor  # float32 [t1, width]
    second: torch.Tensor  # float32 [t2, width]
    locate: Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]  # ids -> (in first, row)

    def get(self, ids: np.ndarray) -> torch.Tensor:
        """float32 [len(ids), width] rows of owned global ``ids`` (a copy)."""
        in_first, row = (torch.from_numpy(a) for a in self.locate(ids))
        out = torch.empty(ids.size, self.second.size(1))
        out[in_first] = self.first[row[in_first]]
        out[~in_first] = self.second[row[~in_first]]
        return out

    def aggregate(
        self,
        block: LocalBlock,
        keep: torch.Tensor | None = None,
        weight: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """[n_dst, width] sum over the block's edges (those of ``keep``) of ``weight[e]`` times
        the source row, read from the tables by sparse matmuls (no per-edge message tensor)."""
        in_first, row = (torch.from_numpy(a) for a in self.locate(block.sources))
        src, dst = (block.src, block.dst) if keep is None else (block.src[keep], block.dst[keep])
        first, rows = in_first[src], row[src]
        total = torch.zeros(block.n_dst, self.second.size(1))
        for table, pick in ((self.first, first), (self.second, ~first)):
            w = None if weight is None else weight[pick]
            total += merge.partial_sum_rows(table, rows[pick], dst[pick], block.n_dst, w).total
        return total


@dataclass(frozen=True)
class LayerInputs:
    """Everything one worker offers a layer for one request."""

    rows: SourceRows  # input rows of the nodes owned here (features, computed rows, PEs)
    block: LocalBlock  # the edges whose source is owned here, into every destination
    h_self: torch.Tensor  # float32 [n_mine, in] inputs of the destinations owned here
    dst_ids: np.ndarray  # int64 [n_mine] global ids of those destinations
    shuffle: Shuffle  # partials to the destinations' owners (all-to-all)
    gather: Gather  # owners' rows to every worker (all-gather)
    # float32 in-degree in G' of owned ids, self loops not counted (stored edges plus request
    # in-edges into queries and recomputed nodes): the single-process GCN degree
    degree: Callable[[np.ndarray], torch.Tensor]


class CGPLayer(ABC):
    """One layer as plain tensors, run by a CGP worker (which never imports torch_geometric)."""

    @abstractmethod
    def run(self, inputs: LayerInputs) -> torch.Tensor:
        """float32 [n_mine, out]: the layer's output (before the ReLU the worker applies between
        layers) for the destinations this worker owns, in ``inputs.dst_ids`` order."""


def narrow(total: torch.Tensor, weight: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """(``total`` projected by ``weight`` [out, in] when that narrows it, whether it was): the
    exchange then carries ``out`` columns (linear maps commute with the partial sums)."""
    project = weight.size(0) < weight.size(1)
    return (F.linear(total, weight) if project else total), project


@overload
def plain(t: torch.Tensor) -> torch.Tensor: ...
@overload
def plain(t: None) -> None: ...
def plain(t: torch.Tensor | None) -> torch.Tensor | None:
    """A parameter as a plain CPU tensor for the workers (a detached copy; None stays None)."""
    return None if t is None else t.detach().cpu().clone()
