"""Edge update bodies read straight from their JSON bytes into columns, without the GIL.

The common write of a streaming graph is a batch of edge operations:
``{"ops": [{"op": "add_edge", "src": 1, "dst": 2}, ...]}``. Parsing it with a JSON library
builds a Python dict per operation and then reads them back, all under the GIL. ``scan_edges``
reads such a body in one numba pass that holds no GIL and returns the batch's columns
(``dynamic.columns``); anything else -- another operation, features, an extra key, a key twice,
a string escape, a number that is not a plain integer of at most 18 digits, any syntax error --
makes it return None, and the caller parses the body as JSON the usual way (which also names
every problem). Ids are not checked against the graph here (``check_columns`` does).
"""

from __future__ import annotations

import numba
import numpy as np

from gnnserve.dynamic.columns import ADD_EDGE, DELETE_EDGE, ColumnBatch


def _bytes(text: str) -> np.ndarray:
    return np.frombuffer(text.encode(), np.uint8).copy()


_OPS_KEY = _bytes('"ops"')
_ADD = _bytes('"add_edge"')
_DELETE = _bytes('"delete_edge"')
_OP, _SRC, _DST = _bytes('"op"'), _bytes('"src"'), _bytes('"dst"')
_MAX_DIGITS = 18  # always within int64


@numba.njit(inline="always")
def _skip(buf, i):  # type: ignore[no-untyped-def]
    """The first index at or after i that is not JSON whitespace."""
    while i < buf.shape[0] and (buf[i] == 32 or buf[i] == 9 or buf[i] == 10 or buf[i] == 13):
        i += 1
    return i


@numba.njit(inline="always")
def _match(buf, i, lit):  # type: ignore[no-untyped-def]
    """Whether ``lit`` starts at i."""
    if i + lit.shape[0] > buf.shape[0]:
        return False
    for j in range(lit.shape[0]):  # noqa: SIM110 (a loop numba compiles)
        if buf[i + j] != lit[j]:
            return False
    return True


@numba.njit(inline="always")
def _integer(buf, i):  # type: ignore[no-untyped-def]
    """(value, index after it) of a plain JSON integer at i; index -1 when there is none."""
    negative = i < buf.shape[0] and buf[i] == 45  # '-'
    i += negative
    start, value = i, 0
    while i < buf.shape[0] and 48 <= buf[i] <= 57 and i - start < _MAX_DIGITS + 1:
        value = value * 10 + (buf[i] - 48)
        i += 1
    digits = i - start
    if digits == 0 or digits > _MAX_DIGITS or (digits > 1 and buf[start] == 48):
        return 0, -1
    return (-value if negative else value), i  # a float's "." or "e" after it: the caller refuses


@numba.njit(nogil=True, cache=True)
def _scan(buf, op, src, dst):  # type: ignore[no-untyped-def]
    """Fill op/src/dst from an edge-only update body; the operation count, or -1 when the
    body is not one (see the module docstring)."""
    i = _skip(buf, 0)
    if i >= buf.shape[0] or buf[i] != 123 or not _match(buf, _skip(buf, i + 1), _OPS_KEY):
        return -1
    i = _skip(buf, _skip(buf, i + 1) + _OPS_KEY.shape[0])
    if i >= buf.shape[0] or buf[i] != 58:  # ':'
        return -1
    i = _skip(buf, i + 1)
    if i >= buf.shape[0] or buf[i] != 91:  # '['
        return -1
    k = 0
    while True:
        i = _skip(buf, i + 1)
        if i >= buf.shape[0] or buf[i] != 123 or k == op.shape[0]:  # '{' of the next operation
            return -1
        seen = 0  # bits: op, src, dst
        while True:
            i = _skip(buf, i + 1)
            if _match(buf, i, _OP) and not seen & 1:
                i, seen = _skip(buf, i + _OP.shape[0]), seen | 1
                if i >= buf.shape[0] or buf[i] != 58:
                    return -1
                i = _skip(buf, i + 1)
                if _match(buf, i, _ADD):
                    op[k], i = ADD_EDGE, i + _ADD.shape[0]
                elif _match(buf, i, _DELETE):
                    op[k], i = DELETE_EDGE, i + _DELETE.shape[0]
                else:
                    return -1
            elif (_match(buf, i, _SRC) and not seen & 2) or (_match(buf, i, _DST) and not seen & 4):
                is_src = _match(buf, i, _SRC)
                i = _skip(buf, i + _SRC.shape[0])
                if i >= buf.shape[0] or buf[i] != 58:
                    return -1
                value, i = _integer(buf, _skip(buf, i + 1))
                if i < 0:
                    return -1
                if is_src:
                    src[k], seen = value, seen | 2
                else:
                    dst[k], seen = value, seen | 4
            else:
                return -1
            i = _skip(buf, i)
            if i < buf.shape[0] and buf[i] == 44:  # ',': another key
                continue
            if i < buf.shape[0] and buf[i] == 125 and seen == 7:  # '}' after all three
                break
            return -1
        k += 1
        i = _skip(buf, i + 1)
        if i < buf.shape[0] and buf[i] == 44:  # ',': another operation
            continue
        if i < buf.shape[0] and buf[i] == 93:  # ']'
            break
        return -1
    i = _skip(buf, i + 1)
    if i >= buf.shape[0] or buf[i] != 125:  # '}'
        return -1
    return k if _skip(buf, i + 1) == buf.shape[0] else -1


def scan_edges(body: bytes, dim: int) -> ColumnBatch | None:
    """The columns of an edge-only update body (feature width ``dim`` for the empty features),
    or None when the body is anything else (module docstring)."""
    buf = np.frombuffer(body, np.uint8)
    most = body.count(b"{")  # at least the operations + 1
    op = np.empty(most, np.int8)
    src, dst = np.empty(most, np.int64), np.empty(most, np.int64)
    k = _scan(buf, op, src, dst)
    if k <= 0:
        return None
    node = np.full(k, -1, np.int64)
    return ColumnBatch(op[:k], src[:k], dst[:k], node, np.empty((0, dim), np.float32))
