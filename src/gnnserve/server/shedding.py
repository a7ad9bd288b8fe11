"""Early load shedding: a pure ASGI middleware that refuses predict requests before their body.

Under overload, parsing and validating a JSON body costs more than answering it: the 429 has
to be cheaper than the work it avoids, or the refusals queue up behind the event loop like the
requests they refuse. For ``POST /v1/predict`` and ``POST /v2/models/{name}/infer`` this
middleware asks the engine's admission whether the smallest request (one node) would be
admitted right now (in-flight bound, predicted queueing delay, the caller's deadline) and, if
not, answers a pre-encoded JSON 429 with a ``Retry-After`` header without reading the body.
Requests it lets through carry their arrival time and deadline (``X-Timeout-Ms``) to admission,
which checks them again with their real size once parsed; when their response is sent, its
time calibrates admission's predictions. The arrival is dated back by the event loop's recent
lag (:mod:`gnnserve.server.looplag`): the time the request waited for the loop counts against
its deadline too.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gnnserve.engine.admission import (
    REQUEST,
    TIMEOUT_HEADER,
    Admission,
    RequestContext,
    parse_timeout_ms,
)
from gnnserve.errors import GnnServeError, InvalidInputError, OverloadedError
from gnnserve.server.limits import retry_after
from gnnserve.server.looplag import LoopLag
from gnnserve.server.metrics import ServerMetrics
from gnnserve.server.models import ModelRepository

_HEADER = TIMEOUT_HEADER.lower().encode("latin-1")
_OVERLOADED = json.dumps(
    OverloadedError(
        "server overloaded: the requests already admitted would not be answered within the "
        "queueing budget or this request's deadline (or the queue is full); retry later"
    ).to_json()
).encode()


def sheds(path: str) -> bool:
    """True for the paths whose requests run the model (and may be shed)."""
    return path == "/v1/predict" or (path.startswith("/v2/models/") and path.endswith("/infer"))


def _header(scope: Scope, name: bytes) -> bytes | None:
    for key, value in scope["headers"]:
        if key == name:
            return bytes(value)
    return None


async def _answer(send: Send, status: int, body: bytes, extra: list[tuple[bytes, bytes]]) -> None:
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        *extra,
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class SheddingMiddleware:
    """Answers 429 to predict requests the engine would refuse now, before reading the body."""

    def __init__(
        self,
        app: ASGIApp,
        admission_for: Callable[[str], Admission],
        metrics: ServerMetrics | None = None,
        loop_lag: LoopLag | None = None,
    ) -> None:
        self.app = app
        self.admission_for = admission_for  # the admission of the model a path names
        self.loop_lag = loop_lag
        self._refused: Any = metrics.errors.labels("overloaded") if metrics is not None else None
        self._invalid: Any = metrics.errors.labels("invalid_input") if metrics is not None else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or not sheds(scope["path"]):
            await self.app(scope, receive, send)
            return
        now = time.perf_counter()
        if self.loop_lag is not None:
            now -= self.loop_lag.recent_s  # it waited about that long for the loop
        deadline = None
        raw = _header(scope, _HEADER)
        if raw is not None:
            try:
                deadline = now + parse_timeout_ms(raw.decode("latin-1")) / 1e3
            except InvalidInputError as exc:
                await self._error(send, exc, self._invalid)
                return
        admission = self.admission_for(scope["path"])
        retry_s = None if admission.closed else admission.would_refuse(deadline)
        if retry_s is not None:
            if self._refused is not None:
                self._refused.inc()
            hint = retry_after(retry_s).encode()
            await _answer(send, 429, _OVERLOADED, [(b"retry-after", hint)])
            return
        ctx = RequestContext(now, deadline)

        async def sent(message: Message) -> None:
            await send(message)
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                ctx.answered(time.perf_counter())

        token = REQUEST.set(ctx)
        try:
            await self.app(scope, receive, sent)
        finally:
            REQUEST.reset(token)

    @staticmethod
    async def _error(send: Send, exc: GnnServeError, counter: Any) -> None:
        if counter is not None:
            counter.inc()
        await _answer(send, exc.http_status, json.dumps(exc.to_json()).encode(), [])


def admission_by_path(models: ModelRepository) -> Callable[[str], Admission]:
    """The admission the shedding middleware asks for a path: the named model's under
    ``/v2/models/{name}/``, else the first model's."""

    def admission(path: str) -> Admission:
        parts = path.split("/")
        if len(parts) > 3 and parts[1:3] == ["v2", "models"]:
            try:
                return models.get(parts[3]).admission
            except GnnServeError:
                pass  # the route answers the 404
        return models.base.admission

    return admission
