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

from gnnserve.deploy.fog.upload import encode_round
from gnnserve.errors import InvalidInputError, UnavailableError

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
        ]
        bits = None
        if group["bits"] is not None:
            bits = out / f"group{k}.bits.npy"
            np.save(bits, np.asarray(group["bits"], np.uint8))
            command += ["--bits", str(bits), "--codec", group["codec"]]
        command += ["--readings", "{readings}", "--round", "{round}"]
        groups.append(
            {
                "fog": group["fog"], "to": group["to"], "offset": group["offset"],
                "codec": group["codec"] if bits else "raw", "rows": int(len(group["vertices"])),
                "vertices": str(vertices), "bits": str(bits) if bits else None,
                "command": command,
            }
        )  # fmt: skip
    path = out / "plan.json"
    about = "rounds are numbered 1, 2, ... in order; each group sends its rows of every round"
    path.write_text(json.dumps({"rounds": about, "groups": groups}, indent=2))
    return path


def parse_address(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (InvalidInputError naming what is wrong)."""
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise InvalidInputError(f"--to must be HOST:PORT, got {text!r}", "to")
    return host, int(port)


def send_round(
    address: tuple[str, int],
    round_id: int,
    readings: np.ndarray,
    bits: np.ndarray | None = None,
    chunks: int = 4,
    offset: int = 0,
    timeout_s: float = 60.0,
    codec: str = "daq",
) -> int:
    """Upload ``readings`` (float32 [rows, F]) as round ``round_id`` to the receiver at
    ``address``, packed by ``codec`` at the per-row widths ``bits`` (None: raw float32);
    returns the bytes sent."""
    values = np.ascontiguousarray(readings, np.float32)
    if values.ndim != 2 or not np.isfinite(values).all():
        raise InvalidInputError("readings must be a finite float32 [rows, F] array", "readings")
    if bits is not None and bits.shape != (values.shape[0],):
        raise InvalidInputError(
            f"bits must hold one width per row ({values.shape[0]}), got {bits.shape}", "bits"
        )
    if round_id < 1 or chunks < 1 or offset < 0:
        raise InvalidInputError("round and chunks must be >= 1, offset >= 0", "round")
    payload = encode_round(round_id, values, bits, chunks, offset, codec)
    with socket.create_connection(address, timeout=timeout_s) as conn:
        for chunk in payload:
            conn.sendall(chunk)
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
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Send one round; print the bytes sent. Exit 2 on bad input, 1 when the fog is
    unreachable."""
    try:
        readings = np.load(Path(args.readings))
        bits = None if args.bits is None else np.load(Path(args.bits)).astype(np.uint8)
        sent = send_round(
            parse_address(args.to),
            args.round,
            readings,
            bits,
            args.chunks,
            args.offset,
            codec=args.codec,
        )
    except (InvalidInputError, ValueError, OSError) as exc:
        unreachable = isinstance(exc, OSError) and not isinstance(exc, FileNotFoundError)
        print(f"gnnserve fog upload: {exc}", file=sys.stderr)
        return 1 if unreachable else 2
    print(f"round {args.round}: {sent} bytes to {args.to}")
    return 0


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
