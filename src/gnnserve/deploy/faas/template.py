"""A warm template process of the ``fork`` launch path (:mod:`.fork`), and its forked children.

``python -m gnnserve.deploy.faas.template ADDRESS TOKEN`` (started by the launcher, with the
socket's key in ``GNNSERVE_FORK_AUTHKEY``) connects back, receives its function (kind, spec)
and warms up: one thread, the runtime imported, the checkpoint loaded, and one request sampled
and inferred on a tiny store written under the deployment's directory (a local ``file://``
store: kernels compile and load, no object-store client starts). Then, for each ``fork``
command, it forks a child that builds its :class:`~gnnserve.deploy.faas.instance.FunctionInstance`
(which enters the instance's cgroups first), connects to the launcher and serves calls until the
connection closes. The template ignores SIGCHLD, so the kernel reaps children that exit.
"""

from __future__ import annotations

import os
import pickle
import signal
import sys
import time
import traceback
from dataclasses import replace
from multiprocessing.connection import Client, Connection
from pathlib import Path
from typing import Any

WARM_NODES = 64  # nodes of the warm-up store


def send(conn: Connection, message: Any) -> None:
    """Send ``message`` with plain pickle (``Connection.send`` pickles tensors as shared-memory
    handles that only a multiprocessing child could open)."""
    conn.send_bytes(pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL))


def recv(conn: Connection) -> Any:
    """Receive a message :func:`send` sent (EOFError when the peer closed)."""
    return pickle.loads(conn.recv_bytes())


def _warm_up(spec: Any, workdir: Path) -> float:
    """Run one request of ``spec``'s shape end to end on a tiny local store; seconds taken."""
    import numpy as np
    import torch

    from gnnserve.data import generators
    from gnnserve.data.writer import write_store
    from gnnserve.deploy.faas.function import InferenceFunction, SampleFunction
    from gnnserve.models.checkpoint import load_checkpoint

    start = time.perf_counter()
    torch.set_num_threads(1)  # no OpenMP team exists when the template forks
    in_dim = load_checkpoint(spec.model).config.in_dim
    store = workdir / f"warm-{os.getpid()}"
    if not (store / "meta.json").exists():
        data = generators.rmat(WARM_NODES, WARM_NODES * 8, feature_dim=in_dim, permute=False)
        write_store(data, store, overwrite=True)
    local = replace(spec, remote=str(store), options={}, memory_mb=0)
    sample = SampleFunction(local)
    request = sample.sample(np.arange(2, dtype=np.int64), rng_seed=0)
    InferenceFunction(local).infer(request)
    return time.perf_counter() - start


def _serve(conn: Connection, instance: Any) -> None:
    """Answer (call id, method, args) messages until the launcher closes the connection."""
    while True:
        try:
            call_id, method, args = recv(conn)
        except (EOFError, OSError):
            return
        try:
            send(conn, (call_id, True, getattr(instance, method)(*args)))
        except Exception as exc:  # noqa: BLE001 - the caller gets it as the call's outcome
            send(conn, (call_id, False, _portable(exc)))


def _portable(exc: BaseException) -> BaseException:
    """``exc`` if it pickles, else a RuntimeError carrying its text."""
    try:
        pickle.dumps(exc)
        return exc
    except Exception:  # noqa: BLE001 - any pickling failure
        return RuntimeError(f"{type(exc).__name__}: {exc}")


def _child(address: str, authkey: bytes, kind: str, spec: Any, name: str, resources: Any) -> None:
    """The forked instance: build, say ready (or why not), serve."""
    from gnnserve.deploy.faas.instance import FunctionInstance

    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    try:
        instance = FunctionInstance(kind, spec, name, resources, forked=True)
    except Exception as exc:  # noqa: BLE001 - reported to the launcher
        conn = Client(address, family="AF_UNIX", authkey=authkey)
        send(conn, ("failed", name, _portable(exc)))
        return
    conn = Client(address, family="AF_UNIX", authkey=authkey)
    send(conn, ("ready", name, instance.ready()))
    _serve(conn, instance)


def _fork(control: Connection, address: str, authkey: bytes, init: tuple[Any, ...]) -> None:
    _, kind, spec, _ = init
    while True:
        try:
            message = recv(control)
        except (EOFError, OSError):
            return
        _, name, resources = message
        pid = os.fork()
        if pid == 0:
            status = 0
            try:
                control.close()  # the template's, not the child's
                _child(address, authkey, kind, spec, name, resources)
            except BaseException:  # noqa: BLE001 - a child never returns into the template loop
                traceback.print_exc()
                status = 1
            finally:
                os._exit(status)
        send(control, ("forked", pid))


def main(argv: list[str]) -> int:
    """Template entry point: ``ADDRESS TOKEN``."""
    address, token = argv
    authkey = bytes.fromhex(os.environ.pop("GNNSERVE_FORK_AUTHKEY"))
    control = Client(address, family="AF_UNIX", authkey=authkey)
    send(control, ("template", token))
    init = recv(control)
    try:
        seconds = _warm_up(init[2], Path(init[3]))
    except Exception as exc:  # noqa: BLE001 - reported to the launcher
        send(control, ("failed", f"{type(exc).__name__}: {exc}"))
        return 1
    send(control, ("warm", seconds))
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    _fork(control, address, authkey, init)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
