"""The size of an Arrow IPC stream once decoded, read from its metadata alone: equal to the
buffers pyarrow decodes, for plain, zstd and LZ4 streams with dictionary columns; a stream that
expands beyond the limit is refused before decoding, however small it is on the wire."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from gnnserve.dynamic.bulk import DECODED_ROW_BYTES, read_stream
from gnnserve.dynamic.ipc_size import stream_size
from gnnserve.errors import InvalidInputError, PayloadTooLargeError


def _stream(table: pa.Table, compression: str | None, chunk: int | None = None) -> bytes:
    sink = pa.BufferOutputStream()
    options = pa.ipc.IpcWriteOptions(compression=compression)
    with pa.ipc.new_stream(sink, table.schema, options=options) as writer:
        writer.write_table(table, max_chunksize=chunk)
    return bytes(sink.getvalue())


def _updates(rows: int) -> pa.Table:
    rng = np.random.default_rng(0)
    ops = pa.array(rng.choice(["add_edge", "delete_edge"], rows)).dictionary_encode()
    features = pa.FixedSizeListArray.from_arrays(pa.array(rng.random(rows * 4, np.float32)), 4)
    return pa.table(
        {"op": ops, "src": rng.integers(0, 99, rows), "dst": rng.integers(0, 99, rows),
         "features": features}
    )  # fmt: skip


def _decoded(data: bytes) -> tuple[int, int]:
    """(rows, bytes of every decoded buffer, dictionaries included): the reference."""
    rows = total = 0
    for i, batch in enumerate(pa.ipc.open_stream(data)):
        rows += batch.num_rows
        for column in batch.columns:
            arrays = [column]
            if pa.types.is_dictionary(column.type) and i == 0:  # sent once, before batch 0
                arrays.append(column.dictionary)
            for array in arrays:
                total += sum(b.size for b in _buffers(array) if b is not None)
    return rows, total


def _buffers(array: pa.Array) -> list[pa.Buffer | None]:
    if pa.types.is_dictionary(array.type):
        return array.indices.buffers()
    return array.buffers()


@pytest.mark.parametrize("compression", [None, "zstd", "lz4"])
def test_the_size_read_from_metadata_is_what_pyarrow_decodes(compression: str | None) -> None:
    data = _stream(_updates(10_000), compression, chunk=3_000)
    size = stream_size(pa, data)
    assert (size.rows, size.decoded_bytes) == _decoded(data)
    if compression is not None:
        assert len(data) < size.decoded_bytes


def test_a_small_compressed_stream_that_expands_past_the_limit_is_refused_undecoded() -> None:
    rows = 1_000_000  # 16 MB of int64 ids once decoded, ~20 KB of zstd
    zeros = pa.array(np.zeros(rows, np.int64))
    table = pa.table({"op": pa.array(np.zeros(rows, np.int8)), "src": zeros, "dst": zeros})
    data = _stream(table, "zstd")
    size = stream_size(pa, data)
    assert len(data) < 100_000 and size.rows == rows
    assert read_stream(data, max_bytes=size.rows * DECODED_ROW_BYTES).op.size == rows
    with pytest.raises(PayloadTooLargeError, match="expands to 1,000,000 rows"):
        read_stream(data, max_bytes=size.decoded_bytes - 1)
    nulls = pa.table({"op": pa.nulls(rows)})  # a null-typed column has no buffers: rows bound it
    assert stream_size(pa, _stream(nulls, None)).decoded_bytes < 1000
    with pytest.raises(PayloadTooLargeError, match="1,000,000 rows"):
        read_stream(_stream(nulls, None), max_bytes=rows * DECODED_ROW_BYTES - 1)


def test_malformed_metadata_is_a_400_not_a_crash() -> None:
    data = bytearray(_stream(_updates(100), "zstd"))
    data[200:260] = b"\xff" * 60  # inside the first batch's flatbuffer
    with pytest.raises(InvalidInputError, match="not an Arrow IPC stream"):
        stream_size(pa, bytes(data))
