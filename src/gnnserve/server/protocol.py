"""uvicorn's HTTP protocols with JSON protocol-level errors.

A request uvicorn cannot parse (a malformed request line or header, a bad chunk) never reaches
the application: uvicorn answers 400 itself, in ``text/plain``. The API promises JSON errors, so
these subclasses answer the same 400 with the JSON error body (kind ``bad_request``) and close
the connection, as uvicorn does. :func:`http_protocol` picks the one uvicorn's ``http="auto"``
would (httptools when installed, else h11); pass it as ``uvicorn.run(..., http=...)``.
"""

from __future__ import annotations

import json

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from gnnserve.errors import GnnServeError


class BadRequestError(GnnServeError):
    """The HTTP request itself is malformed (refused by the HTTP parser, before the app)."""

    http_status = 400
    kind = "bad_request"


def _body(message: str) -> bytes:
    return json.dumps(BadRequestError(f"malformed HTTP request: {message}").to_json()).encode()


class JsonH11Protocol(H11Protocol):
    """h11 protocol whose 400 for an unparsable request is JSON."""

    def send_400_response(self, msg: str) -> None:
        """The JSON 400, then close (uvicorn's own sends text/plain)."""
        body = _body(msg)
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"connection", b"close"),
        ]
        event = h11.Response(status_code=400, headers=headers, reason=b"Bad Request")
        self.transport.write(self.conn.send(event) or b"")
        self.transport.write(self.conn.send(h11.Data(data=body)) or b"")
        self.transport.close()


def http_protocol() -> type:
    """The JSON-error protocol class for ``uvicorn.run(http=...)`` (httptools when present)."""
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    except ImportError:  # no httptools: uvicorn's auto choice is h11 too
        return JsonH11Protocol

    class JsonHttpToolsProtocol(HttpToolsProtocol):
        """httptools protocol whose 400 for an unparsable request is JSON."""

        def send_400_response(self, msg: str) -> None:
            """The JSON 400, then close (uvicorn's own sends text/plain)."""
            body = _body(msg)
            head = (
                b"HTTP/1.1 400 Bad Request\r\n"
                b"content-type: application/json\r\n"
                b"content-length: %d\r\n"
                b"connection: close\r\n\r\n" % len(body)
            )
            self.transport.write(head + body)
            self.transport.close()

    return JsonHttpToolsProtocol
