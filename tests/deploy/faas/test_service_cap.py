"""The instance cap per function from the cores the CPU quotas need (FaaSService's cap rule)."""

from __future__ import annotations

import logging

import pytest

from gnnserve.deploy.faas.service import cpu_instance_cap, cpu_quota, instance_cap


@pytest.mark.parametrize(
    ("budget", "quotas"),
    [
        (2.0, (266 / 256, 290 / 256)),
        (16.0, (0.3, 0.5)),
        (8.0, (1.0, 1.0)),
        (5.0, (1.0, 1.0)),
        (2.0, (1.0, 1.0)),
    ],
)
def test_the_cap_is_the_pairs_the_budget_holds(budget: float, quotas: tuple[float, ...]) -> None:
    cap = cpu_instance_cap(budget, quotas)
    assert cap is not None and cap >= 1
    assert cap * sum(quotas) <= budget or cap == 1  # fits, or one pair when none fits
    assert (cap + 1) * sum(quotas) > budget  # and one more pair would not


def test_the_quota_is_memory_over_mb_per_cpu() -> None:
    assert cpu_quota(512, 256) == 2.0 and cpu_quota(1769, 1769) == 1.0
    assert cpu_quota(512, 0) == 0.0 and cpu_quota(0, 256) == 0.0  # no quota, no limit


def test_no_quota_or_no_budget_means_no_cap() -> None:
    assert cpu_instance_cap(2.0, (0.0, 0.0)) is None
    assert cpu_instance_cap(0.0, (1.0, 1.0)) is None
    assert instance_cap(None, 0, (0.0, 0.0), 2.0) is None


def test_min_instances_raise_the_derived_cap() -> None:
    assert instance_cap(None, 0, (1.0, 1.0), 4.0) == 2
    assert instance_cap(None, 3, (1.0, 1.0), 4.0) == 3


def test_an_explicit_cap_is_kept_and_oversubscription_is_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="gnnserve.deploy.faas.service"):
        assert instance_cap(2, 0, (1.0, 1.0), 4.0) == 2
        assert not caplog.records
        assert instance_cap(5, 0, (1.0, 1.0), 4.0) == 5
    assert "need 10.0 cores" in caplog.text and "budget is 4" in caplog.text
