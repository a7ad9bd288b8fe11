"""Ports for servers started next: drawn below the kernel's ephemeral range (where no outgoing
connection can take them before the server binds), checked free, never a taken one."""

from __future__ import annotations

import socket

import pytest

from gnnserve import ports
from gnnserve.data.seaweed import free_ports


def _room_below_ephemeral(needed: int = 0) -> int:
    floor = ports.ephemeral_floor()
    if floor - needed - ports.FIRST_FREE_PORT < 1000:
        pytest.skip(f"ephemeral range starts at {floor}: no room below it")
    return floor


def test_free_ports_lie_below_the_ephemeral_range_and_bind() -> None:
    floor = _room_below_ephemeral()
    drawn = {ports.free_port() for _ in range(20)}
    assert all(ports.FIRST_FREE_PORT <= p < floor for p in drawn), drawn
    assert len(drawn) > 1  # drawn at random, not one fixed port
    with socket.socket() as s:
        s.bind(("127.0.0.1", drawn.pop()))  # free as reported


def test_a_port_that_is_taken_is_never_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        taken = held.getsockname()[1]
        draws = iter([taken, taken, *range(taken + 1, taken + 100)])
        monkeypatch.setattr(ports, "candidate_port", lambda room=0: next(draws))
        assert ports.free_port() > taken  # the taken port was drawn twice and passed over


def test_object_store_pairs_keep_their_grpc_port_below_the_range() -> None:
    floor = _room_below_ephemeral(10_000)
    chosen = free_ports(2, 1)
    assert len(set(chosen)) == 3
    for p in chosen[:2]:
        assert ports.FIRST_FREE_PORT <= p < floor - 10_000, (p, floor)
    assert ports.FIRST_FREE_PORT <= chosen[2] < floor
