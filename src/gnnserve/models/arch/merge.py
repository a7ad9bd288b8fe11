"""Partial aggregations and their merge functions (OMEGA §6.2, custom merge functions).

Each partition p aggregates the messages of its local sources into a *partial* per destination;
the destination's owner merges the P partials into exactly the single aggregation:

- sum: ``sum_p s_p``;
- mean: ``(s_p, n_p)`` -> ``sum_p s_p / max(sum_p n_p, 1)``;
- max: ``m_p`` (``-inf`` for a partition without messages) -> ``max_p m_p`` (0 where empty);
- power mean: mean partials of ``clamp(x)^p`` -> ``clamp(mean)^(1/p)`` (clamp to [1e-4, 100]);
- softmax: ``(M_p = max logit, Z_p = sum exp(logit - M_p), W_p = sum exp(logit - M_p) x)``
  -> ``sum_p W_p e^(M_p - M) / sum_p Z_p e^(M_p - M)`` with ``M = max_p M_p`` (log-sum-exp
  rescale, numerically stable); 0 where a destination has no message anywhere.

Partials are dataclasses of float32 tensors whose first dimension is the destination;
:func:`pack` / :func:`unpack` turn one into a single ``[n, width]`` tensor for the all-to-all.
A softmax partial travels folded, per head, as ``(L_p = M_p + log Z_p, W_p / Z_p)``: the same
softmax state (``(M, Z, W) -> (L, 1, W / Z)`` leaves the merge unchanged), one column per head
narrower than ``(M_p, Z_p, W_p)``.
Every function is vectorised (``index_add_`` / ``scatter_reduce_`` / one sparse matmul): no
loop over messages.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import TypeVar, cast

import torch

__all__ = [
    "MaxPartial",
    "MeanPartial",
    "SoftmaxPartial",
    "SumPartial",
    "merge_max",
    "merge_mean",
    "merge_power_mean",
    "merge_softmax",
    "merge_sum",
    "pack",
    "partial_max",
    "partial_mean",
    "partial_power_mean",
    "partial_softmax",
    "partial_sum",
    "partial_sum_rows",
    "unpack",
]


@dataclass(frozen=True)
class SumPartial:
    """Per-destination sum of the local messages."""

    total: torch.Tensor  # float32 [n, *shape]


@dataclass(frozen=True)
class MeanPartial:
    """Per-destination (sum, message count) of the local messages."""

    total: torch.Tensor  # float32 [n, *shape]
    count: torch.Tensor  # float32 [n] number of local messages (exact up to 2**24)


@dataclass(frozen=True)
class MaxPartial:
    """Per-destination element-wise max of the local messages; ``-inf`` rows where none."""

    value: torch.Tensor  # float32 [n, *shape]


@dataclass(frozen=True)
class SoftmaxPartial:
    """Per-destination softmax state of the local messages (attention heads H, width C)."""

    max_logit: torch.Tensor  # float32 [n, H]: max local logit, -inf where no local message
    exp_sum: torch.Tensor  # float32 [n, H]: sum exp(logit - max_logit)
    weighted: torch.Tensor  # float32 [n, H, C]: sum exp(logit - max_logit) * value


Partial = TypeVar("Partial", SumPartial, MeanPartial, MaxPartial, SoftmaxPartial)


def _zeros(msg: torch.Tensor, n: int) -> torch.Tensor:
    return torch.zeros((n, *msg.shape[1:]), dtype=msg.dtype, device=msg.device)


def _expand(index: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``index`` [E] broadcast to ``like`` [E, ...] for scatter_reduce."""
    return index.view(-1, *([1] * (like.dim() - 1))).expand_as(like)


def _scatter_max(msg: torch.Tensor, index: torch.Tensor, n: int) -> torch.Tensor:
    """Element-wise max of ``msg`` rows per destination; ``-inf`` where a row gets nothing."""
    out = torch.full((n, *msg.shape[1:]), -math.inf, dtype=msg.dtype, device=msg.device)
    return out.scatter_reduce_(0, _expand(index, msg), msg, reduce="amax", include_self=True)


def partial_sum(msg: torch.Tensor, index: torch.Tensor, n: int) -> SumPartial:
    """Sum of ``msg`` [E, ...] rows into ``n`` destinations (``index`` int64 [E])."""
    return SumPartial(_zeros(msg, n).index_add_(0, index, msg))


def partial_sum_rows(
    table: torch.Tensor,
    rows: torch.Tensor,
    index: torch.Tensor,
    n: int,
    weight: torch.Tensor | None = None,
) -> SumPartial:
    """Sum of ``weight[e] * table[rows[e]]`` into destination ``index[e]`` of ``n``, as one sparse
    matmul: the [E, width] message tensor is never built (rows read straight from ``table``).

    ``table`` float32 [t, width]; ``rows``, ``index`` int64 [E]; ``weight`` float32 [E] or None
    (all ones). Repeated (row, destination) pairs add up.
    """
    if rows.numel() == 0:
        return SumPartial(table.new_zeros((n, table.size(1))))
    values = torch.ones(rows.numel(), dtype=table.dtype) if weight is None else weight
    adjacency = torch.sparse_coo_tensor(
        torch.stack([index, rows]), values, (n, table.size(0)), check_invariants=False
    )
    return SumPartial(torch.sparse.mm(adjacency, table))


def merge_sum(parts: Sequence[SumPartial]) -> torch.Tensor:
    """The global sum [n, ...] from every partition's partial."""
    return torch.stack([p.total for p in parts]).sum(0)


def partial_mean(msg: torch.Tensor, index: torch.Tensor, n: int) -> MeanPartial:
    """(sum, count) of ``msg`` [E, ...] rows into ``n`` destinations."""
    ones = torch.ones(index.numel(), dtype=msg.dtype, device=msg.device)
    count = torch.zeros(n, dtype=msg.dtype, device=msg.device).index_add_(0, index, ones)
    return MeanPartial(partial_sum(msg, index, n).total, count)


def merge_mean(parts: Sequence[MeanPartial]) -> torch.Tensor:
    """The global mean [n, ...]; 0 for a destination without messages (as PyG)."""
    total = torch.stack([p.total for p in parts]).sum(0)
    count = torch.stack([p.count for p in parts]).sum(0).clamp(min=1.0)
    return total / count.view(-1, *([1] * (total.dim() - 1)))


def partial_max(msg: torch.Tensor, index: torch.Tensor, n: int) -> MaxPartial:
    """Element-wise max of ``msg`` rows per destination (``-inf`` where none)."""
    return MaxPartial(_scatter_max(msg, index, n))


def merge_max(parts: Sequence[MaxPartial]) -> torch.Tensor:
    """The global max [n, ...]; 0 for a destination without messages (as PyG)."""
    value = torch.stack([p.value for p in parts]).amax(0)
    return torch.where(torch.isinf(value) & (value < 0), torch.zeros_like(value), value)


def partial_power_mean(
    msg: torch.Tensor,
    index: torch.Tensor,
    n: int,
    p: float,
    clamp: tuple[float, float] = (1e-4, 100.0),
) -> MeanPartial:
    """Mean partial of ``clamp(msg)^p``; like PyG's ``PowerMeanAggregation`` the clamp to
    [1e-4, 100] and the powers are skipped when ``p == 1`` (a plain mean)."""
    if p != 1:
        msg = msg.clamp(min=clamp[0], max=clamp[1]).pow(p)
    return partial_mean(msg, index, n)


def merge_power_mean(
    parts: Sequence[MeanPartial], p: float, clamp: tuple[float, float] = (1e-4, 100.0)
) -> torch.Tensor:
    """``clamp(mean of clamp(x)^p)^(1/p)`` from the partials of :func:`partial_power_mean`."""
    out = merge_mean(parts)
    return out if p == 1 else out.clamp(min=clamp[0], max=clamp[1]).pow(1.0 / p)


def partial_softmax(
    logits: torch.Tensor, values: torch.Tensor, index: torch.Tensor, n: int
) -> SoftmaxPartial:
    """Softmax state of ``logits`` [E, H] weighting ``values`` [E, H, C] per destination."""
    top = _scatter_max(logits, index, n)
    weight = (logits - top.index_select(0, index)).exp()
    exp_sum = partial_sum(weight, index, n).total
    weighted = partial_sum(weight.unsqueeze(-1) * values, index, n).total
    return SoftmaxPartial(top, exp_sum, weighted)


def merge_softmax(parts: Sequence[SoftmaxPartial]) -> torch.Tensor:
    """``sum softmax(logit) * value`` per destination and head, [n, H, C] (0 where empty)."""
    tops = torch.stack([p.max_logit for p in parts])  # [P, n, H]
    top = tops.amax(0)
    safe = torch.where(torch.isinf(top), torch.zeros_like(top), top)
    scale = (tops - safe).exp()  # exp(-inf) = 0 for partitions without messages
    exp_sum = (torch.stack([p.exp_sum for p in parts]) * scale).sum(0)
    weighted = (torch.stack([p.weighted for p in parts]) * scale.unsqueeze(-1)).sum(0)
    return weighted / exp_sum.clamp(min=1e-16).unsqueeze(-1)


def pack(partial: SumPartial | MeanPartial | MaxPartial | SoftmaxPartial) -> torch.Tensor:
    """Every field of ``partial`` flattened per destination and concatenated: [n, width]
    (a softmax partial folded to its log-sum-exp and weighted mean first: ``H * (C + 1)``)."""
    if isinstance(partial, SoftmaxPartial):
        z = partial.exp_sum  # >= 1 where the head has a message (its max term is exp(0))
        lse = partial.max_logit + z.log()  # -inf where none
        mean = partial.weighted / z.clamp(min=1.0).unsqueeze(-1)
        tensors = [lse, mean]
    else:
        tensors = [getattr(partial, f.name) for f in fields(partial)]
    n = tensors[0].size(0)
    return torch.cat([t.reshape(n, math.prod(t.shape[1:])) for t in tensors], dim=1)


def unpack(like: Partial, packed: torch.Tensor) -> Partial:
    """The partial of ``packed`` [n, width], shaped like ``like`` (same kind, any n)."""
    n = packed.size(0)
    if isinstance(like, SoftmaxPartial):
        heads, width = like.weighted.shape[1:]
        lse = packed[:, :heads]
        mean = packed[:, heads:].reshape(n, heads, width)
        z = torch.isfinite(lse).to(packed.dtype)  # the folded state has exp_sum 1 (0 if empty)
        return cast(Partial, SoftmaxPartial(lse, z, mean))
    out, col = {}, 0
    for f in fields(like):
        shape = getattr(like, f.name).shape[1:]
        width = math.prod(shape)
        out[f.name] = packed[:, col : col + width].reshape(n, *shape)
        col += width
    return type(like)(**out)
