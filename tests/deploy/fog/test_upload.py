"""Collection over real TCP: device-group processes upload chunks (DAQ + LZ4, the column
codec, or raw) to a
receiver, which applies exactly the decoded rows; torn or foreign uploads are refused with a
typed error and nothing of them is applied."""

from __future__ import annotations

import socket

import numpy as np
import pytest

from gnnserve.deploy.fog.devices import DeviceGroup
from gnnserve.deploy.fog.upload import HEADER, UNPACKERS, Receiver, codec_id, encode_chunk
from gnnserve.errors import InvalidInputError
from gnnserve.features.column_codec import column_bits
from gnnserve.features.quantize import DaqConfig, bits_per_vertex

ROWS, F = 500, 24


def _readings(seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((ROWS, F)).astype(np.float32)
    x[rng.random((ROWS, F)) < 0.8] = 0.0  # sparse, as sensor one-hots are
    return x


def _expected(
    values: np.ndarray, bits: np.ndarray | None, chunks: int, codec: str = "daq"
) -> np.ndarray:
    """What the fog must hold: each chunk decoded on its own (raw: the values)."""
    if bits is None:
        return values
    bounds = np.linspace(0, ROWS, chunks + 1).astype(int)
    out = np.empty_like(values)
    for lo, hi in zip(bounds[:-1], bounds[1:], strict=True):
        blob = encode_chunk(0, 0, 1, lo, values[lo:hi], bits[lo:hi], codec)
        out[lo:hi] = UNPACKERS[codec_id(codec)](blob[HEADER.size :])
    return out


def _widths(codec: str, degrees: np.ndarray) -> np.ndarray | None:
    if codec == "raw":
        return None
    if codec == "column":
        return column_bits(degrees, (16, 8, 8, 4))
    config = DaqConfig.for_degrees(degrees, bits=(32, 32, 16, 8))  # float32 readings: 32 is full
    return bits_per_vertex(degrees, config)


@pytest.mark.parametrize("codec", ["daq", "raw", "column"])
def test_device_groups_upload_what_the_fog_applies(codec: str) -> None:
    held = np.zeros((ROWS, F), np.float32)

    def apply(start: int, values: np.ndarray) -> None:
        held[start : start + values.shape[0]] = values

    receiver = Receiver("127.0.0.1", apply, groups=1)
    degrees = np.random.default_rng(0).zipf(1.8, ROWS)
    bits = _widths(codec, degrees)
    group = DeviceGroup("127.0.0.1", receiver.port, bits, chunks=3, codec=codec)
    try:
        for round_id in (1, 2):
            values = _readings(round_id)
            group.start_round(round_id, values)
            receiver.wait(round_id, timeout_s=60)
            report = group.finish_round()
            np.testing.assert_array_equal(held, _expected(values, bits, 3, codec))
            if codec == "column":  # 4-bit rows are not float32's: the codec really ran
                assert np.abs(held - values).max() > 1e-3
            raw_bytes = values.nbytes + 3 * HEADER.size
            bounds = np.linspace(0, ROWS, 4).astype(int)
            sent = sum(
                len(
                    encode_chunk(
                        round_id,
                        i,
                        3,
                        lo,
                        values[lo:hi],
                        None if bits is None else bits[lo:hi],
                        codec,
                    )  # fmt: skip
                )
                for i, (lo, hi) in enumerate(zip(bounds[:-1], bounds[1:], strict=True))
            )
            assert report["bytes"] == sent
            assert sent == raw_bytes if codec == "raw" else sent < 0.8 * raw_bytes
    finally:
        group.close()
        receiver.close()


def test_torn_and_foreign_uploads_are_refused_and_not_applied() -> None:
    applied: list[int] = []
    receiver = Receiver("127.0.0.1", lambda start, v: applied.append(start), groups=1)
    values = _readings(0)[:10]
    whole = encode_chunk(5, 0, 1, 0, values, None)
    for bad, message in ((whole[:-7], "ended inside chunk"), (b"XXXX" + whole[4:], "not a fog")):
        with socket.create_connection(("127.0.0.1", receiver.port)) as conn:
            conn.sendall(bad)
        with pytest.raises(InvalidInputError, match=message):
            receiver.wait(5, timeout_s=10)
        receiver.errors.clear()
    assert applied == []
    with pytest.raises(TimeoutError):
        receiver.wait(6, timeout_s=0.2)
    receiver.close()
