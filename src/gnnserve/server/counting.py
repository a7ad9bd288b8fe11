"""Count the API requests the application received and answered; reported when serving stops.

A request counts as *received* when the application is called for it (uvicorn has read its
headers), and as *answered* once its last response body has been handed back to the server.
Health probes and ``/metrics`` scrapes are not counted. After a graceful stop the two counts are
equal: every request the application accepted was answered (``gnnserve serve`` prints them).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from starlette.types import ASGIApp, Message, Receive, Scope, Send

UNCOUNTED = frozenset({"/v2/health/live", "/v2/health/ready", "/metrics"})


@dataclass
class RequestCounts:
    """Requests received and answered since start-up; ``by_status``: answers per HTTP status."""

    received: int = 0
    answered: int = 0
    by_status: Counter[int] = field(default_factory=Counter)

    def summary(self) -> str:
        """One line, e.g. ``answered 12 of 12 requests received (200: 11, 429: 1)``."""
        statuses = ", ".join(f"{s}: {n}" for s, n in sorted(self.by_status.items()))
        return (
            f"answered {self.answered} of {self.received} requests received ({statuses or 'none'})"
        )


class CountRequests:
    """Pure ASGI middleware that keeps a :class:`RequestCounts` (event-loop thread only)."""

    def __init__(self, app: ASGIApp, counts: RequestCounts) -> None:
        self.app = app
        self.counts = counts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in UNCOUNTED:
            await self.app(scope, receive, send)
            return
        counts = self.counts
        counts.received += 1
        status = 0

        async def counted(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                counts.answered += 1
                counts.by_status[status] += 1

        try:
            await self.app(scope, receive, counted)
        except Exception:  # cancelled: not answered
            if status == 0:  # not started: Starlette's ServerErrorMiddleware answers it with 500
                counts.answered += 1
                counts.by_status[500] += 1
            raise
