"""check_fanouts: the one check of fanouts for every path (config, requests, samplers)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from gnnserve.config import SamplerConfig
from gnnserve.errors import InvalidInputError
from gnnserve.graph import open_graph_store
from gnnserve.newnodes.result import check_run_options
from gnnserve.sampling import sampler
from gnnserve.sampling.sampler import MAX_FANOUT, check_fanouts


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


def test_size_bound_does_not_wrap_around_for_large_fanouts(small_store: Path) -> None:
    """The sampler's per-seed size bound grows with the fanouts instead of overflowing int64."""
    s = sampler.NeighborSampler(open_graph_store(small_store), [MAX_FANOUT] * 4)
    assert s.expected_size(np.array([0])) >= float(MAX_FANOUT) ** 4
