"""The demo's helpers: a server's port is picked where no outgoing connection can take it."""

from __future__ import annotations

import socket

import pytest

from gnnserve import demo


def test_free_ports_lie_below_the_ephemeral_range_and_bind() -> None:
    floor = demo._ephemeral_floor()
    if floor - demo.FIRST_FREE_PORT < 1000:
        pytest.skip(f"ephemeral range starts at {floor}: no room below it")
    ports = {demo.free_port() for _ in range(20)}
    assert all(demo.FIRST_FREE_PORT <= p < floor for p in ports), ports
    assert len(ports) > 1  # drawn at random, not one fixed port
    with socket.socket() as s:
        s.bind(("127.0.0.1", ports.pop()))  # free as reported


def test_a_port_that_is_taken_is_never_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        taken = held.getsockname()[1]
        monkeypatch.setattr(demo, "FIRST_FREE_PORT", taken)
        monkeypatch.setattr(demo, "_ephemeral_floor", lambda: taken + 1000)
        draws = iter([taken, taken, *range(taken + 1, taken + 100)])
        monkeypatch.setattr(demo.random.SystemRandom, "randrange", lambda self, a, b: next(draws))
        assert demo.free_port() > taken  # the taken port was drawn twice and passed over
