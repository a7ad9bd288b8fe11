"""Ray start-up for every deployment package, in one place.

A deployment that runs workers as Ray actors (DGS, CGP, and the modes to come) calls
:func:`start_ray` before it creates them and :func:`stop_ray` with what it returned when it shuts
down: a Ray instance the caller (a test session, a cluster driver, ``ray start``) already started
is used as it is and left running; one started here is local (no dashboard) and stopped here.

Starting Ray takes seconds. :func:`start_ray_early` begins it in a background thread before the
server loads its store and model (``Executor.start_early``), so both proceed at once; the
deployment's own :func:`start_ray` then waits for that start and owns what it started.
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


_early: list[dict[str, object]] = []  # the start begun by start_ray_early (done, outcome)
_early_lock = threading.Lock()
_never = threading.Event()  # never set: the early-start thread waits on it for good


def start_ray_early(num_cpus: int) -> None:
    """Begin :func:`start_ray` in a background thread (nothing when Ray runs or a start is
    already under way); the next :func:`start_ray` call waits for it and returns its result."""
    with _early_lock:
        if ray.is_initialized() or _early:
            return
        done = threading.Event()
        box: dict[str, object] = {"done": done}

        def run() -> None:
            try:
                box["started"] = _init_ray(num_cpus)
            except BaseException as exc:  # noqa: BLE001 - start_ray reports it
                box["error"] = exc
            done.set()
            # Ray's GCS and raylet die with the thread that started them (PR_SET_PDEATHSIG is
            # per thread): this one lives as long as the process
            _never.wait()

        _early.append(box)
        threading.Thread(target=run, name="gnnserve-ray", daemon=True).start()


def start_ray(num_cpus: int) -> bool:
    """Start a local Ray instance with ``num_cpus`` logical CPUs unless one is running.

    Returns True when it was started here (the caller then stops it with :func:`stop_ray`).
    ``RAY_ADDRESS`` in the environment joins that cluster instead of starting one. A start
    begun by :func:`start_ray_early` is waited for and counts as started here.
    """
    with _early_lock:
        early = _early.pop() if _early else None
    if early is not None:
        done = early["done"]
        assert isinstance(done, threading.Event)
        done.wait()
        _reinstall_signal_handlers()
        if "error" not in early:
            return bool(early["started"])
        log.warning("the early Ray start failed (%s); starting again", early["error"])
    return _init_ray(num_cpus)


def _init_ray(num_cpus: int) -> bool:
    if ray.is_initialized():
        return False
    with _keep_signal_handlers():
        if os.environ.get("RAY_ADDRESS"):
            ray.init(configure_logging=False)
            log.info("joined the Ray cluster at %s", os.environ["RAY_ADDRESS"])
            return True  # our connection: shutting it down leaves the cluster running
        _quiet_notices()
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


_NOTICES = {  # Ray's logger -> the start of a notice it prints on every start here
    # token authentication is on for a new local cluster (Ray's default, kept)
    "ray._private.authentication.authentication_token_setup": "Token authentication is enabled",
    # an early start runs off the main thread: _keep_signal_handlers keeps ours anyway
    "ray._private.worker": "SIGTERM handler is not set because current thread",
}


def _quiet_notices() -> None:
    """Drop the notices of :data:`_NOTICES`, which a server's log need not repeat."""
    for name, prefix in _NOTICES.items():
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropNotice) for f in logger.filters):
            logger.addFilter(_DropNotice(prefix))


def _reinstall_signal_handlers() -> None:
    """Install the current Python SIGTERM/SIGINT handlers again (main thread only): a Ray
    driver started off the main thread installs a native handler over them, which would turn
    a graceful stop into a stack dump."""
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in (signal.SIGTERM, signal.SIGINT):
        handler = signal.getsignal(sig)
        if handler is not None:
            signal.signal(sig, handler)


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
