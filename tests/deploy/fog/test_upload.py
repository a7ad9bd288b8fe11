"""Collection over real TCP: device-group processes upload chunks (DAQ + LZ4, the column
codec, or raw) to a receiver, which applies exactly the decoded rows; torn, foreign, stale and
misdirected uploads are refused, the sender told why, and nothing of them is applied."""

from __future__ import annotations

import socket
import threading

import numpy as np
import pytest

from gnnserve.deploy.fog.devices import DeviceGroup
from gnnserve.deploy.fog.gateway import send_round
from gnnserve.deploy.fog.receiver import ROUNDS_AHEAD, Receiver
from gnnserve.deploy.fog.upload import HEADER, UNPACKERS, UploadRefusedError, codec_id, encode_chunk
from gnnserve.errors import GnnServeError, InvalidInputError
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

    receiver = Receiver("127.0.0.1", apply, {0: (0, ROWS)}, width=F, strict=True)
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


def test_torn_and_foreign_uploads_fail_a_strict_round_and_apply_nothing() -> None:
    applied: list[int] = []
    receiver = Receiver(
        "127.0.0.1", lambda start, v: applied.append(start), {0: (0, 10)}, strict=True
    )
    whole = encode_chunk(1, 0, 1, 0, _readings(0)[:10], None)
    for bad, message in ((whole[:-7], "ended inside chunk"), (b"XXXX" + whole[4:], "not a fog")):
        with socket.create_connection(("127.0.0.1", receiver.port)) as conn:
            conn.sendall(bad)
        with pytest.raises(InvalidInputError, match=message):
            receiver.wait(1, timeout_s=10)
    assert applied == [] and receiver.refused == 2
    with pytest.raises(TimeoutError):
        receiver.wait(1, timeout_s=0.2)
    receiver.close()


def test_stale_misdirected_and_repeated_uploads_are_refused_and_the_round_keeps_its_readings() -> (
    None
):
    """Two groups feed one fog (rows [0, 250) and [250, 500)). Between the groups' uploads of
    round 2 come a stale round 1, group 1's rows sent as group 0's (round 3), an unknown
    group, a second round 2 from group 0, a wrong offset and a round too far ahead: each
    refused with its reason, and round 2 is applied exactly as the two groups sent it."""
    held = np.zeros((ROWS, F), np.float32)

    def apply(start: int, values: np.ndarray) -> None:
        held[start : start + values.shape[0]] = values

    half = ROWS // 2
    receiver = Receiver("127.0.0.1", apply, {0: (0, half), 1: (half, half)}, width=F)
    address = ("127.0.0.1", receiver.port)

    def upload(round_id: int, x: np.ndarray, group: int, offset: int) -> None:
        send_round(address, round_id, x, chunks=3, offset=offset, group=group, timeout_s=30)

    first, second, other = _readings(1), _readings(2), _readings(3)
    try:
        upload(1, first[:half], 0, 0)
        upload(1, first[half:], 1, half)
        receiver.wait(1, timeout_s=30)
        np.testing.assert_array_equal(held, first)
        upload(2, second[:half], 0, 0)
        refusals = [
            ((1, other[:half], 0, 0), "round 1 is stale"),
            ((3, other[half:], 0, half), "outside group 0's rows"),
            ((2, other[half:], 2, half), "group 2 does not upload to this fog"),
            ((2, other[:half], 0, 0), "already uploaded round 2"),
            ((2, other[half:], 1, half + 5), "outside group 1's rows"),
            ((2 + ROUNDS_AHEAD, other[:half], 0, 0), "too far ahead"),
        ]
        for args, reason in refusals:
            with pytest.raises(UploadRefusedError, match=reason):
                upload(*args)
        assert not receiver.arrived(2, 0.05)  # group 1 has not sent round 2 yet
        upload(3, other[:half], 0, 0)  # the next round early: held apart until its turn
        upload(2, second[half:], 1, half)
        receiver.wait(2, timeout_s=30)
        np.testing.assert_array_equal(held, second)
        assert receiver.refused == len(refusals)
        upload(3, other[half:], 1, half)
        receiver.wait(3, timeout_s=30)
        np.testing.assert_array_equal(held, other)
    finally:
        receiver.close()


def test_a_large_refused_upload_still_hears_why() -> None:
    """A stale round of 19 MB, refused at its first chunk: the receiver reads the rest before
    closing, so the sender gets the reason, not a reset connection."""
    rows = 200_000
    receiver = Receiver("127.0.0.1", lambda s, v: None, {0: (0, rows)}, width=F)
    values = np.ones((rows, F), np.float32)
    address = ("127.0.0.1", receiver.port)
    try:
        send_round(address, 1, values, chunks=8, timeout_s=30)
        receiver.wait(1, timeout_s=30)
        with pytest.raises(UploadRefusedError, match="round 1 is stale"):
            send_round(address, 1, values, chunks=8, timeout_s=30)
    finally:
        receiver.close()


def test_an_upload_to_a_peer_that_is_not_a_receiver_is_an_error() -> None:
    """A peer that takes the bytes and closes without the receiver's answer."""
    server = socket.create_server(("127.0.0.1", 0))

    def swallow() -> None:
        conn, _ = server.accept()
        with conn:
            while conn.recv(1 << 16):
                pass

    threading.Thread(target=swallow, daemon=True).start()
    with pytest.raises(GnnServeError, match="did not acknowledge"):
        send_round(server.getsockname()[:2], 1, _readings(0), timeout_s=30)
    server.close()
