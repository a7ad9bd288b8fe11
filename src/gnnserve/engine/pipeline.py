"""Stage threads connected by bounded queues: batches of different stages overlap in time."""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable

import numba

from gnnserve.engine.batcher import STOP, Batch
from gnnserve.errors import GnnServeError, InvalidInputError, internal_error

log = logging.getLogger(__name__)


def fail_batch(batch: Batch, exc: BaseException) -> None:
    """Resolve every request of ``batch`` with ``exc`` (wrapped when it is not one of ours)."""
    if not isinstance(exc, GnnServeError):
        log.exception("batch failed", exc_info=exc)
        exc = internal_error(exc)
    for ticket in batch.tickets:
        if not ticket.future.done():
            ticket.future.set_exception(exc)


def use_kernel_threads(threads: int | None) -> None:
    """Run this thread's numba parallel kernels on ``threads`` threads (numba's count is per
    calling thread; None leaves every core; more than numba's pool is capped)."""
    if threads is not None:
        pool = int(numba.config.NUMBA_NUM_THREADS)  # type: ignore[attr-defined]
        numba.set_num_threads(max(1, min(int(threads), pool)))


def check_default_fanouts(batch: Batch, default: tuple[int, ...], deployment: str) -> None:
    """Refuse a batch whose requests ask for fanouts other than ``default``: InvalidInputError
    (field ``fanouts``) saying that ``deployment`` (who cannot serve them, and why) does not."""
    if batch.fanouts is not None and batch.fanouts != default:
        raise InvalidInputError(f"per-request fanouts are not served by {deployment}", "fanouts")


class Stage(threading.Thread):
    """Applies ``work`` to each batch from ``inbox`` and forwards it to ``outbox``.

    A failing batch resolves its requests with the error and the stage goes on; STOP is passed
    downstream after everything queued before it, so shutdown drains accepted work.
    """

    def __init__(
        self,
        name: str,
        work: Callable[[Batch], None],
        inbox: queue.Queue[object],
        outbox: queue.Queue[object] | None,
        on_exit: Callable[[Batch], None] | None = None,
        suffix: str = "",
        kernel_threads: int | None = None,
    ) -> None:
        super().__init__(name=f"gnnserve-{name}{suffix}", daemon=True)  # suffix: pipeline
        self.kernel_threads = kernel_threads
        self.stage_name = name
        self.work = work
        self.inbox = inbox
        self.outbox = outbox
        self.on_exit = on_exit  # called when a batch leaves the pipeline here (done or failed)

    def run(self) -> None:
        use_kernel_threads(self.kernel_threads)
        while True:
            item = self.inbox.get()
            if item is STOP:
                if self.outbox is not None:
                    self.outbox.put(STOP)
                return
            assert isinstance(item, Batch)
            start = time.perf_counter()
            try:
                self.work(item)
            except BaseException as exc:  # noqa: BLE001 - any failure is reported per request
                fail_batch(item, exc)
                self._exit(item)
                continue
            item.stage_ms[self.stage_name] = (time.perf_counter() - start) * 1e3
            if self.outbox is not None:
                self.outbox.put(item)
            else:
                self._exit(item)

    def _exit(self, batch: Batch) -> None:
        if self.on_exit is not None:
            self.on_exit(batch)
