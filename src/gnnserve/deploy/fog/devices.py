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

    ``bits``: per-row widths for ``codec`` (daq | column; None: raw float32 uploads, no
    compression); ``link``: the
    testbed link it sends over (None: loopback, no shaping); ``port``/``host``: the fog's
    receiver. Rows are the fog's owned vertices in ascending id order from row ``offset``;
    ``group``: its number on the wire (the receiver checks it takes this group's rows).
    """

    def __init__(
        self,
        host: str,
        port: int,
        bits: np.ndarray | None = None,
        link: Link | None = None,
        chunks: int = 4,
        offset: int = 0,
        codec: str = "daq",
        group: int = 0,
    ) -> None:
        self._dir = tempfile.TemporaryDirectory(prefix="gnnserve-fog-dev-")
        cmd = [sys.executable, "-m", "gnnserve.deploy.fog.upload", "--connect", f"{host}:{port}"]
        cmd += ["--chunks", str(chunks), "--offset", str(offset), "--group", str(group)]
        if bits is not None:
            np.save(Path(self._dir.name) / "bits.npy", np.asarray(bits, np.uint8))
            cmd += ["--bits", str(Path(self._dir.name) / "bits.npy"), "--codec", codec]
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
        reply: dict[str, float] = json.loads(line)
        if "error" in reply:
            raise GnnServeError(f"device group upload failed: {reply['error']}")
        return reply

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


def regions(
    membership: np.ndarray, world: int, groups: int | None = None
) -> list[tuple[int, np.ndarray, int]]:
    """(fog, vertices, first row at that fog) per device group: one group per fog over its
    owned vertices; or, with ``groups`` (the cloud: one fog), that many equal id ranges."""
    if groups is None:
        return [(j, np.flatnonzero(membership == j), 0) for j in range(world)]
    bounds = np.linspace(0, membership.size, groups + 1).astype(int)
    return [(0, np.arange(lo, hi), int(lo)) for lo, hi in zip(bounds[:-1], bounds[1:], strict=True)]


class DeviceFleet:
    """Every device group of a deployment: group g uploads ``regions[g]``'s vertices to fog
    ``regions[g][0]`` at ``hosts[g]``:``ports[fog]`` over ``links[g]``, DAQ widths from
    ``bits`` (per vertex; None: raw) for ``codec``. Close with :meth:`close`."""

    def __init__(
        self,
        regions: list[tuple[int, np.ndarray, int]],
        hosts: list[str],
        ports: list[int],
        links: list[Link | None],
        bits: np.ndarray | None,
        chunks: int,
        codec: str = "daq",
    ) -> None:
        self.regions, self.bits = regions, bits
        self.groups: list[DeviceGroup] = []
        try:
            for group, ((fog, vertices, offset), host, link) in enumerate(
                zip(regions, hosts, links, strict=True)
            ):
                widths = None if bits is None else bits[vertices]
                self.groups.append(
                    DeviceGroup(host, ports[fog], widths, link, chunks, offset, codec, group)
                )
        except BaseException:
            self.close()
            raise

    def replace(self, regions: list[tuple[int, np.ndarray, int]]) -> None:
        """A re-placement: same processes and connections, new rows (and their DAQ widths)."""
        self.regions = regions
        if self.bits is not None:
            for group, (_, vertices, _) in zip(self.groups, regions, strict=True):
                group.set_bits(self.bits[vertices])

    def start_round(self, round_id: int, features: np.ndarray) -> None:
        """Hand every group its vertices' rows of ``features`` (float32 [N, F])."""
        for group, (_, vertices, _) in zip(self.groups, self.regions, strict=True):
            group.start_round(round_id, features[vertices])

    def finish_round(self) -> int:
        """Bytes all groups sent on the wire in the round just uploaded."""
        return sum(int(g.finish_round()["bytes"]) for g in self.groups)

    def close(self) -> None:
        """End every group's process."""
        for group in self.groups:
            group.close()
        self.groups = []
