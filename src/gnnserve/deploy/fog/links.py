"""Shaped links of the one-machine fog testbed: device -> fog uplinks, the fog <-> fog network,
and the cloud's path, from network namespaces, veth pairs and ``tc``.

- **Device uplinks** (:class:`Link`): a namespace per device group joined to the host namespace
  by a veth pair; the upload direction (namespace -> host) is rate-limited by ``tc tbf`` and
  delayed by ``tc netem`` where the kernel has it.
- **Fog <-> fog** (:class:`FogFabric`): a namespace per fog node, all joined by one bridge; each
  fog's sending side is shaped to its preset. A node's gloo sockets are created inside its
  namespace (:func:`entered`) while the rest of the process (Ray, the upload receiver) stays in
  the host namespace, so exactly the boundary exchange crosses the shaped links.
- **No netem**: some kernels (this project's VM: ``Error: Specified qdisc kind is unknown``)
  lack ``sch_netem``. Then ``sender_delay_ms`` is the one-way delay a sender adds once per
  message (a round's upload, a layer's exchange), and TCP's reaction to the round trip is not
  modelled. :func:`~.testbed.probe` says which.

Presets (:data:`PRESETS`: rate and one-way delay) are round figures in the range public
measurements report for each access technology (e.g. Opensignal's mobile network experience
reports: 4G uploads around 10 Mbit/s and 40-60 ms round trips, 5G non-standalone uploads of
tens of Mbit/s and 20-30 ms; a campus WiFi LAN ~100 Mbit/s and a few ms). :data:`FOG_LINKS`
adds ``lan``, switched gigabit Ethernet, for fog servers on one campus as in Fograph's
testbed (§II-C). The cloud's path (:func:`cloud_path`) is scaled from Fograph's own
measurement (§II-C): one access point's rate divided by the measured cloud/fog
collection-time ratio, plus a WAN delay.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass

from gnnserve.deploy.fog.testbed import TestbedError, _must, _run
from gnnserve.errors import InvalidInputError


@dataclass(frozen=True)
class LinkPreset:
    """A link: rate (Mbit/s) and one-way propagation delay (ms)."""

    name: str
    rate_mbit: float
    delay_ms: float

    def then(self, other: LinkPreset) -> LinkPreset:
        """This link followed by ``other``: the slower rate, the delays added."""
        rate = min(self.rate_mbit, other.rate_mbit)
        return LinkPreset(f"{self.name}+{other.name}", rate, self.delay_ms + other.delay_ms)


PRESETS = {  # device uplinks (access technologies)
    "4g": LinkPreset("4g", 10.0, 25.0),
    "5g": LinkPreset("5g", 40.0, 12.0),
    "wifi": LinkPreset("wifi", 100.0, 2.0),
}
FOG_LINKS = {**PRESETS, "lan": LinkPreset("lan", 1000.0, 0.25)}  # fog <-> fog
WAN_DELAY_MS = 20.0  # extra one-way delay to a cloud region ~200 km away
# Fograph §II-C measured: collecting to one fog instead of the cloud cut collection time by
# 64% (4G), 67% (5G) and 61% (WiFi); the cloud path is that many times slower than one access
# point's rate
CLOUD_SLOWDOWN = {"4g": 1 / (1 - 0.64), "5g": 1 / (1 - 0.67), "wifi": 1 / (1 - 0.61)}
SUBNET = "10.213"  # device link i of slot k: 10.213.<k>.<4i + 1> host side, <4i + 2> its namespace
FABRIC_SUBNET = "10.214"  # the fog fabric of slot k: 10.214.<k>.<fog + 1>
MAX_LINKS = 62  # device links per slot: 4 x 61 + 2 stays below 255
FABRIC_IFNAME = "gnffog"  # the fog's interface inside its namespace (gloo binds to it)
_CLONE_NEWNET = 0x40000000


def cloud_path(access: str) -> LinkPreset:
    """The devices' path to the cloud over access technology ``access``: its rate over Fograph's
    measured cloud slowdown, its delay plus the WAN's."""
    base = PRESETS[access]
    rate = base.rate_mbit / CLOUD_SLOWDOWN[access]
    return LinkPreset(f"cloud-{access}", rate, base.delay_ms + WAN_DELAY_MS)


def _check_slot(slot: int) -> None:
    if not 0 <= slot < 250:
        raise InvalidInputError(f"testbed slot must lie in [0, 250), got {slot}", "slot")


def _check_rate(rate_mbit: float) -> None:
    if not 0.01 <= rate_mbit <= 100_000:
        raise InvalidInputError(f"rate must lie in [0.01, 100000] Mbit/s, got {rate_mbit}", "rate")


def _shape(ns: str, dev: str, preset: LinkPreset, netem: bool, rate_mbit: float, add: bool) -> None:
    """tbf at ``rate_mbit`` on ``dev``'s egress in namespace ``ns`` (under netem's delay)."""
    _check_rate(rate_mbit)
    verb = "add" if add else "change"
    burst = max(int(rate_mbit * 1e6 / 8 / 250), 16_000)  # 4 ms of data, at least 16 kB
    tbf = ("tbf", "rate", f"{rate_mbit}mbit", "burst", str(burst), "latency", "1s")
    tc = ("ip", "netns", "exec", ns, "tc", "qdisc", verb, "dev", dev)
    if netem:
        if add:
            _must(*tc, "root", "handle", "1:", "netem", "delay", f"{preset.delay_ms}ms")
        _must(*tc, "parent", "1:1", "handle", "10:", *tbf)
    else:
        _must(*tc, "root", "handle", "1:", *tbf)


def _setns(fd: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, _CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise TestbedError(f"setns failed: {os.strerror(err)}")


@contextlib.contextmanager
def entered(ns: str) -> Iterator[None]:
    """Run the calling thread in network namespace ``ns`` (``ip netns`` name) for the block.

    Sockets keep the namespace they were created in: a socket opened here carries its traffic
    over ``ns``'s links after the thread has returned to its own namespace."""
    home = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    try:
        target = os.open(f"/var/run/netns/{ns}", os.O_RDONLY)
        try:
            _setns(target)
        finally:
            os.close(target)
        try:
            yield
        finally:
            _setns(home)
    finally:
        os.close(home)


class Link:
    """Device link ``index`` of testbed slot ``slot`` (:mod:`.slots`, which removed any
    leftovers of the slot's dead owner): namespace ``gnf<slot>d<index>`` joined to the host by
    veth ``gnh<slot>d<index>`` / ``gnd<slot>d<index>``, uplink shaped to ``preset``. Processes
    started with :meth:`argv` send from the namespace to :attr:`host_ip`, an address of the host
    namespace where the fog node listens."""

    def __init__(self, slot: int, index: int, preset: LinkPreset, netem: bool) -> None:
        _check_slot(slot)
        if not 0 <= index < MAX_LINKS:
            raise InvalidInputError(
                f"link index must lie in [0, {MAX_LINKS}), got {index}", "index"
            )
        self.slot, self.index, self.preset, self.netem = slot, index, preset, netem
        name = f"{slot}d{index}"
        self.ns, self._host, self.dev = f"gnf{name}", f"gnh{name}", f"gnd{name}"
        dev = self.dev  # the namespace side of the veth pair
        self.host_ip = f"{SUBNET}.{slot}.{4 * index + 1}"
        self.device_ip = f"{SUBNET}.{slot}.{4 * index + 2}"
        _must("ip", "netns", "add", self.ns)
        try:
            _must("ip", "link", "add", self._host, "type", "veth", "peer", "name", dev)
            _must("ip", "link", "set", dev, "netns", self.ns)
            _must("ip", "addr", "add", f"{self.host_ip}/30", "dev", self._host)
            _must("ip", "link", "set", self._host, "up")
            for cmd in (
                ("ip", "addr", "add", f"{self.device_ip}/30", "dev", dev),
                ("ip", "link", "set", dev, "up"),
                ("ip", "link", "set", "lo", "up"),
            ):
                _must("ip", "netns", "exec", self.ns, *cmd)
            self.set_rate(preset.rate_mbit, add=True)
        except BaseException:
            self.close()
            raise

    @property
    def sender_delay_ms(self) -> float:
        """One-way delay the sender must add itself (0 where netem delays in the kernel)."""
        return 0.0 if self.netem else self.preset.delay_ms

    def set_rate(self, rate_mbit: float, add: bool = False) -> None:
        """Shape the uplink to ``rate_mbit`` Mbit/s (tbf; below it netem's delay, if any)."""
        _shape(self.ns, self.dev, self.preset, self.netem, rate_mbit, add)

    def argv(self, *command: str) -> list[str]:
        """``command`` run inside this link's namespace."""
        return ["ip", "netns", "exec", self.ns, *command]

    def close(self) -> None:
        """Delete the namespace (and with it the veth pair)."""
        _run("ip", "netns", "del", self.ns)
        _run("ip", "link", "del", self._host)

    def __enter__(self) -> Link:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_SENDER = (
    "import socket, sys\n"
    "s = socket.create_connection((sys.argv[1], int(sys.argv[2])))\n"
    "s.sendall(bytes(int(sys.argv[3])))\n"
    "s.close()\n"
)


def measure_rate(link: Link, seconds: float = 0.3, timeout_s: float = 30.0) -> float:
    """The link's upload rate in bytes/s, measured (Fograph's profiler measures bandwidth): a
    process in the link's namespace sends about ``seconds`` worth of the preset's rate (at
    least 256 kB) to the host side, timed from the first byte received to the last (the first
    read, which may hold the shaper's burst, is not counted)."""
    nbytes = max(256_000, int(link.preset.rate_mbit * 1e6 / 8 * seconds))
    with socket.create_server((link.host_ip, 0)) as server:
        server.settimeout(timeout_s)
        port = str(server.getsockname()[1])
        argv = link.argv(sys.executable, "-c", _SENDER, link.host_ip, port, str(nbytes))
        proc = subprocess.Popen(argv)
        try:
            conn, _ = server.accept()
            with conn:
                conn.settimeout(timeout_s)
                first = len(conn.recv(1 << 20))
                start, got = time.perf_counter(), first
                while part := conn.recv(1 << 20):
                    got += len(part)
                took = time.perf_counter() - start
        finally:
            proc.wait(timeout=timeout_s)
    if got != nbytes or took <= 0:
        raise TestbedError(f"rate probe over {link.ns}: {got} of {nbytes} bytes arrived")
    return (got - first) / took


class FogFabric:
    """The fog <-> fog network of testbed slot ``slot``: namespace ``gnf<slot>f<j>`` per fog j,
    with interface :data:`FABRIC_IFNAME` at ``10.214.<slot>.<j + 1>/24``, all on bridge
    ``gnb<slot>``; fog j's sending side shaped to ``presets[j]`` (rate; delay by netem or by the
    sender, :meth:`sender_delay_ms`)."""

    def __init__(self, slot: int, presets: list[LinkPreset], netem: bool) -> None:
        _check_slot(slot)
        if not 1 <= len(presets) < 250:
            raise InvalidInputError("a fabric joins between 1 and 249 fogs", "nodes")
        self.slot, self.presets, self.netem = slot, list(presets), netem
        self.bridge = f"gnb{slot}"
        self.namespaces: list[str] = []  # those created so far (close() removes them)
        self.addresses = [f"{FABRIC_SUBNET}.{slot}.{j + 1}" for j in range(len(presets))]
        try:
            _must("ip", "link", "add", self.bridge, "type", "bridge")
            _must("ip", "link", "set", self.bridge, "up")
            for j, preset in enumerate(self.presets):
                self._add_fog(j, preset)
        except BaseException:
            self.close()
            raise

    def _add_fog(self, j: int, preset: LinkPreset) -> None:
        ns, host = f"gnf{self.slot}f{j}", f"gnh{self.slot}f{j}"
        _must("ip", "netns", "add", ns)
        self.namespaces.append(ns)
        _must("ip", "link", "add", host, "type", "veth", "peer", "name", FABRIC_IFNAME, "netns", ns)
        _must("ip", "link", "set", host, "master", self.bridge, "up")
        for cmd in (
            ("ip", "addr", "add", f"{self.addresses[j]}/24", "dev", FABRIC_IFNAME),
            ("ip", "link", "set", FABRIC_IFNAME, "up"),
            ("ip", "link", "set", "lo", "up"),
        ):
            _must("ip", "netns", "exec", ns, *cmd)
        _shape(ns, FABRIC_IFNAME, preset, self.netem, preset.rate_mbit, add=True)

    def sender_delay_ms(self, fog: int) -> float:
        """One-way delay fog ``fog`` adds before each exchange (0 where netem delays)."""
        return 0.0 if self.netem else self.presets[fog].delay_ms

    def sent_bytes(self, fog: int) -> int:
        """Bytes fog ``fog`` has sent over the fabric (its interface's tx counter)."""
        path = f"/sys/class/net/{FABRIC_IFNAME}/statistics/tx_bytes"
        done = _run("ip", "netns", "exec", self.namespaces[fog], "cat", path)  # its own sysfs
        return int(done.stdout.strip() or 0)

    def close(self) -> None:
        """Delete the namespaces (their veth pairs go with them) and the bridge."""
        for ns in getattr(self, "namespaces", []):
            _run("ip", "netns", "del", ns)
        _run("ip", "link", "del", self.bridge)

    def __enter__(self) -> FogFabric:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
