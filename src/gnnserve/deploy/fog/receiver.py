"""The fog's side of sensor collection (Fograph §III-D): one thread per device-group connection
reads chunks (:mod:`.upload`'s wire format), gathers each group's rows of a round apart from
the live features, and answers the sender once that group's upload is whole. A round reaches
the features only when the fog consumes it (:meth:`Receiver.wait`), from every group it takes.

An upload for a round the fog has already run (or one too far ahead), from a group this fog
does not take, with rows outside its group's range, or a second upload of a round a group has
already delivered is refused: the sender is told why, nothing of it is applied, and the round
runs on the readings that were accepted. A torn upload is dropped (it was never acknowledged).
"""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from gnnserve.deploy.fog.upload import HEADER, MAGIC, MAX_PAYLOAD, RAW, UNPACKERS
from gnnserve.errors import InvalidInputError

log = logging.getLogger(__name__)

ROUNDS_AHEAD = 4  # rounds a group may upload beyond the next one the fog will run
REFUSALS_KEPT = 32  # the latest refusal reasons kept for inspection
DRAIN_S = 30.0  # how long a refused sender's remaining bytes are read (and dropped)


@dataclass(frozen=True)
class Chunk:
    """One decoded chunk: device group ``group``'s rows ``values`` (float32 [n, F]) of round
    ``round`` from fog row ``start``; chunk ``index`` of ``count``."""

    round: int
    group: int
    index: int
    count: int
    start: int
    values: np.ndarray


def _read_exact(conn: socket.socket, size: int) -> bytes | None:
    buf = bytearray()
    while len(buf) < size:
        part = conn.recv(min(size - len(buf), 1 << 20))
        if not part:
            return None if not buf else bytes(buf)
        buf += part
    return bytes(buf)


def read_chunk(conn: socket.socket) -> Chunk | None:
    """The next chunk on ``conn``; None at a clean end. A torn or malformed chunk raises
    InvalidInputError (nothing of it is applied)."""
    head = _read_exact(conn, HEADER.size)
    if head is None:
        return None
    if len(head) < HEADER.size:
        raise InvalidInputError("upload ended inside a chunk header", "upload")
    magic, rnd, group, index, count, start, n, dim, codec, size = HEADER.unpack(head)
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
    return Chunk(rnd, group, index, count, start, values)


class _Upload:
    """One group's chunks of one round on one connection, gathered until whole: ``rows`` fog
    rows from ``offset``."""

    def __init__(self, first: Chunk, offset: int, rows: int) -> None:
        self.round, self.group, self.count = first.round, first.group, first.count
        self.offset, self.rows = offset, rows
        self.values = np.empty((rows, first.values.shape[1]), np.float32)
        self.covered = np.zeros(rows, bool)
        self.seen: set[int] = set()

    def add(self, chunk: Chunk) -> None:
        """Take ``chunk`` into this upload (InvalidInputError when it does not belong)."""
        if (chunk.round, chunk.group, chunk.count) != (self.round, self.group, self.count):
            raise InvalidInputError(
                f"a chunk of round {chunk.round} (group {chunk.group}) inside round "
                f"{self.round}'s upload of group {self.group}: one round at a time",
                "upload",
            )
        n, dim = chunk.values.shape
        lo = chunk.start - self.offset
        if lo < 0 or lo + n > self.rows:
            raise InvalidInputError(
                f"rows [{chunk.start}, {chunk.start + n}) are outside group {self.group}'s rows "
                f"[{self.offset}, {self.offset + self.rows}) at this fog: another group's "
                "readings, or a wrong --offset",
                "upload",
            )
        if (
            chunk.index in self.seen
            or self.covered[lo : lo + n].any()
            or dim != self.values.shape[1]
        ):
            raise InvalidInputError(
                f"chunk {chunk.index} of round {self.round} repeats rows or changes the width",
                "upload",
            )
        self.values[lo : lo + n] = chunk.values
        self.covered[lo : lo + n] = True
        self.seen.add(chunk.index)

    @property
    def whole(self) -> bool:
        """Every chunk has arrived."""
        return len(self.seen) == self.count


class Receiver:
    """Accepts device-group connections on ``host`` (``port``: 0 for any free one) and gathers
    their uploads; :meth:`wait` consumes a round once every expected group has delivered it and
    hands each group's rows to ``apply(first_row, values)``.

    ``groups``: the device groups this fog takes, group -> (first fog row, rows) (None: none
    yet); change it with :meth:`expect`. ``width``: the feature width every chunk must have
    (None: any). ``strict``: a refused or torn upload fails the pending :meth:`wait` (the
    server's own device groups, where a refusal is a fault); otherwise only the sender hears
    of it (gateways)."""

    def __init__(
        self,
        host: str,
        apply: Callable[[int, np.ndarray], None],
        groups: dict[int, tuple[int, int]] | None = None,
        width: int | None = None,
        port: int = 0,
        strict: bool = False,
    ) -> None:
        self.apply, self.width, self.strict = apply, width, strict
        self._groups = dict(groups or {})
        self._next = 1  # the next round wait() will consume
        self._rounds: dict[int, dict[int, tuple[int, np.ndarray]]] = {}
        self._failure: str | None = None  # strict: a refusal the next wait() raises
        self.refused = 0  # uploads refused (or torn) so far
        self.refusals: list[str] = []  # the latest reasons
        self._cond = threading.Condition()
        self._server = socket.create_server((host, port))
        self.port = int(self._server.getsockname()[1])
        threading.Thread(target=self._accept, daemon=True).start()

    def expect(self, groups: dict[int, tuple[int, int]]) -> None:
        """From now on take device groups ``groups`` (group -> (first fog row, rows)); rounds
        gathered on the former ranges are dropped (a re-placement moves rows)."""
        with self._cond:
            self._groups = dict(groups)
            self._rounds.clear()

    def _accept(self) -> None:
        while True:
            try:
                conn, peer = self._server.accept()
            except OSError:
                return  # closed
            threading.Thread(target=self._serve, args=(conn, peer), daemon=True).start()

    def _serve(self, conn: socket.socket, peer: tuple[str, int]) -> None:
        upload: _Upload | None = None
        with conn:
            while True:
                try:
                    chunk = read_chunk(conn)
                    if chunk is None:
                        if upload is not None:
                            raise InvalidInputError(
                                f"round {upload.round}'s upload of group {upload.group} ended "
                                f"after {len(upload.seen)} of {upload.count} chunks",
                                "upload",
                            )
                        return
                    upload = self._gather(upload, chunk)
                    if upload.whole:
                        self._commit(upload)
                        _answer(conn, {"ok": True, "round": upload.round, "group": upload.group})
                        upload = None
                except InvalidInputError as exc:
                    self._refuse(conn, peer, str(exc))
                    return
                except OSError as exc:
                    self._refuse(conn, peer, f"connection failed: {exc}")
                    return

    def _gather(self, upload: _Upload | None, chunk: Chunk) -> _Upload:
        if upload is None:
            with self._cond:
                self._check(chunk.round, chunk.group)
                offset, rows = self._groups[chunk.group]
            if self.width is not None and chunk.values.shape[1] != self.width:
                raise InvalidInputError(
                    f"readings have {chunk.values.shape[1]} features; this fog takes {self.width}",
                    "upload",
                )
            upload = _Upload(chunk, offset, rows)
        upload.add(chunk)
        return upload

    def _check(self, round_id: int, group: int) -> None:
        """Whether group ``group`` may upload round ``round_id`` now (under the lock)."""
        if group not in self._groups:
            raise InvalidInputError(
                f"device group {group} does not upload to this fog (it takes group(s) "
                f"{sorted(self._groups)}): check --to and --group against plan.json",
                "upload",
            )
        if round_id < self._next:
            raise InvalidInputError(
                f"round {round_id} is stale: this fog has run rounds up to {self._next - 1} "
                f"and takes round {self._next} next",
                "upload",
            )
        if round_id >= self._next + ROUNDS_AHEAD:
            raise InvalidInputError(
                f"round {round_id} is too far ahead: this fog takes rounds {self._next} to "
                f"{self._next + ROUNDS_AHEAD - 1} now",
                "upload",
            )
        if group in self._rounds.get(round_id, {}):
            raise InvalidInputError(
                f"group {group} has already uploaded round {round_id}; an accepted upload is "
                "never replaced",
                "upload",
            )

    def _commit(self, upload: _Upload) -> None:
        if not upload.covered.all():
            raise InvalidInputError(
                f"round {upload.round} from group {upload.group} holds "
                f"{int(upload.covered.sum())} of the group's {upload.rows} rows",
                "upload",
            )
        with self._cond:
            self._check(upload.round, upload.group)  # the fog may have moved on meanwhile
            if self._groups[upload.group] != (upload.offset, upload.rows):
                raise InvalidInputError("the fog's placement changed during the upload", "upload")
            self._rounds.setdefault(upload.round, {})[upload.group] = (upload.offset, upload.values)
            self._cond.notify_all()

    def _refuse(self, conn: socket.socket, peer: tuple[str, int], reason: str) -> None:
        log.warning("fog upload from %s:%s refused: %s", peer[0], peer[1], reason)
        with self._cond:
            self.refused += 1
            self.refusals = [*self.refusals[-(REFUSALS_KEPT - 1) :], reason]
            if self.strict:
                self._failure = reason
            self._cond.notify_all()
        _answer(conn, {"ok": False, "error": reason})
        _drain(conn)

    def _complete(self, round_id: int) -> bool:
        return set(self._rounds.get(round_id, {})) >= set(self._groups)

    def arrived(self, round_id: int, timeout_s: float) -> bool:
        """Whether round ``round_id`` has arrived from every group, waiting up to ``timeout_s``
        for it; the round stays pending for :meth:`wait` (strict: InvalidInputError on a
        refused upload)."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while not self._complete(round_id):
                if self._failure is not None:
                    reason, self._failure = self._failure, None
                    raise InvalidInputError(f"bad upload: {reason}", "upload")
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
            return True

    def wait(self, round_id: int, timeout_s: float = 120.0) -> None:
        """Block until round ``round_id`` arrived from every group, then apply it and move on
        to the next (InvalidInputError as :meth:`arrived`; TimeoutError after ``timeout_s``)."""
        if not self.arrived(round_id, timeout_s):
            raise TimeoutError(f"round {round_id} not uploaded within {timeout_s} s")
        with self._cond:
            uploads = self._rounds.pop(round_id)
            self._next = max(self._next, round_id + 1)
            for stale in [r for r in self._rounds if r < self._next]:
                del self._rounds[stale]
        for group in sorted(uploads):
            self.apply(*uploads[group])

    def close(self) -> None:
        """Stop accepting."""
        self._server.close()


def _drain(conn: socket.socket) -> None:
    """Read and drop what the sender still sends (up to ``DRAIN_S``), so that closing does not
    reset the connection before the sender has read why its upload was refused."""
    with contextlib.suppress(OSError):
        conn.settimeout(DRAIN_S)
        while conn.recv(1 << 20):
            pass


def _answer(conn: socket.socket, ack: dict[str, object]) -> None:
    """One JSON line to the sender (which may already be gone)."""
    with contextlib.suppress(OSError):
        conn.sendall((json.dumps(ack) + "\n").encode())
