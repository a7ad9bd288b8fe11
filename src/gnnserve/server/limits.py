"""Request size limits: the body limit, off-loop parsing of large bodies, short echoes.

- :class:`BodyLimit` answers 413 (JSON) before the app reads a byte of a body whose
  Content-Length exceeds the limit, and stops reading a chunked body once it does.
- :class:`JsonBodyRoute` parses and validates a route's JSON body itself: inline when small,
  in a separate parser process when larger than :data:`PARSE_INLINE_BYTES`, so that a large
  legal request does not stall the event loop and every concurrent request while it is parsed.
  (A worker thread would not do: pydantic-core holds the GIL for most of a parse, and each
  request needs the GIL several times on its way through the loop and the engine.) Its long
  numeric lists come back as numpy arrays, which cost a copy to receive, not a parse.
- :func:`gnnserve.errors.echo` caps a client's string quoted back in an error message.
"""

from __future__ import annotations

import asyncio
import email.message
import importlib
import json
import math
import multiprocessing
import threading
from collections.abc import Callable, Coroutine
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

import numpy as np
from fastapi import Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from pydantic import BaseModel, ValidationError
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gnnserve.errors import ECHO_CHARS, MAX_MESSAGE_CHARS, GnnServeError, PayloadTooLargeError, cut

MIB = 1 << 20
# The default limit admits the largest new-node request (EmbeddingsConfig.max_new_nodes rows of
# feature_dim floats) with room to spare: JSON takes up to ~25 bytes per float32 value
# ("-1.2345678901234567e-05, "), budgeted as 32; BASE_BODY_BYTES covers the rest of a request
# (node ids, edges: ~700,000 edge pairs, update batches).
JSON_BYTES_PER_FLOAT = 32
BASE_BODY_BYTES = 16 * MIB
PARSE_INLINE_BYTES = 1 * MIB  # larger bodies are parsed and validated in the parser process
ARRAY_MIN_ITEMS = 256  # lists this long come back from the parser process as numpy arrays


_CLOSE = (b"connection", b"close")


def default_body_limit(max_new_nodes: int, feature_dim: int) -> int:
    """Bytes: the body limit when ``server.max_body_bytes`` is unset (see the module constants)."""
    return BASE_BODY_BYTES + JSON_BYTES_PER_FLOAT * max_new_nodes * feature_dim


def retry_after(seconds: float) -> str:
    """A ``Retry-After`` value: whole seconds, at least 1."""
    return str(max(1, math.ceil(seconds)))


def retry_headers(exc: GnnServeError) -> dict[str, str]:
    """``Retry-After`` when ``exc`` carries a retry hint."""
    return {} if exc.retry_after_s is None else {"Retry-After": retry_after(exc.retry_after_s)}


def error_json(exc: GnnServeError) -> dict[str, object]:
    """``exc.to_json()`` with its message and field cut to MAX_MESSAGE_CHARS / 2 * ECHO_CHARS.

    The backstop for messages that quote a client's value without :func:`gnnserve.errors.echo`.
    """
    body = exc.to_json()
    error = body["error"]
    assert isinstance(error, dict)
    for key, limit in (("message", MAX_MESSAGE_CHARS), ("field", 2 * ECHO_CHARS)):
        value = error.get(key)
        if isinstance(value, str):
            error[key] = cut(value, limit)
    return body


def _content_length(scope: Scope) -> int | None:
    value = Headers(scope=scope).get("content-length")
    try:
        return None if value is None else int(value)
    except ValueError:
        return None  # the HTTP server refuses a malformed Content-Length itself


class BodyLimit:
    """ASGI middleware: bodies over ``max_bytes`` get 413 JSON without being read.

    Content-Length over the limit: answered at once (``Connection: close``, the rest of the body
    is never read). A chunked body: counted as the app reads it, 413 once past the limit.
    Starlette's RequestBodyLimitMiddleware answers 413 in text/plain, and replaces any answer the
    app gives before reading (a 401, a 404) with it: the API promises JSON errors.
    """

    def __init__(
        self, app: ASGIApp, max_bytes: int, on_reject: Callable[[], None] | None = None
    ) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.on_reject = on_reject

    def error(self) -> PayloadTooLargeError:
        """The 413 error of this limit."""
        return PayloadTooLargeError(
            f"request body exceeds the limit of {self.max_bytes} bytes (server.max_body_bytes)",
            "body",
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.max_bytes:
            await self._reject(send)
            return
        received = 0
        started = exceeded = False

        async def limited_receive() -> Message:
            nonlocal received, exceeded
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    exceeded = True
                    raise self.error()
            return message

        async def watched_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                if exceeded:  # the app answered the 413: close rather than read the rest
                    message = {**message, "headers": [*message["headers"], _CLOSE]}
            await send(message)

        try:
            await self.app(scope, limited_receive, watched_send)
        except PayloadTooLargeError:
            if started:
                raise
            await self._reject(send)

    async def _reject(self, send: Send) -> None:
        if self.on_reject is not None:
            self.on_reject()
        body = json.dumps(error_json(self.error())).encode()
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            _CLOSE,  # the unread rest of the body is not waited for
        ]
        await send({"type": "http.response.start", "status": 413, "headers": headers})
        await send({"type": "http.response.body", "body": body})


def _is_json(content_type: str | None) -> bool:
    if not content_type:
        return False
    message = email.message.Message()
    message["content-type"] = content_type
    subtype = message.get_content_subtype()
    return message.get_content_maintype() == "application" and (
        subtype == "json" or subtype.endswith("+json")
    )


def _media_type(content_type: str | None) -> str:
    return (content_type or "").split(";", 1)[0].strip().lower()


RawBodyHandler = Callable[[bytes], Coroutine[Any, Any, Response]]


def accepts_raw(
    media_type: str, handler: RawBodyHandler
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorate a :class:`JsonBodyRoute` endpoint: bodies sent as ``media_type`` go to
    ``handler(body bytes)`` instead of the JSON parser (declare them in ``openapi_extra``)."""

    def mark(endpoint: Callable[..., Any]) -> Callable[..., Any]:
        raw_bodies = dict(getattr(endpoint, "raw_bodies", {}))
        raw_bodies[media_type] = handler
        endpoint.raw_bodies = raw_bodies  # type: ignore[attr-defined]
        return endpoint

    return mark


FastJsonHandler = Callable[[bytes], Coroutine[Any, Any, Response | None]]


def json_fast_path(handler: FastJsonHandler) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorate a :class:`JsonBodyRoute` endpoint: a JSON body (up to PARSE_INLINE_BYTES) goes
    to ``handler(body bytes)`` first, which answers it, or returns None to let the body be
    parsed and validated as usual (the usual path names every problem)."""

    def mark(endpoint: Callable[..., Any]) -> Callable[..., Any]:
        endpoint.json_fast_path = handler  # type: ignore[attr-defined]
        return endpoint

    return mark


def parse_body(model: type[BaseModel], body: bytes, content_type: str | None) -> BaseModel:
    """Validate a JSON ``body`` as ``model``; RequestValidationError (locations under "body")."""
    if not body:
        error = {"type": "missing", "loc": ("body",), "msg": "Field required", "input": None}
        raise RequestValidationError([error])
    if not _is_json(content_type):
        error = {
            "type": "content_type",
            "loc": ("body",),
            "msg": "the body must be JSON, sent with Content-Type: application/json",
            "input": None,
        }
        raise RequestValidationError([error])
    try:
        return model.model_validate_json(body)
    except ValidationError as exc:
        errors = [{**e, "loc": ("body", *e["loc"]), "input": None} for e in exc.errors()[:1]]
        raise RequestValidationError(errors) from None


_pool: ProcessPoolExecutor | None = None
_pool_lock = threading.Lock()


def _parser_pool() -> ProcessPoolExecutor:
    """The one parser process of this server process, started on first use (spawn: ~1 s)."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"))
        return _pool


async def parse_elsewhere(
    model: type[BaseModel], body: bytes, content_type: str | None
) -> BaseModel:
    """:func:`parse_body` run in the parser process (the event loop only waits for it)."""
    loop = asyncio.get_running_loop()
    pool = _parser_pool()
    try:
        parsed, errors = await loop.run_in_executor(
            pool, _parse_packed, model.__module__, model.__qualname__, body, content_type
        )
    except BrokenProcessPool:  # the parser died (killed, out of memory): start a new one
        global _pool
        with _pool_lock:
            _pool = None if _pool is pool else _pool
        raise GnnServeError("the request parser process failed; retry the request") from None
    if errors is not None:
        raise RequestValidationError(errors)
    assert isinstance(parsed, model)
    return parsed


def _parse_packed(
    module: str, name: str, body: bytes, content_type: str | None
) -> tuple[BaseModel | None, list[dict[str, Any]] | None]:
    """In the parser process: (the parsed body with its long lists as arrays, None) or
    (None, the validation errors as plain data)."""
    model = getattr(importlib.import_module(module), name)
    try:
        parsed = parse_body(model, body, content_type)
    except RequestValidationError as exc:
        errors = exc.errors()
        return None, [{k: e.get(k) for k in ("type", "loc", "msg", "input")} for e in errors]
    _pack(parsed)
    return parsed, None


def _pack(obj: BaseModel) -> None:
    """Replace the long numeric lists of ``obj`` (and of the models in it) by numpy arrays.

    A list stays a list when numpy cannot hold it exactly as one array (ragged rows, ids
    beyond int64): the checks downstream then see what the client sent.
    """
    for name, value in list(obj.__dict__.items()):
        if isinstance(value, BaseModel):
            _pack(value)
        elif isinstance(value, list) and value and isinstance(value[0], BaseModel):
            for item in value:
                _pack(item)
        elif isinstance(value, list) and len(value) >= ARRAY_MIN_ITEMS:
            try:
                arr = np.asarray(value)
            except (ValueError, OverflowError):
                continue
            if arr.dtype.kind in "if" and arr.dtype.itemsize == 8:
                obj.__dict__[name] = arr


class JsonBodyRoute(APIRoute):
    """A route whose one body parameter (a pydantic model) is parsed by :func:`parse_body`.

    Routes without a body keep FastAPI's handler.

    Bodies over PARSE_INLINE_BYTES are parsed in the parser process (:func:`parse_elsewhere`);
    pydantic-core parses and validates JSON in one pass, faster than ``json.loads`` plus
    validation, which FastAPI runs on the event loop. The other parameters must be ``str`` path
    parameters; the OpenAPI schema is FastAPI's, from the endpoint's signature.
    """

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        """The handler: read the body, parse it (off the loop when large), call the endpoint."""
        dependant = self.dependant
        if not dependant.body_params:
            return super().get_route_handler()  # nothing to parse
        if (
            len(dependant.body_params) != 1
            or dependant.query_params
            or dependant.header_params
            or dependant.cookie_params
            or dependant.dependencies
            or any(p.field_info.annotation is not str for p in dependant.path_params)
        ):
            raise TypeError(f"{self.path}: JsonBodyRoute takes one body and str path params")
        body_param = dependant.body_params[0]
        model = body_param.field_info.annotation
        assert isinstance(model, type) and issubclass(model, BaseModel)
        endpoint = self.endpoint
        path_names = [p.name for p in dependant.path_params]

        async def handler(request: Request) -> Response:
            # read without Request.body(), which would keep the bytes for the request's life
            raw = b"".join([chunk async for chunk in request.stream()])
            content_type = request.headers.get("content-type")
            other = getattr(endpoint, "raw_bodies", {}).get(_media_type(content_type))
            if other is not None:  # a binary body the endpoint takes as bytes
                bulk_response: Response = await other(raw)
                return bulk_response
            fast = getattr(endpoint, "json_fast_path", None)
            if fast is not None and len(raw) <= PARSE_INLINE_BYTES and _is_json(content_type):
                answered: Response | None = await fast(raw)
                if answered is not None:
                    return answered
            if len(raw) > PARSE_INLINE_BYTES:
                body = await parse_elsewhere(model, raw, content_type)
            else:
                body = parse_body(model, raw, content_type)
            del raw
            kwargs: dict[str, Any] = {n: request.path_params[n] for n in path_names}
            response: Response = await endpoint(**kwargs, **{body_param.name: body})
            return response

        return handler
