"""Partial aggregation + merge (CGP custom merge functions) vs PyG's single aggregations."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch_geometric.nn import aggr

from gnnserve.models.arch import merge
from gnnserve.models.arch.merge import (
    MaxPartial,
    MeanPartial,
    SoftmaxPartial,
    SumPartial,
)

TOL = 1e-5
N_DST, WIDTH = 13, 6


def messages(
    seed: int, parts: int, empty_rows: int = 3
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(msg [E, WIDTH], dst index [E], partition [E]): random messages split randomly across
    ``parts`` partitions; the last ``empty_rows`` destinations get no message at all."""
    gen = torch.Generator().manual_seed(seed)
    e = 200
    msg = torch.randn(e, WIDTH, generator=gen) * 3
    index = torch.randint(0, N_DST - empty_rows, (e,), generator=gen)
    part = torch.randint(0, parts, (e,), generator=gen)
    return msg, index, part


def split_partials(
    build: Callable[[torch.Tensor, torch.Tensor, int], merge.Partial],
    msg: torch.Tensor,
    index: torch.Tensor,
    part: torch.Tensor,
    parts: int,
) -> list:
    """One partial per partition, each sent through pack / unpack as over the wire."""
    out = []
    for p in range(parts):
        mine = part == p
        local = build(msg[mine], index[mine], N_DST)
        out.append(merge.unpack(local, merge.pack(local)))
    return out


def check(got: torch.Tensor, want: torch.Tensor) -> None:
    diff = (got - want).abs().max().item()
    assert torch.allclose(got, want, atol=TOL), f"max abs diff {diff}"


CASES = [(seed, parts) for seed in range(3) for parts in (1, 2, 4, 7)]


LINEAR_MERGES = {
    "sum": (merge.partial_sum, merge.merge_sum, SumPartial, aggr.SumAggregation),
    "mean": (merge.partial_mean, merge.merge_mean, MeanPartial, aggr.MeanAggregation),
    "max": (merge.partial_max, merge.merge_max, MaxPartial, aggr.MaxAggregation),
}


@pytest.mark.parametrize("kind", list(LINEAR_MERGES))
@pytest.mark.parametrize(("seed", "parts"), CASES)
def test_partials_merge_to_the_pyg_aggregation(kind: str, seed: int, parts: int) -> None:
    partial, merge_fn, partial_type, reference = LINEAR_MERGES[kind]
    msg, index, part = messages(seed, parts)
    partials = split_partials(partial, msg, index, part, parts)
    assert all(isinstance(p, partial_type) for p in partials)
    check(merge_fn(partials), reference()(msg, index, dim_size=N_DST))


def test_max_partition_without_messages() -> None:
    """A partition holding no message at all (every row -inf) does not change the max."""
    msg, index, part = messages(0, 3)
    part[part == 1] = 0  # partition 1 is empty
    partials = split_partials(merge.partial_max, msg, index, part, 3)
    assert torch.isinf(partials[1].value).all()
    check(merge.merge_max(partials), aggr.MaxAggregation()(msg, index, dim_size=N_DST))


@pytest.mark.parametrize("p", [0.5, 1.0, 2.0, 3.0])
@pytest.mark.parametrize(("seed", "parts"), CASES[::3])
def test_power_mean(seed: int, parts: int, p: float) -> None:
    msg, index, part = messages(seed, parts)
    msg = msg.abs()  # inside PyG's clamp range, so the comparison exercises the pow path

    def build(m: torch.Tensor, i: torch.Tensor, n: int) -> MeanPartial:
        return merge.partial_power_mean(m, i, n, p)

    partials = split_partials(build, msg, index, part, parts)
    want = aggr.PowerMeanAggregation(p=p)(msg, index, dim_size=N_DST)
    check(merge.merge_power_mean(partials, p), want)


@pytest.mark.parametrize("t", [0.1, 1.0, 5.0])
@pytest.mark.parametrize(("seed", "parts"), CASES[::3])
def test_softmax(seed: int, parts: int, t: float) -> None:
    """Per-channel softmax (PyG SoftmaxAggregation): logits t * x weight the messages x."""
    msg, index, part = messages(seed, parts)
    msg = msg * 10  # large logits: the log-sum-exp rescale must keep the merge stable

    def build(m: torch.Tensor, i: torch.Tensor, n: int) -> SoftmaxPartial:
        return merge.partial_softmax(m * t, m.unsqueeze(-1), i, n)

    partials = split_partials(build, msg, index, part, parts)
    got = merge.merge_softmax(partials).squeeze(-1)
    check(got, aggr.SoftmaxAggregation(t=t)(msg, index, dim_size=N_DST))


def test_softmax_heads() -> None:
    """Multi-head attention shape: logits [E, H] weight values [E, H, C]."""
    gen = torch.Generator().manual_seed(5)
    e, heads, width = 90, 3, 4
    logits = torch.randn(e, heads, generator=gen) * 20
    values = torch.randn(e, heads, width, generator=gen)
    index = torch.randint(0, N_DST, (e,), generator=gen)
    part = torch.randint(0, 4, (e,), generator=gen)
    partials = [
        merge.partial_softmax(logits[part == p], values[part == p], index[part == p], N_DST)
        for p in range(4)
    ]
    from torch_geometric.utils import softmax

    alpha = softmax(logits, index, num_nodes=N_DST)
    want = torch.zeros(N_DST, heads, width).index_add_(0, index, alpha.unsqueeze(-1) * values)
    check(merge.merge_softmax(partials), want)


def test_pack_roundtrip_rows() -> None:
    """Packed partials can be split by destination rows and unpacked on the receiving side."""
    msg, index, part = messages(1, 1)
    local = merge.partial_mean(msg, index, N_DST)
    packed = merge.pack(local)
    assert packed.shape == (N_DST, WIDTH + 1)
    rows = torch.tensor([4, 0, 7])
    sub = merge.unpack(local, packed[rows])
    assert torch.equal(sub.total, local.total[rows])
    assert torch.equal(sub.count, local.count[rows])


def test_softmax_travels_folded() -> None:
    """A softmax partial is packed as (log-sum-exp, mean) per head, H * (C + 1) columns instead
    of H * (C + 2); unpacked rows (empty destinations included) merge to the same result."""
    msg, index, part = messages(2, 2)
    heads, width = WIDTH, 2
    values = torch.stack([msg, -msg], dim=-1)  # [E, H, C]
    locals_ = [
        merge.partial_softmax(msg[part == p] * 5, values[part == p], index[part == p], N_DST)
        for p in range(2)
    ]
    packed = [merge.pack(p) for p in locals_]
    assert packed[0].shape == (N_DST, heads * (width + 1))
    rows = torch.tensor([4, 0, 7, N_DST - 1])  # the last destination gets no message
    sub = [merge.unpack(p, x[rows]) for p, x in zip(locals_, packed, strict=True)]
    check(merge.merge_softmax(sub), merge.merge_softmax(locals_)[rows])
    assert torch.equal(merge.merge_softmax(sub)[-1], torch.zeros(heads, width))


def test_no_destinations() -> None:
    """A worker owning no destination packs and merges empty partials."""
    logits, values = torch.randn(0, 2), torch.randn(0, 2, 3)
    local = merge.partial_softmax(logits, values, torch.zeros(0, dtype=torch.long), 0)
    packed = merge.pack(local)
    assert packed.shape == (0, 2 + 6)
    assert merge.merge_softmax([merge.unpack(local, packed)] * 2).shape == (0, 2, 3)


@pytest.mark.parametrize("weighted", [False, True])
def test_sum_rows_without_messages(weighted: bool) -> None:
    """The sparse-matmul partial sum reads rows of a table: same as gathering the messages."""
    gen = torch.Generator().manual_seed(9)
    table = torch.randn(40, WIDTH, generator=gen)
    rows = torch.randint(0, 40, (150,), generator=gen)
    index = torch.randint(0, N_DST, (150,), generator=gen)
    weight = torch.rand(150, generator=gen) if weighted else None
    msg = table[rows] if weight is None else table[rows] * weight.unsqueeze(1)
    got = merge.partial_sum_rows(table, rows, index, N_DST, weight).total
    check(got, merge.partial_sum(msg, index, N_DST).total)
    empty = merge.partial_sum_rows(table, rows[:0], index[:0], N_DST).total
    assert torch.equal(empty, torch.zeros(N_DST, WIDTH))
