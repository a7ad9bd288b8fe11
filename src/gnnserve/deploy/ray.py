"""Ray start-up for every deployment package, in one place.

A deployment that runs workers as Ray actors (DGS, CGP, and the modes to come) calls
:func:`start_ray` before it creates them and :func:`stop_ray` with what it returned when it shuts
down: a Ray instance the caller (a test session, a cluster driver, ``ray start``) already started
is used as it is and left running; one started here is local (no dashboard) and stopped here.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import ray

log = logging.getLogger(__name__)


def start_ray(num_cpus: int) -> bool:
    """Start a local Ray instance with ``num_cpus`` logical CPUs unless one is running.

    Returns True when it was started here (the caller then stops it with :func:`stop_ray`).
    ``RAY_ADDRESS`` in the environment joins that cluster instead of starting one.
    """
    if ray.is_initialized():
        return False
    with _keep_signal_handlers():
        if os.environ.get("RAY_ADDRESS"):
            ray.init(configure_logging=False)
            log.info("joined the Ray cluster at %s", os.environ["RAY_ADDRESS"])
            return True  # our connection: shutting it down leaves the cluster running
        _quiet_token_auth_notice()
        ray.init(num_cpus=num_cpus, include_dashboard=False, configure_logging=False)
    log.info("started a local Ray instance with %d logical CPUs", num_cpus)
    return True


class _DropNotice(logging.Filter):
    """Drops log records whose message starts with ``prefix``."""

    def __init__(self, prefix: str) -> None:
        super().__init__()
        self.prefix = prefix

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(self.prefix)


def _quiet_token_auth_notice() -> None:
    """Ray turns token authentication on for a new local cluster (its default, kept) and warns
    that it did on every start, which a server's log need not repeat: drop that one notice."""
    logger = logging.getLogger("ray._private.authentication.authentication_token_setup")
    if not any(isinstance(f, _DropNotice) for f in logger.filters):
        logger.addFilter(_DropNotice("Token authentication is enabled for this Ray cluster"))


@contextmanager
def _keep_signal_handlers() -> Iterator[None]:
    """Restore SIGTERM/SIGINT handlers after ``ray.init``: a driver's ``ray.init`` installs its
    own (exit at once), which would cut the server's graceful shutdown short."""
    if threading.current_thread() is not threading.main_thread():
        yield  # ray.init installs none off the main thread
        return
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in saved.items():
            if handler is not None:
                signal.signal(sig, handler)


def stop_ray(started_here: bool) -> None:
    """Stop the Ray instance (or the connection) when :func:`start_ray` started it."""
    if started_here and ray.is_initialized():
        ray.shutdown()
