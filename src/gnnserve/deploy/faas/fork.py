"""The ``fork`` launch path: instances forked from a warm template process per function.

Beside Ray, not in its actor model: a Ray worker cannot be forked into another actor (its core
worker state, gRPC threads and object-store connection do not survive a fork), and a forked child
cannot register with the raylet as an actor. So each function of a service gets one *template*
process (:mod:`.template`), started at deployment start-up, single-threaded, with the runtime
imported, the model code loaded and every kernel compiled by a synthetic request on a tiny local
store, but no graph data and no object-store client (its Rust runtime's threads would not survive
a fork either). A launch asks the template to fork; the child moves itself into the instance's
memory and CPU cgroups before it touches any data, builds the function from the real store and
connects back to this launcher's Unix socket, over which the pool then calls it. Pages the child
shares with the template stay charged to the template (that memory is shared, not duplicated);
everything the child allocates or writes is charged to the instance.

Everything lives on the launching host, under a per-deployment directory and names; the
launcher removes the directory, the templates and every child when it closes.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from multiprocessing.connection import Connection, Listener
from pathlib import Path
from typing import Any

from gnnserve.deploy.faas.function import FunctionSpec
from gnnserve.deploy.faas.launch import (
    LAUNCHERS,
    InstanceDiedError,
    InstanceHandle,
    Launcher,
    Resources,
    make_groups,
)
from gnnserve.deploy.faas.template import recv, send
from gnnserve.errors import GnnServeError
from gnnserve.tempdirs import sweep_dead

log = logging.getLogger(__name__)
TEMPLATE_START_S = 300.0  # imports and kernel compilation on a cold numba cache
WATCH_S = 0.2  # how often children not connected yet are checked for life


class TemplateError(GnnServeError):
    """A template process failed to start or to fork."""

    kind = "template_failed"


class ForkedInstance(InstanceHandle):
    """A forked child, called over its own connection (one call at a time, as an actor)."""

    def __init__(
        self, name: str, pid: int, groups: list[Any], on_kill: Callable[[str], None]
    ) -> None:
        super().__init__(name)
        self.pid = pid
        self._on_kill = on_kill
        self._groups = groups
        self._conn: Connection | None = None
        self._send = threading.Lock()
        self._ids = itertools.count()
        self._pending: dict[int, Future[Any]] = {}
        self._ready: Future[Any] = Future()
        self._dead = False

    def attach(self, conn: Connection, startup: Any) -> None:
        """The child connected and built its function: start reading its answers."""
        self._conn = conn
        threading.Thread(target=self._read, name=f"fork-{self.name}", daemon=True).start()
        self._ready.set_result(startup)

    def fail_start(self, error: BaseException) -> None:
        """The child could not build its function."""
        if not self._ready.done():
            self._ready.set_exception(error)

    def call(self, method: str, *args: Any) -> Future[Any]:
        if method == "ready":
            return self._ready
        future: Future[Any] = Future()
        call_id = next(self._ids)
        with self._send:
            if self._dead or self._conn is None:
                future.set_exception(InstanceDiedError(f"instance {self.name} is gone", "instance"))
                return future
            self._pending[call_id] = future
            try:
                send(self._conn, (call_id, method, args))
            except OSError:
                self._pending.pop(call_id, None)
                future.set_exception(InstanceDiedError(f"instance {self.name} is gone", "instance"))
        return future

    def _read(self) -> None:
        assert self._conn is not None
        while True:
            try:
                call_id, ok, value = recv(self._conn)
            except (EOFError, OSError):
                break
            future = self._pending.pop(call_id, None)
            if future is not None:
                future.set_result(value) if ok else future.set_exception(value)
        self._died("its process exited")

    def _died(self, why: str) -> None:
        with self._send:
            self._dead = True
            pending, self._pending = self._pending, {}
        error = InstanceDiedError(f"instance {self.name} died: {why}", "instance")
        for future in pending.values():
            future.set_exception(error)
        self.fail_start(error)

    def _stop(self) -> None:
        self._on_kill(self.name)
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)
        if self._conn is not None:
            with contextlib.suppress(OSError):
                self._conn.close()


class _Template:
    """One function's template process and its control connection."""

    def __init__(self, process: subprocess.Popen[bytes], conn: Connection) -> None:
        self.process = process
        self.conn = conn
        self.lock = threading.Lock()

    def fork(self, name: str, resources: Resources) -> int:
        with self.lock:
            send(self.conn, ("fork", name, resources))
            answer = recv(self.conn)
        if answer[0] != "forked":
            raise TemplateError(f"the template could not fork {name}: {answer[1]}", "launch")
        return int(answer[1])

    def stop(self) -> None:
        with contextlib.suppress(OSError):
            self.conn.close()
        self.process.kill()
        self.process.wait(10)


@LAUNCHERS.register("fork")
class ForkLauncher(Launcher):
    """Forks instances from warm templates (one per function kind and spec)."""

    def __init__(self, tag: str) -> None:
        super().__init__(tag)
        sweep_dead("faas")  # the sockets and scratch of deployments killed outright
        self.dir = Path(tempfile.mkdtemp(prefix=f"gnnserve-faas-{tag}-"))  # tag: p<pid>-<id>
        self.address = str(self.dir / "instances.sock")
        self._authkey = secrets.token_bytes(16)
        self._listener = Listener(self.address, family="AF_UNIX", authkey=self._authkey)
        self._templates: dict[tuple[str, str], Future[_Template]] = {}
        self._waiting: dict[str, Future[Connection]] = {}
        self._children: dict[str, ForkedInstance] = {}  # forked, not connected yet
        self._early: dict[str, tuple[Connection, tuple[Any, ...]]] = {}  # connected first
        self._live: dict[str, ForkedInstance] = {}  # until killed
        self._lock = threading.Lock()
        self._closed = False
        threading.Thread(target=self._accept, name="fork-accept", daemon=True).start()
        threading.Thread(target=self._watch, name="fork-watch", daemon=True).start()

    def prepare(self, kind: str, spec: FunctionSpec) -> None:
        """Start the template of (``kind``, ``spec``) unless it runs (warm-up goes on in the
        background; :meth:`wait_ready` waits for every template)."""
        self._template_future(kind, spec)

    def wait_ready(self) -> None:
        """Block until every template prepared so far is warm (TemplateError if one failed)."""
        with self._lock:
            pending = list(self._templates.values())
        for future in pending:
            future.result()

    def launch(
        self, kind: str, spec: FunctionSpec, name: str, resources: Resources
    ) -> InstanceHandle:
        template = self._template_future(kind, spec).result()
        groups = make_groups(name, resources)
        pid = template.fork(name, resources)
        child = ForkedInstance(name, pid, groups, self._forget)
        with self._lock:
            self._live[name] = child
            early = self._early.pop(name, None)
            if early is None:
                self._children[name] = child
        if early is not None:
            self._deliver(child, *early)
        return child

    def _template_future(self, kind: str, spec: FunctionSpec) -> Future[_Template]:
        key = (kind, repr(spec))
        with self._lock:
            found = self._templates.get(key)
            if found is None:
                found = self._templates[key] = Future()
                token = f"template-{kind}-{len(self._templates)}"
                waiting: Future[Connection] = Future()
                self._waiting[token] = waiting
                threading.Thread(
                    target=self._start_template,
                    args=(kind, spec, token, waiting, found),
                    name=f"fork-template-{kind}",
                    daemon=True,
                ).start()
        return found

    def _start_template(
        self,
        kind: str,
        spec: FunctionSpec,
        token: str,
        waiting: Future[Connection],
        out: Future[_Template],
    ) -> None:
        env = {**os.environ, "GNNSERVE_FORK_AUTHKEY": self._authkey.hex()}
        # numba's GNU OpenMP layer aborts a fork after any parallel kernel ran (a full-fetch
        # warm-up loads a store with parallel kernels); its workqueue layer is fork-safe, and an
        # instance runs one call at a time, so it needs no thread-safe layer
        env["NUMBA_THREADING_LAYER"] = "forksafe"
        argv = [sys.executable, "-m", "gnnserve.deploy.faas.template", self.address, token]
        process = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL)
        try:
            conn = waiting.result(TEMPLATE_START_S)
            send(conn, ("init", kind, spec, str(self.dir)))
            answer = recv(conn)
        except Exception as exc:  # noqa: BLE001 - reported through the future
            process.kill()
            out.set_exception(TemplateError(f"the {kind} template did not start: {exc}", "launch"))
            return
        if answer[0] != "warm":
            process.kill()
            error = f"the {kind} template failed to warm up: {answer[1]}"
            out.set_exception(TemplateError(error, "launch"))
            return
        log.info("faas %s template pid %d warm in %.2f s", kind, process.pid, answer[1])
        out.set_result(_Template(process, conn))

    def _accept(self) -> None:
        while True:
            try:
                conn = self._listener.accept()
                hello = recv(conn)
            except (OSError, EOFError):
                if self._closed:
                    return
                continue
            self._route(conn, hello)

    def _watch(self) -> None:
        """Fail the start of children that died before connecting (e.g. OOM-killed while they
        load): no connection will ever close for them. The template lets the kernel reap its
        children, so a dead child's pid is gone at once."""
        while not self._closed:
            time.sleep(WATCH_S)
            with self._lock:
                waiting = list(self._children.values())
            for child in waiting:
                try:
                    os.kill(child.pid, 0)
                except ProcessLookupError:
                    with self._lock:
                        self._children.pop(child.name, None)
                    child.fail_start(
                        InstanceDiedError(f"instance {child.name} died while starting", "instance")
                    )

    def _route(self, conn: Connection, hello: tuple[Any, ...]) -> None:
        """A template says ("template", token); a child ("ready", name, startup) or
        ("failed", name, error), possibly before :meth:`launch` has registered it."""
        with self._lock:
            if hello[0] == "template":
                waiting = self._waiting.pop(hello[1], None)
                if waiting is not None:
                    waiting.set_result(conn)
                return
            child = self._children.pop(hello[1], None)
            if child is None:
                self._early[hello[1]] = (conn, hello)
                return
        self._deliver(child, conn, hello)

    @staticmethod
    def _deliver(child: ForkedInstance, conn: Connection, hello: tuple[Any, ...]) -> None:
        if hello[0] == "ready":
            child.attach(conn, hello[2])
        else:
            child.fail_start(hello[2])
            conn.close()

    def _forget(self, name: str) -> None:
        with self._lock:
            self._live.pop(name, None)
            self._children.pop(name, None)

    def close(self) -> None:
        self._closed = True
        with self._lock:
            children = list(self._live.values())
            templates, self._templates = list(self._templates.values()), {}
        for child in children:
            child.kill()
        for future in templates:
            with contextlib.suppress(Exception):
                future.result(TEMPLATE_START_S).stop()
        with contextlib.suppress(OSError):
            self._listener.close()
        shutil.rmtree(self.dir, ignore_errors=True)
