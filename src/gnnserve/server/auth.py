"""API keys: bearer tokens with the scopes ``read``, ``write`` and ``admin``, checked before any
route.

Keys come from a file (``gnnserve serve --api-keys FILE``, or ``server.api_keys`` in the YAML
config) or from the environment variable ``GNNSERVE_API_KEYS``, never both. Either holds one key
per line (``;`` also separates keys)::

    # scopes  token
    read       Zx3vQ9pL0aT2mK8wR4yH1cB6
    read,write 7fGk2LmP9qRs4TuVw1XyZ0aB

Scopes: ``write`` allows ``POST /v1/graph/updates``; ``admin`` the model repository
(``/v2/repository/...``: index, load, unload); ``read`` every other endpoint (predict, OIP
infer and model metadata, neighbours, ``/metrics``). Open without a token: the
probes ``/v2/health/live`` and ``/v2/health/ready`` and the API description (``/docs``,
``/redoc``, ``/openapi.json``). Tokens are 16+ characters of ``A-Z a-z 0-9 - . _ ~ + /``
(RFC 6750); they are compared in constant time (``hmac.compare_digest`` of their SHA-256) and
never logged or echoed.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
import logging
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from gnnserve.errors import GnnServeError, InvalidInputError

log = logging.getLogger(__name__)

ENV_VAR = "GNNSERVE_API_KEYS"
SCOPES = ("read", "write", "admin")
OPEN_PATHS = frozenset(
    {
        "/v2/health/live",
        "/v2/health/ready",
        "/docs",
        "/docs/oauth2-redirect",
        "/redoc",
        "/openapi.json",
    }
)
WRITE_PATHS = frozenset({"/v1/graph/updates"})  # every other path needs ``read``
ADMIN_PREFIX = "/v2/repository"  # ... but these, which need ``admin``


def scope_needed(path: str) -> str:
    """The scope an API key needs for ``path`` (not one of OPEN_PATHS)."""
    if path in WRITE_PATHS:
        return "write"
    return "admin" if path.startswith(ADMIN_PREFIX) else "read"


MIN_TOKEN_CHARS = 16
_TOKEN = re.compile(r"[A-Za-z0-9\-._~+/]+=*")  # RFC 6750 b64token
_FIELD = "api_keys"


class UnauthorizedError(GnnServeError):
    """The request carries no bearer token, or one the server does not know."""

    http_status = 401
    kind = "unauthorized"


class ForbiddenError(GnnServeError):
    """The request's token is valid but lacks the scope the endpoint needs."""

    http_status = 403
    kind = "forbidden"


@dataclass(frozen=True)
class ApiKeys:
    """The accepted tokens, held as SHA-256 digests, each with its scopes."""

    entries: tuple[tuple[bytes, frozenset[str]], ...]

    def scopes_of(self, token: str) -> frozenset[str] | None:
        """The scopes of ``token``, None when unknown; constant time in the token and key set."""
        digest = hashlib.sha256(token.encode()).digest()
        found: frozenset[str] | None = None
        for known, scopes in self.entries:  # no early exit: every key is compared
            if hmac.compare_digest(known, digest):
                found = scopes
        return found


def parse_api_keys(text: str, source: str) -> ApiKeys:
    """Keys from ``text`` (lines or ``;``-separated entries of ``<scopes> <token>``).

    InvalidInputError naming the entry (never quoting a token) for any malformed entry.
    """
    entries: dict[bytes, frozenset[str]] = {}
    for number, raw in enumerate(re.split(r"[\n;]", text), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        where = f"{source} entry {number}"
        parts = line.split()
        if len(parts) != 2:
            raise InvalidInputError(f"{where}: expected '<scopes> <token>'", _FIELD)
        scopes = frozenset(parts[0].split(","))
        if not scopes <= set(SCOPES) or "" in scopes:
            raise InvalidInputError(
                f"{where}: scopes must be {', '.join(SCOPES)} or several joined by ','", _FIELD
            )
        token = parts[1]
        if len(token) < MIN_TOKEN_CHARS or not _TOKEN.fullmatch(token):
            raise InvalidInputError(
                f"{where}: a token needs {MIN_TOKEN_CHARS}+ characters of A-Z a-z 0-9 - . _ ~ "
                "+ / (e.g. python -c 'import secrets; print(secrets.token_urlsafe(32))')",
                _FIELD,
            )
        digest = hashlib.sha256(token.encode()).digest()
        if digest in entries:
            raise InvalidInputError(f"{where}: the same token is listed twice", _FIELD)
        entries[digest] = scopes
    if not entries:
        raise InvalidInputError(f"{source} holds no keys", _FIELD)
    return ApiKeys(tuple(entries.items()))


def load_api_keys(path: str, environ: Mapping[str, str] = os.environ) -> ApiKeys | None:
    """The keys of file ``path`` or of ``$GNNSERVE_API_KEYS``; None when neither is set."""
    env = environ.get(ENV_VAR, "")
    if path and env.strip():
        raise InvalidInputError(f"give --api-keys or ${ENV_VAR}, not both", _FIELD)
    if env.strip():
        return parse_api_keys(env, f"${ENV_VAR}")
    if not path:
        return None
    try:
        text = Path(path).read_text()
        mode = Path(path).stat().st_mode
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidInputError(f"cannot read the --api-keys file {path}: {exc}", _FIELD) from None
    if mode & 0o077:
        log.warning("the API keys file %s is readable by other users: chmod 600 it", path)
    return parse_api_keys(text, f"--api-keys file {path}")


def is_loopback(host: str) -> bool:
    """Whether binding ``host`` serves this machine only (127.0.0.0/8, ::1, localhost)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to any interface


def check_exposure(host: str, keys: ApiKeys | None, insecure: bool) -> None:
    """Refuse (InvalidInputError) to serve a non-loopback ``host`` without keys or --insecure."""
    if keys is not None or is_loopback(host):
        return
    if not insecure:
        raise InvalidInputError(
            f"refusing to serve {host} without API keys: anyone who can reach it could send "
            f"graph updates. Give --api-keys FILE (or ${ENV_VAR}), bind 127.0.0.1, or pass "
            "--insecure to serve it unauthenticated",
            "server.host",
        )
    log.warning("serving %s WITHOUT authentication (--insecure)", host)


def _bearer(header: str | None) -> str | None:
    if header is None:
        return None
    scheme, _, token = header.strip().partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


class RequireApiKey:
    """ASGI middleware: 401 without a known bearer token, 403 without the path's scope (JSON)."""

    def __init__(
        self, app: ASGIApp, keys: ApiKeys, on_reject: Callable[[str], None] | None = None
    ) -> None:
        self.app = app
        self.keys = keys
        self.on_reject = on_reject

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        need = scope_needed(scope["path"])
        token = _bearer(Headers(scope=scope).get("authorization"))
        scopes = None if token is None else self.keys.scopes_of(token)
        if token is None:
            error: GnnServeError = UnauthorizedError(
                "this server needs an API key: send the header Authorization: Bearer <token>",
                "Authorization",
            )
            challenge = 'Bearer realm="gnnserve"'
        elif scopes is None:
            error = UnauthorizedError("unknown API key", "Authorization")
            challenge = 'Bearer realm="gnnserve", error="invalid_token"'
        elif need not in scopes:
            error = ForbiddenError(
                f"this API key lacks the '{need}' scope this endpoint needs",
                "Authorization",
            )
            challenge = f'Bearer realm="gnnserve", error="insufficient_scope", scope="{need}"'
        else:
            await self.app(scope, receive, send)
            return
        if self.on_reject is not None:
            self.on_reject(error.kind)
        await _send_error(send, error, challenge)


async def _send_error(send: Send, error: GnnServeError, challenge: str) -> None:
    body = json.dumps(error.to_json()).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"www-authenticate", challenge.encode()),
    ]
    await send({"type": "http.response.start", "status": error.http_status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
