"""gnnserve.fanouts: the one check of fanouts for every path (config, requests, samplers)."""

from __future__ import annotations

import numpy as np
import pytest

from gnnserve.config import SamplerConfig
from gnnserve.errors import InvalidInputError
from gnnserve.fanouts import MAX_FANOUT, check_fanouts, parse_fanouts
from gnnserve.newnodes.result import check_run_options
from gnnserve.sampling.presample import PreSampler


@pytest.mark.parametrize(
    ("fanouts", "want"),
    [
        ([25, 10], [25, 10]),
        ([-1], [-1]),
        ([MAX_FANOUT, -1, 1], [MAX_FANOUT, -1, 1]),
        ((3, 2), [3, 2]),
        (np.array([4, 2]), [4, 2]),
        ([np.int64(7)], [7]),
    ],
)
def test_valid_fanouts_come_back_as_python_ints(fanouts, want) -> None:
    got = check_fanouts(fanouts)
    assert got == want and all(type(f) is int for f in got)


@pytest.mark.parametrize(
    "fanouts",
    [
        [],
        [0],
        [-2],
        [MAX_FANOUT + 1],
        [2**63],
        [2**63 - 1],
        [-(2**63)],
        [10**30],
        [2.0],
        [float("inf")],
        [float("nan")],
        ["5"],
        [True],
        [None],
        "25,10",
        5,
        None,
        [[5]],
    ],
)
def test_invalid_fanouts_are_a_typed_error_naming_fanouts(fanouts) -> None:
    with pytest.raises(InvalidInputError) as info:
        check_fanouts(fanouts)
    assert info.value.field == "fanouts"
    assert len(info.value.message) < 200  # a huge value is not echoed in full


def test_the_new_node_options_and_the_config_use_the_same_bound() -> None:
    with pytest.raises(InvalidInputError) as info:
        check_run_options(0.1, "random", [2**63, 1], 0, num_layers=2)
    assert info.value.field == "fanouts"
    with pytest.raises(ValueError, match="fanout"):
        SamplerConfig(fanouts=[MAX_FANOUT + 1])
    assert SamplerConfig(fanouts=[MAX_FANOUT, -1]).fanouts == [MAX_FANOUT, -1]
    with pytest.raises(InvalidInputError) as info:
        check_run_options(0.1, "random", [2, 2, 2], 0, num_layers=2)
    assert info.value.field == "fanouts" and "3 hops" in info.value.message


@pytest.mark.parametrize(("fanouts", "hops"), [([5, 3], 1), ([5], 2), ([-1, 2, 2], 2)])
def test_hop_count_must_match_the_model(fanouts: list[int], hops: int) -> None:
    assert check_fanouts([2] * hops, hops=hops) == [2] * hops
    with pytest.raises(InvalidInputError) as info:
        check_fanouts(fanouts, hops=hops)
    assert info.value.field == "fanouts"
    assert f"has {len(fanouts)} hops, the model has {hops} layers" in info.value.message


def test_every_neighbour_can_be_refused_for_reservoirs() -> None:
    assert check_fanouts([-1, 3]) == [-1, 3]
    assert check_fanouts([MAX_FANOUT, 3], allow_all=False) == [MAX_FANOUT, 3]
    with pytest.raises(InvalidInputError) as info:
        check_fanouts([3, -1], allow_all=False)
    assert info.value.field == "fanouts" and "or -1" not in info.value.message
    with pytest.raises(InvalidInputError) as info:  # the pre-sampler uses that check
        PreSampler(np.array([0, 1, 1]), np.array([0]), [2, -1])
    assert info.value.message == "fanout -1 invalid: use an int in 1..1000000"


@pytest.mark.parametrize(
    ("text", "want"), [(None, None), ("25,10", [25, 10]), ("-1", [-1]), (" 5 , 3", [5, 3])]
)
def test_parse_fanouts_reads_comma_separated_ints(text: str | None, want) -> None:
    assert parse_fanouts(text) == want


@pytest.mark.parametrize("text", ["", "25,,10", "a", "2.5", "25;10"])
def test_parse_fanouts_names_the_flag(text: str) -> None:
    with pytest.raises(InvalidInputError) as info:
        parse_fanouts(text, "--eval-fanouts")
    assert info.value.field == "fanouts" and "--eval-fanouts" in info.value.message
