"""Seed popularity learned online: exact counts without decay, halving per half-life, prior."""

from __future__ import annotations

import numpy as np
import pytest

from gnnserve.errors import InvalidInputError
from gnnserve.sampling.traffic import SeedTraffic


def test_without_decay_the_distribution_is_the_smoothed_count() -> None:
    traffic = SeedTraffic(50, half_life=float("inf"), prior_weight=5.0)
    seeds = np.random.default_rng(0).zipf(1.5, 4000) % 50
    for chunk in np.array_split(seeds, 37):
        traffic.observe(chunk)
    counts = np.bincount(seeds, minlength=50).astype(float)
    expected = (counts + 5.0 / 50) / (seeds.size + 5.0)
    np.testing.assert_allclose(traffic.distribution(), expected, rtol=1e-12)
    assert traffic.seen == seeds.size


def test_a_count_weighs_half_after_one_half_life_of_later_seeds() -> None:
    traffic = SeedTraffic(4, half_life=100.0, prior_weight=0.0)
    traffic.observe(np.zeros(100, dtype=np.int64))
    traffic.observe(np.ones(100, dtype=np.int64))  # node 0's seeds are now one half-life old
    p = traffic.distribution()
    # node 1's 100 seeds, observed at once, weigh 1; node 0's weigh 1/2
    assert p[0] / p[1] == pytest.approx(0.5, rel=1e-9)
    assert p[2] == p[3] == 0.0


def test_popularity_shift_shows_within_a_few_half_lives() -> None:
    traffic = SeedTraffic(10, half_life=500.0, prior_weight=1.0)
    traffic.observe(np.full(20_000, 3))
    traffic.observe(np.full(3_000, 7))  # six half-lives: node 3's 20,000 weigh 20,000 / 64
    p = traffic.distribution()
    assert p[7] / p[3] == pytest.approx((3000 + 0.1) / (20_000 / 64 + 0.1), rel=1e-9)  # + prior
    assert int(np.argmax(p)) == 7


def test_prior_and_input_checks() -> None:
    traffic = SeedTraffic(3, prior_weight=2.0)
    np.testing.assert_allclose(traffic.distribution(np.array([1.0, 0.0, 1.0])), [0.5, 0, 0.5])
    with pytest.raises(InvalidInputError, match="seeds"):
        traffic.observe(np.array([3]))
    with pytest.raises(InvalidInputError, match="seeds"):
        traffic.observe(np.array([-1]))
    with pytest.raises(InvalidInputError, match="half_life"):
        SeedTraffic(3, half_life=0)
    with pytest.raises(InvalidInputError, match="p0"):
        traffic.distribution(np.ones(2))
    assert SeedTraffic(0).distribution().size == 0


def test_the_default_prior_weighs_a_tenth_of_the_node_count() -> None:
    traffic = SeedTraffic(100, half_life=float("inf"))
    traffic.observe(np.zeros(10, dtype=np.int64))
    p = traffic.distribution()
    assert p[0] == pytest.approx((10 + 10 * 0.01) / (10 + 10), rel=1e-12)
    assert p[1] == pytest.approx(10 * 0.01 / 20, rel=1e-12)
