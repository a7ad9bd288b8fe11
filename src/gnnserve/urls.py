"""One resolver for where stored things live: ``/path``, ``relative/path`` and ``file:///path``.

Every opener of stored data (graph and feature stores, precomputed embeddings, checkpoints,
update logs) accepts a URL or a path and resolves it here into a :class:`StoreLocation`. Only
local files are supported today; a remote scheme (``s3://`` later) becomes one more entry of
:data:`SUPPORTED` here and one more backend in the existing registries, the callers unchanged.

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

SUPPORTED = ("file",)  # URL schemes that resolve; plain paths are always accepted
_URL = re.compile(r"^(?:[A-Za-z][A-Za-z0-9+.-]*://|file:)")

Location = str | os.PathLike[str]


@dataclass(frozen=True)
class StoreLocation:
    """Where a store lives: its scheme (``file`` for local files) and, for files, the path."""

    scheme: str  # "file"
    path: Path  # local filesystem path (relative paths stay relative)

    def __str__(self) -> str:
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
    return StoreLocation("file", _file_path(location, field))


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
    """The local filesystem path of a path or ``file:`` URL (see :func:`resolve`)."""
    return resolve(location, field).path
