"""A heterogeneous fog testbed on one machine, built from the kernel's own mechanisms.

- **Node speed**: a cgroup v1 CPU quota per fog node process (``cpu.cfs_quota_us`` over
  ``cpu.cfs_period_us``, as container runtimes set ``--cpus``): :class:`CpuQuota`. Changing the
  quota mid-run is a background-load change.
- **Links**: a network namespace per device group, joined to the host namespace by a veth pair;
  the upload direction (namespace -> host) is rate-limited by ``tc tbf``; the propagation delay
  by ``tc netem`` where the kernel has it (:class:`Link`). Some kernels (this project's VM:
  ``Error: Specified qdisc kind is unknown``) lack ``sch_netem``: then :attr:`Link.sender_delay_ms`
  is the one-way delay the sender adds before each upload message, and TCP's reaction to the
  round-trip time is not modelled. ``probe()`` says which.

Presets (:data:`PRESETS`, uplink rate and one-way delay) are round figures in the range public
measurements report for each access technology (e.g. Opensignal's mobile network experience
reports: 4G uploads around 10 Mbit/s and 40-60 ms round trips, 5G non-standalone uploads of
tens of Mbit/s and 20-30 ms; a campus WiFi LAN ~100 Mbit/s and a few ms). The cloud's path
(:func:`cloud_path`) is scaled from Fograph's own measurement (§II-C): one access point's rate
divided by the measured cloud/fog collection-time ratio, plus a WAN delay.
Everything here needs root; ``probe`` reports what is missing and tests skip with that reason.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from gnnserve.errors import GnnServeError, InvalidInputError

CPU_ROOT = Path("/sys/fs/cgroup/cpu")  # cgroup v1 cpu controller mount
GROUP = "gnnserve-fog"  # parent cgroup of every fog node's
MIN_QUOTA_US = 1_000  # the kernel's smallest quota per period


def period_us(cores: float) -> int:
    """CFS period for a ``cores`` quota: the shortest whose quota is at least 1 ms."""
    return max(MIN_QUOTA_US, int(-(-MIN_QUOTA_US // cores)))


SUBNET = "10.213"  # 10.213.<link>.1 host side, .2 namespace side (our own namespaces only)


class TestbedError(GnnServeError):
    """The machine cannot build this part of the testbed (not root, no cgroup, no netns)."""


@dataclass(frozen=True)
class LinkPreset:
    """An uplink: rate (Mbit/s) and one-way propagation delay (ms)."""

    name: str
    rate_mbit: float
    delay_ms: float

    def then(self, other: LinkPreset) -> LinkPreset:
        """This link followed by ``other``: the slower rate, the delays added."""
        rate = min(self.rate_mbit, other.rate_mbit)
        return LinkPreset(f"{self.name}+{other.name}", rate, self.delay_ms + other.delay_ms)


PRESETS = {
    "4g": LinkPreset("4g", 10.0, 25.0),
    "5g": LinkPreset("5g", 40.0, 12.0),
    "wifi": LinkPreset("wifi", 100.0, 2.0),
}
WAN_DELAY_MS = 20.0  # extra one-way delay to a cloud region ~200 km away
# Fograph §II-C measured: collecting to one fog instead of the cloud cut collection time by
# 64% (4G), 67% (5G) and 61% (WiFi); the cloud path is that many times slower than one access
# point's rate
CLOUD_SLOWDOWN = {"4g": 1 / (1 - 0.64), "5g": 1 / (1 - 0.67), "wifi": 1 / (1 - 0.61)}


def cloud_path(access: str) -> LinkPreset:
    """The devices' path to the cloud over access technology ``access``: its rate over Fograph's
    measured cloud slowdown, its delay plus the WAN's."""
    base = PRESETS[access]
    rate = base.rate_mbit / CLOUD_SLOWDOWN[access]
    return LinkPreset(f"cloud-{access}", rate, base.delay_ms + WAN_DELAY_MS)


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)


def _must(*argv: str) -> None:
    done = _run(*argv)
    if done.returncode != 0:
        raise TestbedError(f"`{' '.join(argv)}` failed: {done.stderr.strip()}")


@dataclass(frozen=True)
class Support:
    """What this machine allows: a reason per missing part (None: available)."""

    cpu_quota: str | None
    netns: str | None
    netem: bool  # tc netem present (else the sender adds the delay)


def probe() -> Support:
    """Check root, the cgroup v1 cpu controller, ``ip netns`` + ``tc tbf`` and ``tc netem``."""
    root = None if os.geteuid() == 0 else "needs root"
    cpu = root or (None if (CPU_ROOT / "cpu.cfs_quota_us").exists() else f"no {CPU_ROOT}")
    netns = root or (None if shutil.which("ip") and shutil.which("tc") else "no ip/tc tools")
    netem = False
    if netns is None:
        name = f"gnfprobe{os.getpid()}"
        if _run("ip", "netns", "add", name).returncode != 0:
            netns = "ip netns add is not permitted"
        else:
            try:
                tbf = ("tbf", "rate", "1mbit", "burst", "32kb", "latency", "50ms")
                if _run(
                    "ip", "netns", "exec", name, "tc", "qdisc", "add", "dev", "lo", "root", *tbf
                ).returncode:
                    netns = "tc tbf is not available"
                _run("ip", "netns", "exec", name, "tc", "qdisc", "del", "dev", "lo", "root")
                add = ("tc", "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms")
                netem = _run("ip", "netns", "exec", name, *add).returncode == 0
            finally:
                _run("ip", "netns", "del", name)
    return Support(cpu, netns, netem)


def _check_cores(cores: float) -> None:
    if not 0.01 <= cores <= 1024:
        raise InvalidInputError(f"cores must lie in [0.01, 1024], got {cores}", "cores")


class CpuQuota:
    """A cgroup v1 CPU quota of ``cores`` CPUs for the processes added to it."""

    def __init__(self, name: str, cores: float) -> None:
        if not name.isidentifier():
            raise InvalidInputError(f"cgroup name must be an identifier, got {name!r}", "name")
        _check_cores(cores)  # before the group exists: a refused quota leaves nothing behind
        self.path = CPU_ROOT / GROUP / name
        self.path.mkdir(parents=True, exist_ok=True)
        self.set_cores(cores)

    def set_cores(self, cores: float) -> None:
        """Limit the group to ``cores`` CPUs (a fraction slows it; takes effect at once).

        The period is short (the kernel's 1 ms minimum quota per period): with Docker's 100 ms
        a 0.3-core node would run a 20 ms round at full speed from its 30 ms slice, so rounds
        of a few ms would show no heterogeneity at all."""
        _check_cores(cores)
        self.cores = float(cores)
        period = period_us(cores)
        (self.path / "cpu.cfs_period_us").write_text(str(period))
        (self.path / "cpu.cfs_quota_us").write_text(str(int(round(cores * period))))

    def add(self, pid: int) -> None:
        """Move process ``pid`` (all its threads) into the group."""
        (self.path / "cgroup.procs").write_text(str(int(pid)))

    def close(self, timeout_s: float = 10.0) -> None:
        """Move the group's processes back to the root group and remove it (retrying while a
        process that is being killed still holds it)."""
        deadline = time.monotonic() + timeout_s
        while True:
            for pid in (self.path / "cgroup.procs").read_text().split():
                with contextlib.suppress(OSError):  # exited meanwhile
                    (CPU_ROOT / "cgroup.procs").write_text(pid)
            try:
                self.path.rmdir()
                return
            except OSError as exc:
                if exc.errno != errno.EBUSY or time.monotonic() > deadline:
                    raise TestbedError(f"cannot remove cgroup {self.path}: {exc}") from exc
                time.sleep(0.05)

    def __enter__(self) -> CpuQuota:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Link:
    """Namespace ``gnf<index>`` joined to the host by veth ``gnfh<index>`` / ``gnfd<index>``,
    uplink shaped to ``preset``. Processes started with :meth:`argv` send from the namespace to
    :attr:`host_ip`, an address of the host namespace where the fog node listens."""

    def __init__(self, index: int, preset: LinkPreset, netem: bool) -> None:
        if not 0 <= index < 250:
            raise InvalidInputError(f"link index must lie in [0, 250), got {index}", "index")
        self.index, self.preset, self.netem = index, preset, netem
        self.ns, host, dev = f"gnf{index}", f"gnfh{index}", f"gnfd{index}"
        self.host_ip, self.device_ip = f"{SUBNET}.{index}.1", f"{SUBNET}.{index}.2"
        _run("ip", "netns", "del", self.ns)  # leftovers of a killed run
        _run("ip", "link", "del", host)
        _must("ip", "netns", "add", self.ns)
        try:
            _must("ip", "link", "add", host, "type", "veth", "peer", "name", dev)
            _must("ip", "link", "set", dev, "netns", self.ns)
            _must("ip", "addr", "add", f"{self.host_ip}/30", "dev", host)
            _must("ip", "link", "set", host, "up")
            for cmd in (
                ("ip", "addr", "add", f"{self.device_ip}/30", "dev", dev),
                ("ip", "link", "set", dev, "up"),
                ("ip", "link", "set", "lo", "up"),
            ):
                _must("ip", "netns", "exec", self.ns, *cmd)
            self._dev = dev
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
        if not 0.01 <= rate_mbit <= 100_000:
            raise InvalidInputError(
                f"rate must lie in [0.01, 100000] Mbit/s, got {rate_mbit}", "rate"
            )
        verb = "add" if add else "change"
        burst = max(int(rate_mbit * 1e6 / 8 / 250), 16_000)  # 4 ms of data, at least 16 kB
        tbf = ("tbf", "rate", f"{rate_mbit}mbit", "burst", str(burst), "latency", "1s")
        tc = ("ip", "netns", "exec", self.ns, "tc", "qdisc", verb, "dev", self._dev)
        if self.netem:
            if add:
                _must(*tc, "root", "handle", "1:", "netem", "delay", f"{self.preset.delay_ms}ms")
            _must(*tc, "parent", "1:1", "handle", "10:", *tbf)
        else:
            _must(*tc, "root", "handle", "1:", *tbf)

    def argv(self, *command: str) -> list[str]:
        """``command`` run inside this link's namespace."""
        return ["ip", "netns", "exec", self.ns, *command]

    def close(self) -> None:
        """Delete the namespace (and with it the veth pair)."""
        _run("ip", "netns", "del", self.ns)
        _run("ip", "link", "del", f"gnfh{self.index}")

    def __enter__(self) -> Link:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
