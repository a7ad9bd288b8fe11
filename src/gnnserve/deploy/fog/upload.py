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

Wire format per chunk: header ``<4sQIIQIIBQ>`` (magic ``GFU1``, round, chunk index, chunk count,
first row, rows, feature width, codec 0 raw / 1 DAQ / 2 column, payload bytes), then the
payload.
"""

from __future__ import annotations

import argparse
import json
import socket
import struct
import sys
import threading
import time
from collections.abc import Callable

import numpy as np

from gnnserve.errors import InvalidInputError
from gnnserve.features.codecs import pack, unpack
from gnnserve.features.column_codec import pack_columns, unpack_columns

HEADER = struct.Struct("<4sQIIQIIBQ")
MAGIC = b"GFU1"
RAW, DAQ, COLUMN = 0, 1, 2
CODEC_IDS = {"daq": DAQ, "column": COLUMN}  # the quantizing codecs, by name
PACKERS: dict[int, Callable[[np.ndarray, np.ndarray], bytes]] = {DAQ: pack, COLUMN: pack_columns}
UNPACKERS: dict[int, Callable[[bytes], np.ndarray]] = {DAQ: unpack, COLUMN: unpack_columns}
MAX_PAYLOAD = 1 << 31


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
) -> bytes:
    """One chunk on the wire: rows ``values`` (float32 [n, F]) starting at local row ``start``,
    packed by ``codec`` at the per-row widths ``bits`` (None: raw float32)."""
    values = np.ascontiguousarray(values, np.float32)
    codec_no = RAW if bits is None else codec_id(codec)
    payload = values.tobytes() if bits is None else PACKERS[codec_no](values, bits)
    n, dim = values.shape
    head = HEADER.pack(MAGIC, round_id, index, count, start, n, dim, codec_no, len(payload))
    return head + payload


def encode_round(
    round_id: int,
    values: np.ndarray,
    bits: np.ndarray | None,
    chunks: int,
    offset: int = 0,
    codec: str = "daq",
) -> list[bytes]:
    """A round's rows (float32 [rows, F], local rows from ``offset``) as ``chunks`` chunks."""
    bounds = np.linspace(0, values.shape[0], max(1, chunks) + 1).astype(int)
    return [
        encode_chunk(
            round_id, i, len(bounds) - 1, offset + int(lo), values[lo:hi],
            None if bits is None else bits[lo:hi], codec,
        )
        for i, (lo, hi) in enumerate(zip(bounds[:-1], bounds[1:], strict=True))
    ]  # fmt: skip


def _read_exact(conn: socket.socket, size: int) -> bytes | None:
    buf = bytearray()
    while len(buf) < size:
        part = conn.recv(min(size - len(buf), 1 << 20))
        if not part:
            return None if not buf else bytes(buf)
        buf += part
    return bytes(buf)


def read_chunk(conn: socket.socket) -> tuple[int, int, int, int, np.ndarray] | None:
    """(round, chunk, chunks, first row, float32 rows) of the next chunk; None at a clean end.
    A torn or malformed chunk raises InvalidInputError (nothing of it is applied)."""
    head = _read_exact(conn, HEADER.size)
    if head is None:
        return None
    if len(head) < HEADER.size:
        raise InvalidInputError("upload ended inside a chunk header", "upload")
    magic, rnd, index, count, start, n, dim, codec, size = HEADER.unpack(head)
    if magic != MAGIC or codec not in (RAW, *UNPACKERS) or size > MAX_PAYLOAD or index >= count:
        raise InvalidInputError("not a fog upload chunk (bad magic, codec or sizes)", "upload")
    payload = _read_exact(conn, size) if size else b""
    if payload is None or len(payload) < size:
        raise InvalidInputError(f"upload ended inside chunk {index} of round {rnd}", "upload")
    if codec == RAW:
        if size != n * dim * 4:
            raise InvalidInputError("raw chunk size does not match its rows", "upload")
        values = np.frombuffer(payload, np.float32).reshape(n, dim)
    else:
        values = UNPACKERS[codec](payload)
        if values.shape != (n, dim):
            raise InvalidInputError("packed chunk shape does not match its header", "upload")
    return rnd, index, count, start, values


class Receiver:
    """Accepts device-group connections on ``host`` and applies every chunk through
    ``apply(start_row, values)`` on its own threads; :meth:`wait` blocks until a round's chunks
    from ``groups`` connections have all arrived."""

    def __init__(
        self,
        host: str,
        apply: Callable[[int, np.ndarray], None],
        groups: int = 1,
        port: int = 0,
    ) -> None:
        self.apply, self.groups = apply, groups
        self._server = socket.create_server((host, port))
        self.port = int(self._server.getsockname()[1])
        self._done: dict[int, int] = {}  # round -> completed group uploads
        self._cond = threading.Condition()
        self.errors: list[str] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._server.accept()
            except OSError:
                return  # closed
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        seen: dict[int, int] = {}
        with conn:
            while True:
                try:
                    chunk = read_chunk(conn)
                except (InvalidInputError, OSError) as exc:
                    with self._cond:
                        self.errors.append(str(exc))
                        self._cond.notify_all()
                    return
                if chunk is None:
                    return
                rnd, _, count, start, values = chunk
                self.apply(start, values)
                with self._cond:
                    seen[rnd] = seen.get(rnd, 0) + 1
                    if seen[rnd] == count:
                        self._done[rnd] = self._done.get(rnd, 0) + 1
                        self._cond.notify_all()

    def arrived(self, round_id: int, timeout_s: float) -> bool:
        """Whether round ``round_id`` has arrived from every group, waiting up to ``timeout_s``
        for it; the round stays pending for :meth:`wait` (InvalidInputError on a bad upload)."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while self._done.get(round_id, 0) < self.groups:
                if self.errors:
                    raise InvalidInputError(f"bad upload: {self.errors[-1]}", "upload")
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
            return True

    def wait(self, round_id: int, timeout_s: float = 120.0) -> None:
        """Block until round ``round_id`` arrived from every group, and consume it
        (InvalidInputError on a bad upload, TimeoutError after ``timeout_s``)."""
        if not self.arrived(round_id, timeout_s):
            raise TimeoutError(f"round {round_id} not uploaded within {timeout_s} s")
        with self._cond:
            self._done.pop(round_id)

    def close(self) -> None:
        """Stop accepting."""
        self._server.close()


def device_main(argv: list[str] | None = None) -> int:
    """The device-group process (see the module doc)."""
    p = argparse.ArgumentParser(description="gnnserve fog device group (uploads readings)")
    p.add_argument("--connect", required=True, help="host:port of the fog's receiver")
    p.add_argument("--bits", default=None, help=".npy of per-row widths (absent: raw)")
    p.add_argument("--codec", default="daq", choices=sorted(CODEC_IDS), help="for --bits")
    p.add_argument("--chunks", type=int, default=4)
    p.add_argument("--delay-ms", type=float, default=0.0, help="one-way delay to add per round")
    p.add_argument("--offset", type=int, default=0, help="fog row of this group's first row")
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
        chunks = encode_round(int(round_text), values, bits, args.chunks, args.offset, args.codec)
        t1 = time.perf_counter()
        time.sleep(args.delay_ms / 1e3)
        for chunk in chunks:
            conn.sendall(chunk)
        t2 = time.perf_counter()
        sent = sum(len(c) for c in chunks)
        reply = {"round": int(round_text), "bytes": sent, "pack_ms": (t1 - t0) * 1e3}
        print(json.dumps(reply | {"send_ms": (t2 - t1) * 1e3}), flush=True)
    conn.close()
    return 0


if __name__ == "__main__":
    sys.exit(device_main())
