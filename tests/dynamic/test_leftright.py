"""LeftRight's writer paths: a failure before publishing leaves readers on the old version and
reaches the writer; a failure while the second copy catches up is not the writer's."""

from __future__ import annotations

import pytest

from gnnserve.dynamic.leftright import LeftRight


class _Cell:
    """A replica holding one list."""

    def __init__(self, values: list[int]) -> None:
        self.values = values

    def clone(self) -> _Cell:
        return _Cell(list(self.values))


def _append(value: int):  # type: ignore[no-untyped-def]
    return lambda cell: cell.values.append(value)


def test_a_failing_catch_up_rebuilds_the_copy_behind_and_the_write_stands() -> None:
    lr = LeftRight(_Cell([0]))

    def broken(behind: _Cell, ahead: _Cell) -> None:
        behind.values.append(99)  # half a change, then a failure
        raise RuntimeError("catch-up failed")

    lr.write(_append(1), lambda cell: None, broken)  # published: does not raise
    active, spare = lr.both()
    assert active.values == spare.values == [0, 1] and active is not spare
    lr.write(_append(2), lambda cell: None)
    assert [c.values for c in lr.both()] == [[0, 1, 2], [0, 1, 2]]
    lr.close()


def test_a_failure_before_publishing_reaches_the_writer_and_readers_see_nothing() -> None:
    lr = LeftRight(_Cell([0]))

    def broken(cell: _Cell) -> None:
        cell.values.append(7)
        raise ValueError("bad batch")

    with pytest.raises(ValueError, match="bad batch"):
        lr.write(broken, lambda cell: None)
    assert lr.enter().values == [0]
    lr.leave()
    assert [c.values for c in lr.both()] == [[0], [0]]
    lr.close()
