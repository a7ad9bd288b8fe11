"""Phases: each step's wall time recorded and logged as it ends, also when the step raises."""

from __future__ import annotations

import logging
import time

import pytest

from gnnserve.phases import Phases


def test_steps_add_up_and_are_logged_even_when_one_fails(caplog: pytest.LogCaptureFixture) -> None:
    phases = Phases("start-up", logging.getLogger("t"))
    with caplog.at_level(logging.INFO, logger="t"):
        with phases("a"):
            time.sleep(0.02)
        with pytest.raises(ValueError), phases("b"):
            raise ValueError("boom")
        with phases("a"):
            time.sleep(0.02)
    assert list(phases.seconds) == ["a", "b"]
    assert phases.seconds["a"] >= 0.04 and phases.seconds["b"] >= 0.0
    assert phases.total() == pytest.approx(sum(phases.seconds.values()))
    assert [r.getMessage().split(" took")[0] for r in caplog.records] == [
        "start-up: a",
        "start-up: b",
        "start-up: a",
    ]
    assert phases.summary().startswith(f"{phases.total():.1f} s (a ")
