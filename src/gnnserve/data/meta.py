"""One reader for gnnserve's JSON meta files that declare their format and version.

Used for a store's ``meta.json`` (``data.layout``), a checkpoint's ``config.json``
(``models.checkpoint``) and precomputed embeddings' ``meta.json`` (``embeddings.stores``). Each
caller then checks its own fields; this module checks only what every such file shares.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gnnserve.errors import StoreFormatError


def read_meta_file(
    path: Path,
    field: str,
    *,
    version: int,
    missing: str,
    format_name: str | None = None,
    kind: str = "meta file",
    default_version: int | None = None,
) -> dict[str, Any]:
    """Read ``path``, parse it as a JSON object and check its ``format`` and ``format_version``.

    Raises StoreFormatError with ``field`` and a message naming the file when the file is absent
    (the message is ``missing``), unreadable (I/O error, not UTF-8, not JSON), not a JSON object,
    not of ``format_name`` (when given; the message says it is not a ``format_name`` ``kind``),
    or of another format version than ``version``. ``default_version``: the version assumed
    when the file has no ``format_version`` (None: the key is required). Returns the object.
    """
    if not path.is_file():
        raise StoreFormatError(missing, field)
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise StoreFormatError(f"{path} is unreadable: {exc}", field) from exc
    return parse_meta_text(
        text,
        str(path),
        field,
        version=version,
        format_name=format_name,
        kind=kind,
        default_version=default_version,
    )


def parse_meta_text(
    text: str,
    where: str,
    field: str,
    *,
    version: int,
    format_name: str | None = None,
    kind: str = "meta file",
    default_version: int | None = None,
) -> dict[str, Any]:
    """The checks of :func:`read_meta_file` on the file's text (read from ``where``, a path or
    URL the messages name): for meta files that do not live on the local disk."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise StoreFormatError(f"{where} is unreadable: {exc}", field) from exc
    if not isinstance(doc, dict):
        what = f"a {format_name} {kind}" if format_name else "a JSON object"
        raise StoreFormatError(f"{where} is not {what}", field)
    if format_name is not None and doc.get("format") != format_name:
        raise StoreFormatError(f"{where} is not a {format_name} {kind}", field)
    found = doc.get("format_version", default_version)
    if isinstance(found, bool) or found != version:
        raise StoreFormatError(
            f"{where}: format version {found!r}, this gnnserve reads {version}", field
        )
    return doc
