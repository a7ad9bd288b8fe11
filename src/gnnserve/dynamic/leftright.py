"""Left-right replication: readers pin a version without ever waiting for a writer.

The changing graph (and its features) is kept twice. Readers use the *active* copy; the writer
changes the *spare* one, publishes it by flipping which copy is active, waits until the readers
that pinned the old copy before the flip have released it, then repeats the change on the old
copy, which becomes the next spare (Ramalhete and Correia's left-right pattern; DGS's
double-buffered reservoirs are the same idea for samples). When readers still hold the old
copy (or the change is long), that second application runs in a background thread, so the
writer never waits for a reader either: the next batch waits for it before it changes that copy.
A reader's only synchronisation is a counter update under a mutex that no one holds for longer
than that update.

Why this and not copy-on-write segments: the sampling kernels read flat ``(start, degree, cols)``
arrays that a batch changes in place; left-right keeps those kernels unchanged and a batch costs
its own size twice, whereas copy-on-write of flat arrays costs the graph's size per batch (or
version-aware kernels). The price is memory (two copies of the adjacency and feature rows) and
the writer's time (each batch applied twice; the second time only after the old readers left).

A reader's pinned copy is attached to its thread (``enter``/``leave``), so every read the thread
makes goes to the copy of the version it pinned; a pin may be handed to another thread
(``detach`` then ``attach``), as the engine's sampling stage hands a batch to its fetch stage.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

log = logging.getLogger(__name__)


class Replica(Protocol):
    """One copy of the replicated state."""

    def clone(self) -> Replica:
        """An independent copy equal in content and in the order of every row."""


R = TypeVar("R", bound=Replica)


@dataclass(frozen=True)
class ReadPin:
    """A pinned copy, handed from the thread that pinned it to the one that releases it."""

    side: int


class LeftRight(Generic[R]):
    """Two replicas: readers on the active one, the writer on the spare (see module docstring).

    Writers must be serialised by the caller (one ``write`` at a time); ``close`` when done.
    """

    def __init__(self, replica: R) -> None:
        """Start from ``replica`` (it becomes the active copy; the spare is its clone)."""
        self._sides: list[R] = [replica, replica.clone()]  # type: ignore[list-item]
        self._active = 0
        self._readers = [0, 0]
        self._cond = threading.Condition()
        self._local = threading.local()
        self._background = ThreadPoolExecutor(1, thread_name_prefix="left-right")
        self._catching_up: Future[None] | None = None

    @property
    def active(self) -> R:
        """The copy new readers pin."""
        return self._sides[self._active]

    def both(self) -> tuple[R, R]:
        """(active, spare), both at the same version: for a writer adding state to both."""
        self.settle()
        return self._sides[self._active], self._sides[1 - self._active]

    # readers -------------------------------------------------------------------------------
    def enter(self) -> R:
        """Pin the active copy and attach it to this thread; returns it."""
        with self._cond:
            side = self._active
            self._readers[side] += 1
        self._stack().append(side)
        return self._sides[side]

    def leave(self) -> None:
        """Release the pin attached last to this thread."""
        stack = self._stack()
        if not stack:
            raise RuntimeError("release_read without a read attached to this thread")
        side = stack.pop()
        with self._cond:
            self._readers[side] -= 1
            if self._readers[side] == 0:
                self._cond.notify_all()

    def detach(self) -> ReadPin:
        """Take the last pin off this thread, still held, to ``attach`` it in another."""
        stack = self._stack()
        if not stack:
            raise RuntimeError("detach_read without a read attached to this thread")
        return ReadPin(stack.pop())

    def attach(self, pin: ReadPin) -> None:
        """Attach a pin ``detach`` took off another thread to this one."""
        self._stack().append(pin.side)

    def reading(self) -> R:
        """The copy this thread reads: its pinned one, or the active one when it holds none
        (an unpinned read sees a consistent copy only if no batch is published meanwhile)."""
        stack = self._stack()
        return self._sides[stack[-1] if stack else self._active]

    def _stack(self) -> list[int]:
        stack: list[int] | None = getattr(self._local, "stack", None)
        if stack is None:
            stack = self._local.stack = []
        return stack

    # the writer ----------------------------------------------------------------------------
    def write(
        self,
        change: Callable[[R], None],
        before_publish: Callable[[R], None],
        catch_up: Callable[[R, R], None] | None = None,
        background: bool = False,
    ) -> None:
        """Apply ``change`` to both copies, publishing it in between.

        ``before_publish(changed copy)`` runs after the first application, before any reader
        can see it. The second application (``catch_up(behind, ahead)`` instead of ``change``
        when given: e.g. copying what ``change`` wrote) runs at once when no reader holds the
        old copy and ``background`` is False; else in the background once those readers
        leave, and the next ``write`` (or ``settle``) waits for it. (``background`` pays for
        long, GIL-free changes: they overlap the caller's next batch.) A failure on the spare
        (``change`` or ``before_publish``) leaves readers on the old version (the spare is
        rebuilt from the active copy); a failure in the background rebuilds the old copy from
        the new one.
        """
        self.settle()
        spare = 1 - self._active

        def first(replica: R) -> None:
            change(replica)
            before_publish(replica)

        self._guarded(spare, first, source=self._active)
        with self._cond:
            self._active = spare
            free = self._readers[1 - spare] == 0
        if catch_up is not None:
            ahead = self._sides[spare]
            change = lambda behind: catch_up(behind, ahead)  # noqa: E731
        if free and not background:  # no reader to wait for: no thread hand-off either
            self._level(1 - spare, change)
        else:
            self._catching_up = self._background.submit(self._catch_up, 1 - spare, change)

    def settle(self, timeout_s: float | None = None) -> None:
        """Wait until both copies hold the last published version (the catch-up is done)."""
        pending, self._catching_up = self._catching_up, None
        if pending is not None:
            pending.result(timeout_s)

    def close(self, timeout_s: float = 30.0) -> None:
        """Finish the catch-up (a reader that never releases its pin holds it) and stop."""
        try:
            self.settle(timeout_s)
        except TimeoutError:
            log.warning("left-right: a reader still holds the old copy; not waiting for it")
        self._background.shutdown(wait=False)

    def _catch_up(self, old: int, change: Callable[[R], None]) -> None:
        with self._cond:
            while self._readers[old]:
                self._cond.wait()
        self._level(old, change)

    def _level(self, old: int, change: Callable[[R], None]) -> None:
        """Bring copy ``old`` to the published version. The write is already published, so a
        failure here is not the writer's: the copy is rebuilt from the current one, logged."""
        try:
            self._guarded(old, change, source=1 - old)
        except Exception:
            log.exception("left-right: the copy behind was rebuilt from the current one")

    def _guarded(self, side: int, change: Callable[[R], None], source: int) -> None:
        try:
            change(self._sides[side])
        except BaseException:
            self._sides[side] = self._sides[source].clone()  # type: ignore[assignment]
            raise
