"""The error of an HTTP answer as ``{kind, message, field}``, from either shape the server
sends: ``/v1``'s ``{"error": {...}}`` or the Open Inference Protocol's ``{"error": "..."}``
(``/v2``: the message a string, ``kind`` and ``field`` beside it)."""

from __future__ import annotations

from typing import Any

import httpx


def error_of(r: httpx.Response) -> dict[str, Any]:
    """``{kind, message, field}`` of an error answer (asserts the shape its path promises)."""
    body = r.json()
    if r.url.path.startswith("/v2"):
        assert isinstance(body["error"], str), body
        return {"kind": body["kind"], "message": body["error"], "field": body["field"]}
    assert isinstance(body["error"], dict), body
    return dict(body["error"])
