"""How late the event loop runs: the wait a request's bytes spend before the server sees them.

The deadline a client sends (``X-Timeout-Ms``) runs from when it sent the request; the server
first sees it when the event loop gets round to it. While the loop is busy (parsing, answering
hundreds of 429s, writing responses) or starved of CPU by the engine's threads, that wait is
real time the answer no longer has, and nothing on the request path measures it. ``LoopLag``
samples it: a task sleeps ``interval_s`` and records how much later than asked it woke up. A
request handled now waited about as long as the loop's recent lag (``recent_s``); the shedding
middleware dates its arrival back by that much, so its deadline, admission's prediction and the
calibration of that prediction all count the wait.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Callable


class LoopLag:
    """Samples of the event loop's lag, seconds (``start()`` inside the running loop)."""

    def __init__(
        self,
        interval_s: float = 0.005,
        recent: int = 4,
        observe: Callable[[float], None] | None = None,
    ) -> None:
        self.interval_s = interval_s
        self._recent: deque[float] = deque([0.0], maxlen=recent)
        self._observe = observe  # e.g. a Prometheus histogram's observe
        self._task: asyncio.Task[None] | None = None

    @property
    def recent_s(self) -> float:
        """The largest lag among the last few samples (0 before the first)."""
        return max(self._recent)

    def start(self) -> None:
        """Begin sampling on the running loop."""
        self._task = asyncio.get_running_loop().create_task(self._sample())

    async def stop(self) -> None:
        """Stop sampling."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _sample(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            start = loop.time()
            await asyncio.sleep(self.interval_s)
            lag = max(loop.time() - start - self.interval_s, 0.0)
            self._recent.append(lag)
            if self._observe is not None:
                self._observe(lag)
