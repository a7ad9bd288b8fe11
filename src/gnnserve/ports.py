"""TCP ports for servers started next (a test's server, a local SeaweedFS), picked where no
outgoing connection can take them.

A port picked free and released is bound again by the server only a moment later. A port in the
kernel's ephemeral range can be taken in that moment by any process's outgoing connection
(EADDRINUSE at the server's bind); one below that range only by another listener. So ports are
drawn at random between :data:`FIRST_FREE_PORT` and the range's first port, where that leaves
room, and checked free with a bind.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

FIRST_FREE_PORT = 20000  # above Ray's worker ports (10002-19999)
_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def ephemeral_floor() -> int:
    """The first port of the kernel's ephemeral range (0: unknown)."""
    try:
        return int(_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0


def candidate_port(room: int = 0) -> int:
    """A port to try (not checked): at random in ``[FIRST_FREE_PORT, floor - room)`` where that
    holds 1,000 ports or more (``room``: how far above it the caller needs another port, e.g. a
    gRPC port at +10000), else one the kernel gives (bind to port 0), which may be ephemeral."""
    end = ephemeral_floor() - room
    if end - FIRST_FREE_PORT >= 1000:
        return random.SystemRandom().randrange(FIRST_FREE_PORT, end)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def is_free(port: int) -> bool:
    """Whether ``port`` can be bound on 127.0.0.1 right now."""
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """A TCP port on 127.0.0.1, free right now, for a server started next."""
    for _ in range(100):
        if is_free(port := candidate_port()):
            return port
    raise OSError("no free TCP port found on 127.0.0.1")


def check_listen(host: str, port: int, flag: str) -> None:
    """InvalidInputError naming ``flag`` unless ``host:port`` can be bound now (port 0 always
    can): a server refuses a taken port before it loads anything."""
    from gnnserve.errors import InvalidInputError

    if port == 0:
        return
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as servers bind
        try:
            s.bind((host, port))
        except OSError as exc:
            raise InvalidInputError(
                f"{flag} {port}: cannot listen on {host}:{port} ({exc.strerror})", flag
            ) from None
