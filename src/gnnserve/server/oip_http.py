"""The Open Inference Protocol v2 over HTTP: request bodies in, answers out, the error shape.

- A body is JSON whatever its ``Content-Type`` (tritonclient sends none). With the binary tensor
  data extension, the ``Inference-Header-Content-Length`` header gives the length of the JSON
  header; each input whose ``parameters`` hold ``binary_data_size`` takes that many bytes of
  what follows, in input order. A body sent with ``Content-Encoding: gzip`` or ``deflate`` is
  inflated first, never past the body limit (413).
- Outputs go out as binary data when the request's ``binary_data_output`` or the output's own
  ``binary_data`` parameter is true: the JSON header, then the bytes, with the
  ``Inference-Header-Content-Length`` header; else as JSON numbers.
- :class:`OipErrorShape` gives every error answered under ``/v2`` the protocol's shape,
  ``{"error": "<message>"}``, with gnnserve's ``kind`` and ``field`` as members beside it
  (``/v1`` keeps ``{"error": {kind, message, field}}``).
"""

from __future__ import annotations

import json
import zlib
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gnnserve.errors import InvalidInputError, PayloadTooLargeError, echo
from gnnserve.server.limits import PARSE_INLINE_BYTES, parse_body, parse_elsewhere
from gnnserve.server.oip_tensors import InferAnswer, InferCall, Tensor, from_bytes, from_values
from gnnserve.server.schemas import InferRequest

HEADER_LENGTH = "Inference-Header-Content-Length"
BINARY_OUTPUT = "binary_data_output"  # request parameter: every output as binary data
OUTPUT_PARAMETERS = ("binary_data",)  # what a requested output's parameters may hold
_JSON = "application/json"


async def read_call(request: Request, model: str, max_bytes: int) -> InferCall:
    """The :class:`InferCall` of an infer request's body (``max_bytes``: the inflated limit)."""
    raw = b"".join([chunk async for chunk in request.stream()])
    raw = inflate(raw, request.headers.get("content-encoding"), max_bytes)
    header, tail = split_body(raw, request.headers.get(HEADER_LENGTH))
    if len(header) > PARSE_INLINE_BYTES:
        body = await parse_elsewhere(InferRequest, bytes(header), _JSON)
    else:
        body = parse_body(InferRequest, bytes(header), _JSON)
    assert isinstance(body, InferRequest)
    return to_call(body, tail, model)


def inflate(raw: bytes, encoding: str | None, max_bytes: int) -> bytes:
    """``raw`` decoded from its ``Content-Encoding`` (gzip, deflate or none), at most
    ``max_bytes`` once inflated: past that 413, without inflating the rest."""
    name = (encoding or "identity").strip().lower()
    if name == "identity":
        return raw
    if name not in ("gzip", "deflate"):
        raise InvalidInputError(
            f"Content-Encoding {echo(encoding)} is not supported; send gzip, deflate or none",
            "content-encoding",
        )
    inflater = zlib.decompressobj(zlib.MAX_WBITS | 16 if name == "gzip" else zlib.MAX_WBITS)
    try:
        out = inflater.decompress(raw, max_bytes + 1)
    except zlib.error as exc:
        raise InvalidInputError(f"the body is not valid {name} data: {exc}", "body") from None
    if len(out) > max_bytes or inflater.unconsumed_tail:
        raise PayloadTooLargeError(
            f"the {name} body inflates past the limit of {max_bytes} bytes (server.max_body_bytes)",
            "body",
        )
    if not inflater.eof:
        raise InvalidInputError(f"the {name} body is truncated", "body")
    return out


def split_body(raw: bytes, header_length: str | None) -> tuple[memoryview, memoryview]:
    """(JSON header, binary data) of a body; the whole body is JSON without the header."""
    view = memoryview(raw)
    if header_length is None:
        return view, view[:0]
    text = header_length.strip()
    if not (text.isascii() and text.isdigit()) or int(text) > len(raw):
        raise InvalidInputError(
            f"{HEADER_LENGTH} must be a byte count within the body's {len(raw)} bytes, "
            f"got {echo(header_length)}",
            HEADER_LENGTH,
        )
    n = int(text)
    return view[:n], view[n:]


def to_call(body: InferRequest, tail: memoryview, model: str) -> InferCall:
    """The call of a parsed header and its binary data (each input's in order)."""
    inputs: list[Tensor] = []
    offset = 0
    for t in body.inputs:
        size = _binary_size(t.parameters, t.name)
        if size is None:
            if t.data is None:
                raise InvalidInputError(
                    f"input {echo(t.name)} has neither data nor binary_data_size", t.name
                )
            inputs.append(from_values(t.name, t.datatype, t.shape, t.data))
            continue
        if offset + size > len(tail):
            raise InvalidInputError(
                f"input {echo(t.name)} declares {size} bytes of binary data; "
                f"only {len(tail) - offset} follow the JSON header",
                t.name,
            )
        inputs.append(from_bytes(t.name, t.datatype, t.shape, tail[offset : offset + size]))
        offset += size
    if offset != len(tail):
        raise InvalidInputError(
            f"{len(tail) - offset} bytes follow the JSON header and the inputs' binary data",
            "body",
        )
    parameters = dict(body.parameters or {})
    every = parameters.pop(BINARY_OUTPUT, False)
    if not isinstance(every, bool):
        raise InvalidInputError(f"{BINARY_OUTPUT} must be true or false", "parameters")
    outputs = [o.name for o in body.outputs or []]
    binary = {o.name for o in body.outputs or [] if _wants_binary(o.parameters, o.name, every)}
    all_binary = every and not body.outputs  # the default output included
    return InferCall(model, inputs, outputs, binary, all_binary, parameters, body.id)


def _binary_size(parameters: dict[str, object] | None, name: str) -> int | None:
    size = (parameters or {}).get("binary_data_size")
    if size is None:
        return None
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise InvalidInputError(
            f"input {echo(name)}: binary_data_size must be a byte count, got {echo(size)}", name
        )
    return size


def _wants_binary(parameters: dict[str, object] | None, name: str, default: bool) -> bool:
    params = parameters or {}
    unknown = sorted(set(params) - set(OUTPUT_PARAMETERS))
    if unknown:
        raise InvalidInputError(
            f"output {echo(name)}: parameters {[echo(u) for u in unknown[:4]]} are not offered "
            f"(an output takes {list(OUTPUT_PARAMETERS)})",
            "outputs",
        )
    value = params.get("binary_data", default)
    if not isinstance(value, bool):
        raise InvalidInputError(f"output {echo(name)}: binary_data must be true or false", name)
    return value


def answer_response(answer: InferAnswer, call: InferCall) -> Response:
    """The HTTP answer: JSON, or the JSON header then the bytes of the outputs ``call`` asks
    for as binary data."""
    header: dict[str, Any] = {"model_name": answer.model, "model_version": answer.version}
    if answer.id is not None:
        header["id"] = answer.id
    if answer.parameters:
        header["parameters"] = answer.parameters
    chunks: list[bytes] = []
    outputs = []
    for t in answer.outputs:
        entry: dict[str, Any] = {"name": t.name, "datatype": t.datatype, "shape": list(t.shape)}
        if call.all_binary or t.name in call.binary:
            chunks.append(t.as_bytes())
            entry["parameters"] = {"binary_data_size": len(chunks[-1])}
        else:
            entry["data"] = t.values.reshape(-1).tolist()
        outputs.append(entry)
    header["outputs"] = outputs
    if not chunks:
        return JSONResponse(header)
    head = json.dumps(header, separators=(",", ":")).encode()
    return Response(
        head + b"".join(chunks),
        media_type="application/octet-stream",
        headers={HEADER_LENGTH: str(len(head))},
    )


class OipErrorShape:
    """ASGI middleware: an error answered under ``/v2`` (status >= 400, a JSON body holding
    ``{"error": {"message": ...}}``) takes the protocol's shape, ``{"error": "<message>"}``."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith("/v2"):
            await self.app(scope, receive, send)
            return
        start: Message | None = None
        parts: list[bytes] = []

        async def reshaped(message: Message) -> None:
            nonlocal start
            if message["type"] == "http.response.start" and message["status"] >= 400:
                start = message  # held until the body is complete
                return
            if start is None:
                await send(message)
                return
            parts.append(message.get("body", b""))
            if message.get("more_body", False):
                return
            body = flat_error(b"".join(parts))
            headers = [(k, v) for k, v in start["headers"] if k.lower() != b"content-length"]
            headers.append((b"content-length", str(len(body)).encode()))
            await send({**start, "headers": headers})
            await send({"type": "http.response.body", "body": body})

        await self.app(scope, receive, reshaped)


def flat_error(body: bytes) -> bytes:
    """``{"error": "<message>", "kind": ..., "field": ...}`` from gnnserve's error body (anything
    else unchanged): the protocol's string, gnnserve's details beside it."""
    try:
        error = json.loads(body).get("error")
    except (ValueError, AttributeError):
        return body
    if not isinstance(error, dict) or not isinstance(error.get("message"), str):
        return body
    flat = {"error": error["message"], "kind": error.get("kind"), "field": error.get("field")}
    return json.dumps(flat).encode()
