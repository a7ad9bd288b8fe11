"""Bulk update formats: Apache Arrow IPC streams and CSV, to and from ``ColumnBatch``.

An Arrow update batch has one row per operation, in order, with the columns

- ``op``: string (or dictionary of strings) ``add_edge | delete_edge | add_node |
  upsert_features``, or int8 codes 0-3 (``columns.OP_CODES``);
- ``src``, ``dst``: integer endpoints of the edge operations (null elsewhere);
- ``node`` (optional): integer node of ``upsert_features`` rows;
- ``features`` (optional when no row needs it): fixed-size list of F floats, for ``add_node``
  and ``upsert_features`` rows.

A CSV file has a header row naming ``op, src, dst`` and optionally ``node`` and feature columns
``f0 .. f{F-1}``; empty fields are nulls. pyarrow parses both (``pip install
'gnnserve[ingest]'``); the columns are checked as arrays afterwards (``columns.check_columns``).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from gnnserve.dynamic.columns import ADD_NODE, MISSING, OPS, ColumnBatch
from gnnserve.dynamic.ipc_size import StreamSize, stream_size
from gnnserve.errors import InvalidInputError, PayloadTooLargeError

if TYPE_CHECKING:
    import pyarrow as pa

ARROW_STREAM = "application/vnd.apache.arrow.stream"  # the IPC stream media type
# bytes a row takes in the columns the server decodes (int8 op; int64 src, dst, node): rows
# are bounded so that those columns fit in the body limit, however few bytes the stream used
DECODED_ROW_BYTES = 25


def _pyarrow() -> Any:
    try:
        import pyarrow as pa
    except ImportError:
        raise InvalidInputError(
            "bulk updates need pyarrow: pip install 'gnnserve[ingest]'", "content-type"
        ) from None
    return pa


def read_stream(data: bytes, max_bytes: int | None = None) -> ColumnBatch:
    """The one update batch an Arrow IPC stream holds (its record batches, concatenated).
    With ``max_bytes``, a stream that decodes to more bytes than that, or to more rows than
    ``max_bytes // DECODED_ROW_BYTES``, is refused (PayloadTooLargeError) before any of it is
    decoded: compression does not stretch the body limit."""
    pa = _pyarrow()
    if max_bytes is not None:
        _check_expansion(stream_size(pa, data), max_bytes)
    try:
        table = pa.ipc.open_stream(data).read_all()
    except (pa.ArrowException, OSError) as exc:
        raise InvalidInputError(f"the body is not an Arrow IPC stream: {exc}", "body") from None
    try:
        return from_table(table)
    except pa.ArrowException as exc:
        raise InvalidInputError(f"unreadable update columns: {exc}", "body") from None


def _check_expansion(size: StreamSize, max_bytes: int) -> None:
    max_rows = max_bytes // DECODED_ROW_BYTES
    if size.decoded_bytes > max_bytes or size.rows > max_rows:
        raise PayloadTooLargeError(
            f"the Arrow stream expands to {size.rows:,} rows and {size.decoded_bytes:,} bytes "
            f"once decoded; the limit is {max_rows:,} rows and {max_bytes:,} bytes "
            "(server.max_body_bytes): send smaller batches",
            "body",
        )


def from_table(table: pa.Table) -> ColumnBatch:
    """Columns of an Arrow table of update rows (module docstring); InvalidInputError naming
    a missing or mistyped column."""
    pa = _pyarrow()
    table = table.combine_chunks()
    names = set(table.column_names)
    unknown = names - {"op", "src", "dst", "node", "features"}
    if unknown or "op" not in names:
        what = f"unknown columns {sorted(unknown)}" if unknown else "no op column"
        raise InvalidInputError(f"{what}: expected op, src, dst, node, features", "columns")
    k = table.num_rows
    op = _op_codes(pa, table.column("op"))
    src, dst, node = (_ids(pa, table, name, k) for name in ("src", "dst", "node"))
    features, missing = _features(pa, table, op)
    return ColumnBatch(op, src, dst, node, features, missing)


def _op_codes(pa: Any, column: Any) -> np.ndarray:
    import pyarrow.compute as pc

    kind = column.type
    if pa.types.is_dictionary(kind):
        column, kind = column.cast(kind.value_type), kind.value_type
    if pa.types.is_integer(kind):
        codes = pc.fill_null(column.cast(pa.int64()), -1).to_numpy()
        return np.clip(codes, -1, 127).astype(np.int8)  # out of range: reported as a bad op
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        index = pc.index_in(column, value_set=pa.array(OPS))
        return pc.fill_null(index, -1).to_numpy().astype(np.int8)
    raise InvalidInputError(f"op must be a string or int8 column, got {kind}", "op")


def _ids(pa: Any, table: Any, name: str, k: int) -> np.ndarray:
    import pyarrow.compute as pc

    if name not in table.column_names or pa.types.is_null(table.column(name).type):
        return np.full(k, MISSING, dtype=np.int64)  # absent, or every row empty
    column = table.column(name)
    if not pa.types.is_integer(column.type):
        raise InvalidInputError(f"{name} must be an integer column, got {column.type}", name)
    return np.asarray(pc.fill_null(column.cast(pa.int64()), MISSING).to_numpy(), dtype=np.int64)


def _features(pa: Any, table: Any, op: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
    """(float32 rows of the add_node / upsert rows, which of them were null)."""
    rows = np.flatnonzero(op >= ADD_NODE)
    if "features" not in table.column_names:
        return np.zeros((rows.size, 0), np.float32), np.ones(rows.size, dtype=np.bool_)
    column = table.column("features").combine_chunks()
    kind = column.type
    if not pa.types.is_fixed_size_list(kind) or not pa.types.is_floating(kind.value_type):
        raise InvalidInputError(
            f"features must be a fixed-size list of floats, got {kind}", "features"
        )
    width = kind.list_size
    slots = column.values.slice(column.offset * width, len(column) * width)  # null rows' too
    values = slots.to_numpy(zero_copy_only=False).reshape(len(column), width)[rows]
    with warnings.catch_warnings(), np.errstate(over="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)
        features = values.astype(np.float32)  # beyond float32: inf, reported as not finite
    missing = column.is_null().to_numpy(zero_copy_only=False)[rows]
    features[missing] = 0.0
    return features, missing if missing.any() else None


def to_stream(batch: pa.Table) -> bytes:
    """An Arrow table as IPC stream bytes (what ``gnnserve ingest`` posts)."""
    pa = _pyarrow()
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_table(batch)
    return bytes(sink.getvalue())


def read_file(path: str | Path, batch_rows: int, skip_rows: int = 0) -> Iterator[pa.Table]:
    """Update rows of an Arrow IPC (stream or file) or CSV file after the first ``skip_rows``,
    ``batch_rows`` at a time. Arrow is recognised by its first bytes, CSV by the ``.csv``
    extension; anything else, an unreadable file or a CSV column that cannot hold what its
    rows need is InvalidInputError naming the file, and the row where it can."""
    pa = _pyarrow()
    with open(path, "rb") as fh:
        head = fh.read(6)
    if head == b"ARROW1" or head[:4] == b"\xff\xff\xff\xff":
        table = _read_arrow(pa, path, file_format=head == b"ARROW1")
    elif str(path).endswith(".csv"):
        table = _read_csv(pa, path)
    else:
        raise InvalidInputError(
            f"{path}: neither an Arrow IPC file or stream (by its first bytes) nor a .csv file: "
            "name a CSV file *.csv",
            "file",
        )
    for lo in range(skip_rows, table.num_rows, batch_rows):
        yield table.slice(lo, batch_rows)


def _read_arrow(pa: Any, path: str | Path, file_format: bool) -> Any:
    try:
        if file_format:
            return pa.ipc.open_file(path).read_all()
        with pa.memory_map(str(path)) as source:
            return pa.ipc.open_stream(source).read_all()
    except (pa.ArrowException, OSError) as exc:
        raise InvalidInputError(
            f"{path} is not a complete Arrow IPC file or stream (truncated?): {exc}", "file"
        ) from None


def _read_csv(pa: Any, path: str | Path) -> Any:
    import pyarrow.compute as pc
    from pyarrow import csv

    try:
        table = csv.read_csv(path)
    except (pa.ArrowException, OSError) as exc:
        raise InvalidInputError(f"{path}: not a CSV of updates: {exc}", "file") from None
    feats = [c for c in table.column_names if c.startswith("f") and c[1:].isdigit()]
    feats.sort(key=lambda c: int(c[1:]))
    for name in ("src", "dst", "node"):
        if name in table.column_names:
            _check_csv_ids(pa, path, table.column(name), name)
            if pa.types.is_floating(table.column(name).type):  # whole numbers written 3.0
                index = table.column_names.index(name)
                table = table.set_column(index, name, table.column(name).cast(pa.int64()))
    for name in feats:
        _check_csv_numbers(pa, path, table.column(name), name)
    if not feats:
        return table
    flat = np.stack(
        [table.column(c).cast(pa.float64()).to_numpy(zero_copy_only=False) for c in feats], axis=1
    )
    null = np.isnan(flat).all(axis=1)  # rows with no feature values (edge operations)
    lists = pa.FixedSizeListArray.from_arrays(pa.array(flat.reshape(-1), pa.float64()), len(feats))
    lists = pc.if_else(pa.array(null), pa.nulls(len(null), lists.type), lists)
    return table.drop_columns(feats).append_column("features", lists)


def _csv_row(row: int) -> str:
    """A data row of a CSV file as the ingest numbers rows, with its line (the header is 1)."""
    return f"row {row} (line {row + 2})"


_INTEGER = r"^\s*[+-]?\d+\s*$"
_NUMBER = r"^\s*[+-]?((\d+\.?\d*|\.\d+)(e[+-]?\d+)?|nan|inf|infinity)\s*$"


def _first_row_not(pa: Any, column: Any, pattern: str) -> tuple[int, str]:
    """(row, text) of the first non-empty value of a string ``column`` that does not match
    ``pattern`` (case-insensitive)."""
    import pyarrow.compute as pc

    text = column.combine_chunks().cast(pa.string())
    fine = pc.match_substring_regex(text, pattern, ignore_case=True)
    fine = pc.or_(fine, pc.equal(text, ""))
    bad = np.flatnonzero(~pc.fill_null(fine, True).to_numpy(zero_copy_only=False))
    row = int(bad[0]) if bad.size else 0
    return row, str(text[row].as_py())


def _check_csv_ids(pa: Any, path: str | Path, column: Any, name: str) -> None:
    """An id column of a CSV must hold integers or nothing (null: pyarrow's type when every
    row is empty): InvalidInputError naming the first row that does not."""
    import pyarrow.compute as pc

    kind = column.type
    if pa.types.is_integer(kind) or pa.types.is_null(kind):
        return
    if pa.types.is_floating(kind):
        values = column.combine_chunks()
        whole = pc.equal(values, pc.floor(values))
        bad = np.flatnonzero(~pc.fill_null(whole, True).to_numpy(zero_copy_only=False))
        if bad.size == 0:
            return  # 3.0: a whole number written as a float (the caller casts it)
        row, text = int(bad[0]), str(values[int(bad[0])].as_py())
    else:
        row, text = _first_row_not(pa, column, _INTEGER)
    raise InvalidInputError(f"{path}: {_csv_row(row)}: {name} {text!r} is not an integer", name)


def _check_csv_numbers(pa: Any, path: str | Path, column: Any, name: str) -> None:
    """A feature column of a CSV must hold numbers or nothing: InvalidInputError naming the
    first row that does not."""
    kind = column.type
    if pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_null(kind):
        return
    row, text = _first_row_not(pa, column, _NUMBER)
    raise InvalidInputError(f"{path}: {_csv_row(row)}: {name} {text!r} is not a number", name)
