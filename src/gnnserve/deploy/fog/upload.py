"""Sensor data collection over real TCP (Fograph §III-D): device groups upload each round's
readings to their fog node, packed by the communication optimizer, unpacked on the fog's
receiver thread as chunks arrive (pipelined with the rest of the upload).

A device group is a process (``python -m gnnserve.deploy.fog.upload``; in a testbed link's
network namespace) holding the sensors of one fog. It reads command lines on stdin:
``bits <path of an .npy>`` installs new per-row widths (after a re-placement; answers
``{"bits": rows}``); per round, ``<round> <path of an .npy of its rows' readings>`` splits the
rows into chunks, packs each (with the per-row widths: DAQ + LZ4 for binary readings, the
column codec for continuous ones; or raw float32), waits the
link's sender delay once, sends them, and answers one JSON line on stdout (bytes sent, pack and
send ms).

Wire format per chunk: header ``<4sQIIIQIIBQ>`` (magic ``GFU2``, round, device group, chunk
index, chunk count, first row, rows, feature width, codec 0 raw / 1 DAQ / 2 column, payload
bytes), then the payload. Once a round's chunks from one group have all arrived, the receiver
(:mod:`.receiver`) answers one JSON line: ``{"ok": true, ...}``, or ``{"ok": false, "error":
...}`` for an upload it refused (another round, another group's rows) and then closes.
"""

from __future__ import annotations

import argparse
import json
import socket
import struct
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from gnnserve.errors import GnnServeError, InvalidInputError
from gnnserve.features.codecs import pack, unpack
from gnnserve.features.column_codec import pack_columns, unpack_columns

HEADER = struct.Struct("<4sQIIIQIIBQ")
MAGIC = b"GFU2"
MAX_ROUND = (1 << 63) - 1  # rounds are unsigned 64-bit on the wire; kept to int64
RAW, DAQ, COLUMN = 0, 1, 2
CODEC_IDS = {"daq": DAQ, "column": COLUMN}  # the quantizing codecs, by name
PACKERS: dict[int, Callable[[np.ndarray, np.ndarray], bytes]] = {DAQ: pack, COLUMN: pack_columns}
UNPACKERS: dict[int, Callable[[bytes], np.ndarray]] = {DAQ: unpack, COLUMN: unpack_columns}
MAX_PAYLOAD = 1 << 31
ACK_LIMIT = 4096  # bytes of a receiver's answer line


def codec_id(name: str) -> int:
    """The wire id of a quantizing codec (``daq`` | ``column``); InvalidInputError otherwise."""
    if name not in CODEC_IDS:
        raise InvalidInputError(f"codec must be one of {sorted(CODEC_IDS)}, got {name!r}", "codec")
    return CODEC_IDS[name]


def encode_chunk(
    round_id: int,
    index: int,
    count: int,
    start: int,
    values: np.ndarray,
    bits: np.ndarray | None,
    codec: str = "daq",
    group: int = 0,
) -> bytes:
    """One chunk of device group ``group`` on the wire: rows ``values`` (float32 [n, F])
    starting at local row ``start``, packed by ``codec`` at the per-row widths ``bits`` (None:
    raw float32)."""
    values = np.ascontiguousarray(values, np.float32)
    codec_no = RAW if bits is None else codec_id(codec)
    payload = values.tobytes() if bits is None else PACKERS[codec_no](values, bits)
    n, dim = values.shape
    head = HEADER.pack(MAGIC, round_id, group, index, count, start, n, dim, codec_no, len(payload))
    return head + payload


def encode_round(
    round_id: int,
    values: np.ndarray,
    bits: np.ndarray | None,
    chunks: int,
    offset: int = 0,
    codec: str = "daq",
    group: int = 0,
) -> list[bytes]:
    """Device group ``group``'s rows of a round (float32 [rows, F], local rows from
    ``offset``) as ``chunks`` chunks."""
    bounds = np.linspace(0, values.shape[0], max(1, chunks) + 1).astype(int)
    return [
        encode_chunk(
            round_id, i, len(bounds) - 1, offset + int(lo), values[lo:hi],
            None if bits is None else bits[lo:hi], codec, group,
        )
        for i, (lo, hi) in enumerate(zip(bounds[:-1], bounds[1:], strict=True))
    ]  # fmt: skip


class UploadRefusedError(InvalidInputError):
    """The fog's receiver refused an upload (another round than it takes, another group's
    rows, a malformed chunk); its reason is the message."""


def read_ack(conn: socket.socket, peer: str) -> dict[str, Any]:
    """The receiver's answer to the upload just sent on ``conn`` (one JSON line). Raises
    :class:`UploadRefusedError` with its reason for a refused upload, and GnnServeError when
    ``peer`` closes or answers something that is not a fog receiver's line."""
    line = b""
    while not line.endswith(b"\n") and len(line) < ACK_LIMIT:
        try:
            part = conn.recv(ACK_LIMIT - len(line))
        except TimeoutError as exc:
            raise GnnServeError(f"{peer} did not acknowledge the upload in time") from exc
        if not part:
            break
        line += part
    try:
        ack = json.loads(line)
    except ValueError:
        ack = None
    if not isinstance(ack, dict) or not isinstance(ack.get("ok"), bool):
        raise GnnServeError(
            f"{peer} did not acknowledge the upload: not a gnnserve fog receiver, or it closed "
            "the connection"
        )
    if not ack["ok"]:
        raise UploadRefusedError(f"{peer} refused the upload: {ack.get('error')}", "upload")
    return ack


def device_main(argv: list[str] | None = None) -> int:
    """The device-group process (see the module doc)."""
    p = argparse.ArgumentParser(description="gnnserve fog device group (uploads readings)")
    p.add_argument("--connect", required=True, help="host:port of the fog's receiver")
    p.add_argument("--bits", default=None, help=".npy of per-row widths (absent: raw)")
    p.add_argument("--codec", default="daq", choices=sorted(CODEC_IDS), help="for --bits")
    p.add_argument("--chunks", type=int, default=4)
    p.add_argument("--delay-ms", type=float, default=0.0, help="one-way delay to add per round")
    p.add_argument("--offset", type=int, default=0, help="fog row of this group's first row")
    p.add_argument("--group", type=int, default=0, help="this device group's number")
    args = p.parse_args(argv)
    host, port = args.connect.rsplit(":", 1)
    bits = None if args.bits is None else np.load(args.bits)
    conn = socket.create_connection((host, int(port)))
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    for line in sys.stdin:
        round_text, path = line.split(maxsplit=1)
        if round_text == "bits":  # a new placement: the rows (and their widths) changed
            bits = np.load(path.strip())
            print(json.dumps({"bits": int(bits.size)}), flush=True)
            continue
        values = np.load(path.strip())
        t0 = time.perf_counter()
        chunks = encode_round(
            int(round_text), values, bits, args.chunks, args.offset, args.codec, args.group
        )
        t1 = time.perf_counter()
        time.sleep(args.delay_ms / 1e3)
        for chunk in chunks:
            conn.sendall(chunk)
        t2 = time.perf_counter()
        sent = sum(len(c) for c in chunks)
        reply = {"round": int(round_text), "bytes": sent, "pack_ms": (t1 - t0) * 1e3}
        try:
            read_ack(conn, args.connect)
        except GnnServeError as exc:  # the receiver closed the connection: nothing more to send
            print(json.dumps(reply | {"error": str(exc)}), flush=True)
            return 2
        print(json.dumps(reply | {"send_ms": (t2 - t1) * 1e3}), flush=True)
    conn.close()
    return 0


if __name__ == "__main__":
    sys.exit(device_main())
