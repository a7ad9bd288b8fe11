"""One resolver for where stored things live: ``/path``, ``relative/path``, ``file:///path`` and
``s3://bucket/prefix``.

Every opener of stored data (graph and feature stores, precomputed embeddings, checkpoints,
update logs) accepts a URL or a path and resolves it here into a :class:`StoreLocation`. Local
openers take the local path (:func:`local_path`, which refuses an object-store URL with a clear
message); a published store at an ``s3://`` URL is read by the blob stores of
``gnnserve.data.blobs`` (the serverless deployment).

A string is a URL when it starts with ``<scheme>://`` or with ``file:``; anything else is a path
(so a directory named ``a:b`` is still a path). ``file:`` URLs follow RFC 8089: an absolute path,
an empty host or ``localhost``, percent-escapes decoded (``file:///data/my%20store``).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlsplit

from gnnserve.errors import InvalidInputError

SUPPORTED = ("file", "s3")  # URL schemes that resolve; plain paths are always accepted
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")  # S3 bucket naming rules
_URL = re.compile(r"^(?:[A-Za-z][A-Za-z0-9+.-]*://|file:)")

Location = str | os.PathLike[str]


@dataclass(frozen=True)
class StoreLocation:
    """Where a store lives: its scheme (``file`` for local files) and, for files, the path."""

    scheme: str  # "file" | "s3"
    path: Path  # local filesystem path (relative paths stay relative); s3: the key prefix
    bucket: str = ""  # s3: the bucket
    key: str = ""  # s3: the key prefix inside the bucket, no leading or trailing slash

    def __str__(self) -> str:
        if self.scheme == "s3":
            return f"s3://{self.bucket}/{self.key}" if self.key else f"s3://{self.bucket}"
        return str(self.path)


def resolve(location: Location | StoreLocation, field: str) -> StoreLocation:
    """Resolve a path or URL; InvalidInputError naming ``field`` for an unsupported URL."""
    if isinstance(location, StoreLocation):
        return location
    if not isinstance(location, str):
        return StoreLocation("file", Path(location))
    if not _URL.match(location):
        return StoreLocation("file", Path(location))
    parts = urlsplit(location)
    scheme = parts.scheme.lower()
    if scheme not in SUPPORTED:
        raise InvalidInputError(
            f"{field}: unsupported URL scheme {scheme + '://'!r} in {location!r}; supported: "
            f"{', '.join(s + '://' for s in SUPPORTED)} URLs and plain paths",
            field,
        )
    if scheme == "s3":
        return _s3_location(location, field)
    return StoreLocation("file", _file_path(location, field))


def _s3_location(url: str, field: str) -> StoreLocation:
    """``s3://bucket/prefix``: a valid bucket name, no query or fragment."""
    parts = urlsplit(url)
    if parts.query or parts.fragment or url.endswith(("?", "#")):
        raise InvalidInputError(f"{field}: s3 URL {url!r} has a query or fragment", field)
    if not _BUCKET.match(parts.netloc) or ".." in parts.netloc:
        raise InvalidInputError(
            f"{field}: s3 URL {url!r} needs a bucket name (3-63 of a-z 0-9 . -): "
            "s3://bucket/prefix",
            field,
        )
    key = unquote(parts.path).strip("/")
    return StoreLocation("s3", Path(key), parts.netloc, key)


def _file_path(url: str, field: str) -> Path:
    """The local path of a ``file:`` URL."""
    parts = urlsplit(url)
    if parts.netloc not in ("", "localhost"):
        raise InvalidInputError(
            f"{field}: file URL {url!r} names host {parts.netloc!r}; only local files "
            "(file:///path) are supported",
            field,
        )
    if parts.query or parts.fragment or url.endswith(("?", "#")):
        raise InvalidInputError(f"{field}: file URL {url!r} has a query or fragment", field)
    path = unquote(parts.path)
    if not path.startswith("/"):
        raise InvalidInputError(
            f"{field}: file URL {url!r} needs an absolute path (file:///abs/path)", field
        )
    return Path(path)


def local_path(location: Location | StoreLocation, field: str) -> Path:
    """The local filesystem path of a path or ``file:`` URL (see :func:`resolve`); an
    object-store URL is refused: only the remote backend reads it."""
    resolved = resolve(location, field)
    if resolved.scheme != "file":
        raise InvalidInputError(
            f"{field}: {resolved} is an object-store URL; it is served by the remote backend "
            "(`gnnserve serve --deploy faas --remote URL`), not opened as a local directory",
            field,
        )
    return resolved.path
