"""Driver-side handles of device-group processes (:mod:`.upload`): start one per fog, in its
testbed link's namespace when there is one, and drive its rounds."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from gnnserve.deploy.fog.links import Link
from gnnserve.errors import GnnServeError


class DeviceGroup:
    """The sensors of one fog as one uploading process.

    ``bits``: per-row DAQ bitwidths (None: raw float32 uploads, no compression); ``link``: the
    testbed link it sends over (None: loopback, no shaping); ``port``/``host``: the fog's
    receiver. Rows are the fog's owned vertices in ascending id order from row ``offset``.
    """

    def __init__(
        self,
        host: str,
        port: int,
        bits: np.ndarray | None = None,
        link: Link | None = None,
        chunks: int = 4,
        offset: int = 0,
    ) -> None:
        self._dir = tempfile.TemporaryDirectory(prefix="gnnserve-fog-dev-")
        cmd = [sys.executable, "-m", "gnnserve.deploy.fog.upload", "--connect", f"{host}:{port}"]
        cmd += ["--chunks", str(chunks), "--offset", str(offset)]
        if bits is not None:
            np.save(Path(self._dir.name) / "bits.npy", np.asarray(bits, np.uint8))
            cmd += ["--bits", str(Path(self._dir.name) / "bits.npy")]
        if link is not None:
            cmd += ["--delay-ms", str(link.sender_delay_ms)]
            cmd = link.argv(*cmd)
        self.proc = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1
        )

    def set_bits(self, bits: np.ndarray) -> None:
        """New per-row DAQ widths (the group's rows changed with a re-placement); applies to
        the next round. Only for a group started with bits."""
        path = Path(self._dir.name) / "bits.npy"
        np.save(path, np.asarray(bits, np.uint8))
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"bits {path}\n")
        self.proc.stdin.flush()
        self.finish_round()  # its acknowledgement

    def start_round(self, round_id: int, values: np.ndarray) -> None:
        """Hand this round's readings (float32 [rows, F]) to the process, which uploads them."""
        path = Path(self._dir.name) / f"r{round_id % 2}.npy"  # the previous round's is done
        np.save(path, np.asarray(values, np.float32))
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"{round_id} {path}\n")
        self.proc.stdin.flush()

    def finish_round(self) -> dict[str, float]:
        """The process's report of its last upload (bytes, pack_ms, send_ms)."""
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise GnnServeError(f"device group exited with code {self.proc.poll()}")
        return json.loads(line)  # type: ignore[no-any-return]

    def close(self) -> None:
        """End the process (stdin closed: it finishes its last upload first)."""
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._dir.cleanup()
