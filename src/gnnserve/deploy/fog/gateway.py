"""A sensor gateway: ``gnnserve fog upload`` sends one round of readings to a fog's receiver,
with the framing, DAQ + LZ4 codec and chunking of the server's own device groups (:mod:`.upload`).

A fog server started with ``gateways=True`` (``FogService``) spawns no device groups: each fog
waits for its round's uploads from gateways, and :meth:`FogService.gateway_plan` says which
fog takes which vertices (ascending ids: the rows of the readings file), at which address and
port, with which per-row DAQ widths. A round is complete at a fog when one connection has
delivered all of that round's chunks.
"""

from __future__ import annotations

import argparse
import json
import logging
import socket
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from gnnserve.deploy.fog.upload import MAX_ROUND, encode_round, read_ack
from gnnserve.errors import GnnServeError, InvalidInputError, UnavailableError

if TYPE_CHECKING:
    from gnnserve.deploy.fog.service import FogService, RoundReport

log = logging.getLogger(__name__)


def write_plan(plan: list[dict[str, Any]], directory: str | Path) -> Path:
    """Write a :meth:`FogService.gateway_plan` for the gateways: per device group ``k``,
    ``group<k>.vertices.npy`` (int64 ids, ascending: the rows its readings file must hold, in
    order) and ``group<k>.bits.npy`` (its widths), and ``plan.json`` listing each group's fog,
    receiver, offset, codec, files and the ``gnnserve fog upload`` command (``{readings}`` and
    ``{round}`` to fill in). Returns the path of ``plan.json``."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    groups = []
    for k, group in enumerate(plan):
        vertices = out / f"group{k}.vertices.npy"
        np.save(vertices, np.asarray(group["vertices"], np.int64))
        command = [
            "gnnserve",
            "fog",
            "upload",
            "--to",
            group["to"],
            "--offset",
            str(group["offset"]),
            "--group",
            str(group["group"]),
        ]
        bits = None
        if group["bits"] is not None:
            bits = out / f"group{k}.bits.npy"
            np.save(bits, np.asarray(group["bits"], np.uint8))
            command += ["--bits", str(bits), "--codec", group["codec"]]
        command += ["--readings", "{readings}", "--round", "{round}"]
        groups.append(
            {
                "group": group["group"], "fog": group["fog"], "to": group["to"],
                "offset": group["offset"],
                "codec": group["codec"] if bits else "raw", "rows": int(len(group["vertices"])),
                "vertices": str(vertices), "bits": str(bits) if bits else None,
                "command": command,
            }
        )  # fmt: skip
    path = out / "plan.json"
    about = (
        "rounds are numbered 1, 2, ... in order; each group sends its rows of every round, "
        "once; a fog refuses a round it has already run and another group's rows"
    )
    path.write_text(json.dumps({"rounds": about, "groups": groups}, indent=2))
    return path


def parse_address(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (InvalidInputError naming what is wrong)."""
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise InvalidInputError(f"--to must be HOST:PORT, got {text!r}", "to")
    return host, int(port)


def _check_upload(
    values: np.ndarray, bits: np.ndarray | None, round_id: int, chunks: int, offset: int, group: int
) -> None:
    """InvalidInputError naming the first argument of an upload that is wrong."""
    if values.ndim != 2 or values.shape[0] < 1 or not np.isfinite(values).all():
        raise InvalidInputError("readings must be a finite float32 [rows, F] array", "readings")
    if bits is not None and bits.shape != (values.shape[0],):
        raise InvalidInputError(
            f"bits must hold one width per row ({values.shape[0]}), got {bits.shape}", "bits"
        )
    if not 1 <= round_id <= MAX_ROUND:
        raise InvalidInputError(f"--round must be in [1, 2^63), got {round_id}", "round")
    if not 1 <= chunks <= values.shape[0]:
        raise InvalidInputError(
            f"--chunks must be in [1, rows = {values.shape[0]}], got {chunks}", "chunks"
        )
    if not 0 <= offset <= MAX_ROUND or not 0 <= group < 1 << 32:
        raise InvalidInputError("--offset and --group must be >= 0", "offset")


def send_round(
    address: tuple[str, int],
    round_id: int,
    readings: np.ndarray,
    bits: np.ndarray | None = None,
    chunks: int = 4,
    offset: int = 0,
    timeout_s: float = 60.0,
    codec: str = "daq",
    group: int = 0,
) -> int:
    """Upload ``readings`` (float32 [rows, F]) as device group ``group``'s round ``round_id``
    to the receiver at ``address``, packed by ``codec`` at the per-row widths ``bits`` (None:
    raw float32); returns the bytes sent once the fog has acknowledged them.
    UploadRefusedError (an InvalidInputError) with the fog's reason when it refused them;
    GnnServeError when the peer is not a fog receiver."""
    values = np.ascontiguousarray(readings, np.float32)
    _check_upload(values, bits, round_id, chunks, offset, group)
    payload = encode_round(round_id, values, bits, chunks, offset, codec, group)
    peer = f"{address[0]}:{address[1]}"
    with socket.create_connection(address, timeout=timeout_s) as conn:
        try:
            for chunk in payload:
                conn.sendall(chunk)
            conn.shutdown(socket.SHUT_WR)  # the whole upload: a peer that only reads sees its end
        except OSError:
            pass  # a receiver that refuses closes early: its answer says why
        read_ack(conn, peer)
    return sum(len(c) for c in payload)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """``gnnserve fog upload``'s flags."""
    p.add_argument("--to", required=True, help="HOST:PORT of the fog's receiver (gateway plan)")
    p.add_argument("--readings", required=True, help=".npy float32 [rows, F], ascending ids")
    p.add_argument("--round", type=int, required=True, help="round number (1, 2, ...)")
    p.add_argument("--bits", default=None, help=".npy of per-row widths (absent: raw)")
    p.add_argument("--codec", default="daq", help="daq | column: the codec of --bits")
    p.add_argument("--chunks", type=int, default=4, help="chunks per round (default 4)")
    p.add_argument("--offset", type=int, default=0, help="fog row of the first reading")
    p.add_argument("--group", type=int, default=0, help="device group number (plan.json)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Send one round; print the bytes sent. Exit 2 on bad input, 1 when the fog is
    unreachable."""
    try:
        address = parse_address(args.to)
        readings = _load_array(args.readings, "--readings")
        bits = None if args.bits is None else _load_array(args.bits, "--bits").astype(np.uint8)
        sent = send_round(
            address, args.round, readings, bits, args.chunks, args.offset,
            codec=args.codec, group=args.group,
        )  # fmt: skip
    except InvalidInputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except (GnnServeError, OSError) as exc:
        print(f"error: {args.to}: {exc}", file=sys.stderr)
        return 1
    print(f"round {args.round}: {sent} bytes to {args.to}, acknowledged")
    return 0


def _load_array(path: str, flag: str) -> np.ndarray:
    """The ``.npy`` at ``path``, read through a memory map so that a header claiming more
    than the file holds is refused before anything is allocated (InvalidInputError)."""
    try:
        array = np.load(Path(path), mmap_mode="r", allow_pickle=False)
        return np.array(array)
    except (OSError, ValueError, EOFError) as exc:
        raise InvalidInputError(f"{flag} {path}: not a readable .npy array ({exc})", flag) from exc


class GatewayRounds:
    """Runs a gateway-fed :class:`FogService`'s rounds as their uploads complete, on its own
    thread, and keeps the latest round's report for requests (:meth:`latest`)."""

    def __init__(self, service: FogService, poll_s: float = 0.5) -> None:
        self.service, self.poll_s = service, poll_s
        self.rounds = 0  # rounds completed
        self.report: RoundReport | None = None
        self.error: Exception | None = None  # the last round's failure (the loop goes on)
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="fog-gateway-rounds", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                report = self.service.gateway_round(self.poll_s)
            except Exception as exc:  # noqa: BLE001 - a bad upload fails one round, not serving
                log.warning("fog gateway round failed: %s", exc)
                self.error = exc
                self._stop.wait(self.poll_s)
                continue
            if report is not None:
                with self._cond:
                    self.report, self.rounds = report, self.rounds + 1
                    self._cond.notify_all()

    def latest(self, timeout_s: float) -> tuple[RoundReport, int]:
        """The latest completed round's report and number, waiting up to ``timeout_s`` for the
        first; UnavailableError (503) when none has completed by then."""
        with self._cond:
            self._cond.wait_for(lambda: self.report is not None, max(0.0, timeout_s))
            if self.report is None:
                raise UnavailableError(
                    "no sensor gateway round has completed yet: every group of the gateway "
                    "plan must upload round 1 (`gnnserve fog upload`, see plan.json)",
                    "fog_gateways",
                )
            return self.report, self.rounds

    def stop(self) -> None:
        """End the loop (within about ``poll_s``)."""
        self._stop.set()
        self._thread.join(self.poll_s * 4 + 5)
