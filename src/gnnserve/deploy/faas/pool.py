"""FunctionPool: the instances of one function driven by the scheduler.

A pool turns :mod:`~gnnserve.deploy.faas.scheduler` decisions into instance calls
(:class:`~gnnserve.deploy.faas.launch.InstanceHandle`, whichever launch path made it): ``Launch``
starts an instance (a cold start) and asks it ``ready``; ``Run`` calls the function on a warm
one; ``Stop`` kills one (keep-alive expiry: scale to zero). Every scheduler event (arrival,
announcement, ready, done, failure, keep-alive tick) is handled on one reactor thread, so the
scheduler needs no lock; completion callbacks only enqueue events. When an instance dies (OOM-killed
by its cgroup, crashed) while running a request, the request runs once more on another instance,
in its arrival place; only if that one dies too does it fail with :class:`InstanceFailedError`.

Instance memory is billed as a FaaS platform bills it: configured capacity x lifetime (GB·s),
from the launch until the stop.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from gnnserve.deploy.faas.launch import InstanceDiedError, InstanceHandle, KilledForMemoryError
from gnnserve.deploy.faas.scheduler import Launch, Run, Scheduler, Stop
from gnnserve.errors import GnnServeError, NeedsMoreMemoryError, WorkerFailedError

log = logging.getLogger(__name__)

MAX_START_FAILURES = 2  # consecutive failed cold starts before waiting requests fail
InstanceFactory = Callable[[int], InstanceHandle]  # instance id -> a starting instance


class InstanceFailedError(WorkerFailedError):
    """The instance running a request died (killed for memory, crashed): HTTP 503 with a
    ``Retry-After`` hint (the pool replaces the instance)."""

    kind = "instance_failed"


@dataclass
class PoolStats:
    """What a pool did, for metrics and the benchmark (times in seconds)."""

    cold_starts: int = 0  # instances launched
    cold_start_s: list[float] = field(default_factory=list)  # launch -> ready, per instance
    failures: int = 0  # instances that died
    oom_kills: int = 0  # of them, killed by the kernel for memory (their cgroup says so)
    retries: int = 0  # requests run again after their instance died
    gb_seconds: float = 0.0  # capacity x lifetime of stopped instances (running ones: live_gb_s)
    completed: int = 0  # requests answered
    launched_at: list[float] = field(default_factory=list)  # monotonic s of each launch
    done_at: list[float] = field(default_factory=list)  # monotonic s of each answer


@dataclass
class _Instance:
    handle: InstanceHandle
    launched_s: float
    ready_s: float | None = None


class FunctionPool:
    """Instances of one function: ``factory(i)`` starts instance i, ``method`` is the function it
    runs on a request's payload, ``memory_gb`` each instance's capacity (for GB·s)."""

    def __init__(
        self,
        name: str,
        factory: InstanceFactory,
        method: str,
        scheduler: Scheduler,
        memory_gb: float,
        tick_s: float = 0.5,
    ) -> None:
        self.name = name
        self.scheduler = scheduler
        self.stats = PoolStats()
        self._factory = factory
        self._method = method
        self._memory_gb = memory_gb
        self._tick_s = tick_s
        self._instances: dict[int, _Instance] = {}
        self._requests: dict[int, tuple[Any, Future[Any]]] = {}
        self._next_request = 0
        self._id_lock = threading.Lock()
        self._events: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._react, name=f"faas-{name}", daemon=True)
        self._closed = False
        self._start_failures = 0  # consecutive failed cold starts
        self._retried: set[int] = set()  # requests already run again once
        self._events.put(("tick", None))  # at once: launches the scheduler's min_instances
        self._thread.start()

    # public -----------------------------------------------------------------------------
    def submit(self, payload: Any, expected: bool = False) -> Future[Any]:
        """Run the function on ``payload`` on some instance; the future holds its result.
        ``expected``: the request was announced by :meth:`expect`."""
        future: Future[Any] = Future()
        with self._id_lock:
            if self._closed:
                raise RuntimeError(f"pool {self.name} is shut down")
            request = self._next_request
            self._next_request += 1
        self._events.put(("arrive", (request, payload, future, expected)))
        return future

    def expect(self) -> None:
        """Announce a request that an earlier stage is preparing: the pool launches for it now
        if its arrival would (its cold start overlaps the earlier stage)."""
        self._events.put(("expect", None))

    def unexpect(self) -> None:
        """The announced request will not come (its earlier stage failed)."""
        self._events.put(("unexpect", None))

    def shutdown(self, timeout_s: float = 30.0) -> None:
        """Stop every instance and the reactor; requests still waiting fail."""
        with self._id_lock:
            self._closed = True
        self._events.put(("shutdown", None))
        self._thread.join(timeout_s)

    def ask_warm(self, method: str, timeout_s: float = 60.0) -> list[Any]:
        """Call ``method`` (no arguments) on every warm instance; their answers."""
        handles = [i.handle for i in list(self._instances.values()) if i.ready_s is not None]
        return [f.result(timeout_s) for f in [h.call(method) for h in handles]]

    def wait_warm(self, count: int, timeout_s: float) -> bool:
        """Wait until ``count`` instances are warm (True) or ``timeout_s`` passed (False)."""
        deadline = time.monotonic() + timeout_s
        while self.warm < count:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)
        return True

    @property
    def warm(self) -> int:
        """Instances that finished their cold start."""
        return sum(i.ready_s is not None for i in list(self._instances.values()))

    @property
    def size(self) -> int:
        """Instances alive (starting or warm)."""
        return len(self._instances)

    def live_gb_seconds(self) -> float:
        """GB·s billed so far, running instances included."""
        now = time.monotonic()
        live = sum(now - inst.launched_s for inst in list(self._instances.values()))
        return self.stats.gb_seconds + live * self._memory_gb

    # reactor ----------------------------------------------------------------------------
    def _react(self) -> None:
        next_tick = time.monotonic() + self._tick_s
        while True:
            try:
                kind, data = self._events.get(timeout=max(0.0, next_tick - time.monotonic()))
            except queue.Empty:
                kind, data = "tick", None
            now = time.monotonic()
            if kind == "shutdown":
                self._shutdown(now)
                return
            try:
                self._execute(self._handle(kind, data, now), now)
            except Exception:  # noqa: BLE001 - the reactor must survive a bad event
                log.exception("faas pool %s: event %s failed", self.name, kind)
            if now >= next_tick:
                next_tick = now + self._tick_s

    def _handle(self, kind: str, data: Any, now: float) -> list[Launch | Run | Stop]:
        sched = self.scheduler
        if kind == "arrive":
            request, payload, future, expected = data
            self._requests[request] = (payload, future)
            return sched.arrive(request, now, expected)
        if kind == "expect":
            return sched.expect(now)
        if kind == "unexpect":
            sched.unexpect()
            return []
        if kind == "ready":
            instance, outcome = data
            if isinstance(outcome, BaseException):
                return self._failed_start(instance, outcome, now)
            self._start_failures = 0
            self._instances[instance].ready_s = now
            self.stats.cold_start_s.append(now - self._instances[instance].launched_s)
            return sched.ready(instance, now)
        if kind == "done":
            instance, request, outcome = data
            if isinstance(outcome, InstanceDiedError):
                return self._fail(instance, outcome, now)
            payload_future = self._requests.pop(request, None)
            self._retried.discard(request)
            if payload_future is not None:
                _settle(payload_future[1], outcome)
                self.stats.completed += 1
                self.stats.done_at.append(now)
            return sched.done(instance, now)
        return sched.tick(now)

    def _failed_start(
        self, instance: int, cause: BaseException, now: float
    ) -> list[Launch | Run | Stop]:
        """A cold start failed. Twice in a row: the waiting requests fail with the reason
        instead of waiting for replacements that would fail the same way."""
        self._start_failures += 1
        if self._start_failures >= MAX_START_FAILURES:
            error = InstanceFailedError(
                f"{self.name} instances fail to start ({_reason(cause)})", "instance"
            )
            for request in self.scheduler.drop_waiting():
                entry = self._requests.pop(request, None)
                if entry is not None and not entry[1].done():
                    entry[1].set_exception(error)
        return self._fail(instance, cause, now)

    def _fail(self, instance: int, cause: BaseException, now: float) -> list[Launch | Run | Stop]:
        self.stats.failures += 1
        inst = self._instances.get(instance)
        if inst is not None and inst.handle.oom_kills():
            self.stats.oom_kills += 1
            cause = KilledForMemoryError(
                f"killed for memory: over its --memory-mb limit ({self._memory_gb * 1024:.0f} MB)",
                "instance",
            )
        log.warning("faas pool %s: instance %d died: %s", self.name, instance, cause)
        self._retire(instance, now)
        outcome = self.scheduler.failed(instance, now)
        actions = list(outcome.actions)
        for request in outcome.failed:
            if request not in self._retried and request in self._requests:
                self._retried.add(request)  # once more, on another instance
                self.stats.retries += 1
                actions += self.scheduler.arrive(request, now)
                continue
            self.scheduler.forget(request)
            self._retried.discard(request)
            entry = self._requests.pop(request, None)
            if entry is not None:
                entry[1].set_exception(self._died_twice(cause))
        return actions

    def _died_twice(self, cause: BaseException) -> GnnServeError:
        """The error of a request whose second instance died too: a memory kill says the
        request needs more memory (retrying cannot help), anything else asks for a retry."""
        if isinstance(cause, KilledForMemoryError):
            return NeedsMoreMemoryError(
                f"the {self.name} instances running this request were killed for memory twice: "
                f"it needs more than --memory-mb {self._memory_gb * 1024:.0f} MB (runtime and "
                "model included); raise --memory-mb or send fewer nodes per request",
                "memory_mb",
            )
        return InstanceFailedError(
            f"the {self.name} instances running this request died twice "
            f"({_reason(cause)}); retry later",
            "instance",
        )

    def _execute(self, actions: list[Launch | Run | Stop], now: float) -> None:
        for action in actions:
            if isinstance(action, Launch):
                self._launch(action.instance, now)
            elif isinstance(action, Run):
                self._run(action.instance, action.request)
            else:
                self._retire(action.instance, now)

    def _launch(self, instance: int, now: float) -> None:
        self.stats.cold_starts += 1
        self.stats.launched_at.append(now)
        try:
            handle = self._factory(instance)
        except Exception as exc:  # noqa: BLE001 - a launch that fails is a failed cold start
            self._events.put(("ready", (instance, exc)))
            return
        self._instances[instance] = _Instance(handle, now)
        handle.call("ready").add_done_callback(
            lambda f: self._events.put(("ready", (instance, _outcome(f))))
        )

    def _run(self, instance: int, request: int) -> None:
        payload, _ = self._requests[request]
        self._instances[instance].handle.call(self._method, payload).add_done_callback(
            lambda f: self._events.put(("done", (instance, request, _outcome(f))))
        )

    def _retire(self, instance: int, now: float) -> None:
        inst = self._instances.pop(instance, None)
        if inst is None:
            return
        self.stats.gb_seconds += (now - inst.launched_s) * self._memory_gb
        with contextlib.suppress(Exception):  # already dead
            inst.handle.kill()

    def _shutdown(self, now: float) -> None:
        for instance in list(self._instances):
            self._retire(instance, now)
        for _, future in self._requests.values():
            if not future.done():
                future.set_exception(RuntimeError(f"pool {self.name} shut down"))
        self._requests.clear()


def _outcome(future: Future[Any]) -> Any:
    """A call's result, or the exception it raised."""
    try:
        return future.result()
    except BaseException as exc:  # noqa: BLE001 - handed to the reactor as a value
        return exc


def _settle(future: Future[Any], outcome: Any) -> None:
    if future.done():
        return
    if isinstance(outcome, BaseException):
        future.set_exception(outcome)
    else:
        future.set_result(outcome)


def _reason(cause: BaseException) -> str:
    """What a client may read of ``cause``: the message of gnnserve's own errors (they name
    fields and limits, not processes); for anything else (Ray's actor errors carry pids,
    addresses, actor ids and terminal colour codes) its type, the details being in the log."""
    if isinstance(cause, GnnServeError) and not isinstance(cause, InstanceDiedError):
        text = cause.message.strip().splitlines()
        return text[0][:200] if text else type(cause).__name__
    if isinstance(cause, InstanceDiedError):
        return "the instance process died; the server log has the cause"
    return f"{type(cause).__name__}; the server log has the details"
