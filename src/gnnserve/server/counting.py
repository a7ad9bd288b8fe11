"""Count the API requests the application received and answered; reported when serving stops.

A request counts as *received* when the application is called for it (uvicorn has read its
headers), and as *answered* once its last response body has been handed back to the server.
Health probes and ``/metrics`` scrapes are not counted. A client that disconnects before it has
sent its whole body is counted as *disconnected*, not answered (there is no one to answer; no
traceback is logged). After a graceful stop ``received == answered + disconnected``: every
request the application accepted was answered (``gnnserve serve`` prints the counts).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

UNCOUNTED = frozenset({"/v2/health/live", "/v2/health/ready", "/metrics"})


@dataclass
class RequestCounts:
    """Requests received and answered since start-up; ``by_status``: answers per HTTP status."""

    received: int = 0
    answered: int = 0
    by_status: Counter[int] = field(default_factory=Counter)
    disconnected: int = 0  # clients gone before their whole request body arrived

    def summary(self) -> str:
        """One line, e.g. ``answered 12 of 12 requests received (200: 11, 429: 1)``, plus the
        clients that disconnected mid-request when there were any."""
        statuses = ", ".join(f"{s}: {n}" for s, n in sorted(self.by_status.items()))
        line = (
            f"answered {self.answered} of {self.received} requests received ({statuses or 'none'})"
        )
        if self.disconnected:
            line += f"; {self.disconnected} client(s) disconnected before sending the whole request"
        return line


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
        except ClientDisconnect:  # gone mid-body: nothing to answer, nothing went wrong here
            counts.disconnected += 1
        except Exception:  # cancelled: not answered
            if status == 0:  # not started: Starlette's ServerErrorMiddleware answers it with 500
                counts.answered += 1
                counts.by_status[500] += 1
            raise
