"""The load-aware request scheduler of FaaS-GNN (§4.4) and the platform's naive policy (§3.4.2).

Pure, synchronous decision logic: events in (a request arrives, an instance finishes its cold
start or its request, dies, time passes), actions out (:class:`Launch` a cold instance,
:class:`Run` a request on a warm one, :class:`Stop` an idle one), in the order to execute them.
Time is passed in as ``now`` (seconds, any monotonic origin), so tests drive it with a fake
clock; :class:`~gnnserve.deploy.faas.pool.FunctionPool` executes the actions on Ray actors.
Instance ids are assigned here (0, 1, 2, ...); request ids come from the caller.

``load_aware`` (§4.4, Figure 11):
- every warm instance has a FCFS queue;
- on arrival, launch a new instance only when ``n_req > n_container`` (requests waiting or
  running, the new one counted, vs instances warm or starting) and no instance is idle;
- the request then runs on the idle instance that became idle last (ties: lowest id), else joins
  the queue of the warm instance with the shortest queue (ties: lowest id), else (nothing warm)
  the temporary queue;
- an instance that finishes a request or its cold start runs whichever arrived first of its own
  queue's front and the temporary queue's head (at the instance cap both may hold requests:
  serving its own queue first would let later arrivals overtake earlier ones); with both empty it
  steals from the longest queue (ties: lowest id). It steals that queue's *front*, where §4.4
  takes the tail: the load moved is the same, and no queue is ever served out of arrival order.

``naive`` (the platform default): an idle instance runs the request; otherwise a new instance is
launched for it and the request waits for that instance's cold start (no queues, no steals). At
``max_instances`` the request waits in the temporary queue for the next instance to go idle.

Both: an instance idle for ``keep_alive_s`` or longer is stopped by :meth:`Scheduler.tick`.
:meth:`Scheduler.expect` announces a request still in an earlier stage (sampling, for the
inference function): the launch its arrival would decide happens now, so its cold start overlaps
the earlier stage instead of following it.
"""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass, field

from gnnserve.errors import InvalidInputError

STATES = ("starting", "idle", "busy")


@dataclass(frozen=True)
class Launch:
    """Start instance ``instance`` (a cold start); report :meth:`Scheduler.ready` when warm."""

    instance: int


@dataclass(frozen=True)
class Run:
    """Run ``request`` on warm instance ``instance``; report :meth:`Scheduler.done` after."""

    instance: int
    request: int


@dataclass(frozen=True)
class Stop:
    """Stop idle instance ``instance`` (its keep-alive expired)."""

    instance: int


Action = Launch | Run | Stop


@dataclass(frozen=True)
class Failure:
    """What :meth:`Scheduler.failed` decided.

    ``failed``: the request the dead instance was running (empty if it was starting or idle);
    it is lost with the instance and forgotten here: the caller answers it with an error.
    ``actions``: what to execute next (its waiting requests placed again, a replacement).
    """

    failed: list[int]
    actions: list[Action]


@dataclass(frozen=True)
class SchedulerView:
    """A read-only snapshot for metrics and tests."""

    instances: dict[str, int]  # count per state in STATES
    queue_lengths: dict[int, int]  # requests queued per warm instance
    temporary: int  # requests waiting for any instance to go idle
    reserved: int  # naive: requests waiting for the cold start of their own instance
    launches: int  # cold starts so far
    steals: int  # requests taken from the tail of another instance's queue
    runs: int  # Run actions so far
    stops: int  # keep-alive expiries so far
    n_requests: int  # waiting or running
    n_containers: int  # starting or warm


@dataclass
class _Instance:
    state: str  # one of STATES
    queue: deque[int] = field(default_factory=deque)
    running: int | None = None
    idle_since: float = 0.0  # seconds, when it last went idle
    reserved: int | None = None  # naive: the request it was launched for
    announced: bool = False  # naive: launched for an announced request not arrived yet


class Policy:
    """Where an arriving request goes and what an instance that went idle takes."""

    def prelaunch(self, s: Scheduler, now: float) -> list[Action]:
        """Launch for an announced request (already counted in ``s.expected``) if needed."""
        raise NotImplementedError

    def place(self, s: Scheduler, request: int, now: float) -> list[Action]:
        """Place ``request`` (already counted in ``s.n_requests``)."""
        raise NotImplementedError

    def take_work(self, s: Scheduler, instance: int) -> Run | None:
        """The request idle ``instance`` (own queue empty) runs now, or None to stay idle."""
        raise NotImplementedError


class LoadAware(Policy):
    """FaaS-GNN §4.4: launch only when ``n_req > n_container``; queue on warm instances; steal."""

    def place(self, s: Scheduler, request: int, now: float) -> list[Action]:
        idle = s._latest_idle()
        actions: list[Action] = []
        if idle is None and s.n_requests > s.n_containers and s._may_launch():
            actions.append(s._launch())
        if idle is not None:
            actions.append(s._run(idle, request))
            return actions
        warm = [i for i, x in s._instances.items() if x.state != "starting"]
        if warm:
            shortest = min(warm, key=lambda i: (len(s._instances[i].queue), i))
            s._enqueue(s._instances[shortest].queue, request)
        else:
            s._enqueue(s._temporary, request)
        return actions

    def prelaunch(self, s: Scheduler, now: float) -> list[Action]:
        if s.n_requests + s.expected > s.n_containers and s._may_launch():
            return [s._launch()]
        return []

    def take_work(self, s: Scheduler, instance: int) -> Run | None:
        own = s._instances[instance].queue
        if own or s._temporary:
            if own and (not s._temporary or s._seq[own[0]] < s._seq[s._temporary[0]]):
                return s._run(instance, own.popleft())
            return s._run(instance, s._temporary.popleft())
        queued = [(-len(x.queue), i) for i, x in s._instances.items() if x.queue]
        if not queued:
            return None
        victim = min(queued)[1]  # longest queue, lowest id on ties
        s._count["steals"] += 1
        return s._run(instance, s._instances[victim].queue.popleft())


class Naive(Policy):
    """§3.4.2: run on an idle instance, else launch one for the request and wait for it."""

    def prelaunch(self, s: Scheduler, now: float) -> list[Action]:
        held = sum(x.state == "idle" or x.announced for x in s._instances.values())
        if held >= s.expected or not s._may_launch():
            return []
        launch = s._launch()
        s._instances[launch.instance].announced = True
        return [launch]

    def place(self, s: Scheduler, request: int, now: float) -> list[Action]:
        idle = s._latest_idle()
        if idle is not None:
            return [s._run(idle, request)]
        for inst in s._instances.values():
            if inst.announced:  # launched for an announced request: this one
                inst.announced, inst.reserved = False, request
                return []
        if not s._may_launch():
            s._enqueue(s._temporary, request)
            return []
        launch = s._launch()
        s._instances[launch.instance].reserved = request
        return [launch]

    def take_work(self, s: Scheduler, instance: int) -> Run | None:
        inst = s._instances[instance]
        inst.announced = False  # idle now: the announced request takes it on arrival
        if inst.reserved is not None:
            request, inst.reserved = inst.reserved, None
            return s._run(instance, request)
        return s._run(instance, s._temporary.popleft()) if s._temporary else None


POLICIES: dict[str, type[Policy]] = {"load_aware": LoadAware, "naive": Naive}


class Scheduler:
    """Decides launches, placements and stops for the instances of one function.

    ``policy``: a key of :data:`POLICIES`; ``keep_alive_s``: idle seconds before a stop;
    ``max_instances``: cap on instances starting or warm (None: no cap); ``min_instances``:
    instances kept alive with no traffic (launched on the first tick, never stopped below).
    """

    def __init__(
        self,
        policy: str = "load_aware",
        keep_alive_s: float = 600.0,
        max_instances: int | None = None,
        min_instances: int = 0,
    ) -> None:
        if policy not in POLICIES:
            raise InvalidInputError(
                f"unknown scheduler policy {policy!r}; choose one of {sorted(POLICIES)}", "policy"
            )
        if not keep_alive_s > 0:
            raise InvalidInputError(f"keep_alive_s must be > 0, got {keep_alive_s}", "keep_alive_s")
        if max_instances is not None and max_instances < 1:
            raise InvalidInputError(
                f"max_instances must be >= 1 or None, got {max_instances}", "max_instances"
            )
        if not 0 <= min_instances <= (max_instances or min_instances):
            raise InvalidInputError(
                f"min_instances must lie in [0, max_instances], got {min_instances} "
                f"(max_instances {max_instances})",
                "min_instances",
            )
        self.policy = policy
        self.min_instances = int(min_instances)
        self.keep_alive_s = float(keep_alive_s)
        self.max_instances = max_instances
        self._policy = POLICIES[policy]()
        self._instances: dict[int, _Instance] = {}  # insertion order == id order
        self._temporary: deque[int] = deque()
        self._live: set[int] = set()  # requests waiting or running
        self._seq: dict[int, int] = {}  # arrival order of requests not finished (kept on retry)
        self._arrivals = 0
        self.expected = 0  # announced requests not arrived yet (expect)
        self._next_id = 0
        self._count: Counter[str] = Counter()

    # read-only views ------------------------------------------------------------------------
    @property
    def n_requests(self) -> int:
        """Requests waiting anywhere or running (§4.4 ``n_req``)."""
        return len(self._live)

    @property
    def n_containers(self) -> int:
        """Instances starting or warm (§4.4 ``n_container``)."""
        return len(self._instances)

    @property
    def launches(self) -> int:
        """Cold starts decided so far."""
        return self._count["launches"]

    @property
    def steals(self) -> int:
        """Requests re-scheduled from the tail of another instance's queue so far."""
        return self._count["steals"]

    @property
    def runs(self) -> int:
        """Run actions so far."""
        return self._count["runs"]

    @property
    def stops(self) -> int:
        """Keep-alive expiries so far."""
        return self._count["stops"]

    def view(self) -> SchedulerView:
        """Counts per state, queue lengths, counters, ``n_requests`` and ``n_containers``."""
        states = dict.fromkeys(STATES, 0)
        for inst in self._instances.values():
            states[inst.state] += 1
        queues = {i: len(x.queue) for i, x in self._instances.items() if x.state != "starting"}
        reserved = sum(x.reserved is not None for x in self._instances.values())
        c = self._count
        return SchedulerView(
            states, queues, len(self._temporary), reserved, c["launches"], c["steals"],
            c["runs"], c["stops"], self.n_requests, self.n_containers,
        )  # fmt: skip

    # events ---------------------------------------------------------------------------------
    def expect(self, now: float) -> list[Action]:
        """A request will arrive soon (its earlier stage runs now): launch for it at once if
        its arrival would launch. Each call is matched by one ``arrive(..., expected=True)`` or
        one :meth:`unexpect`."""
        self.expected += 1
        return self._policy.prelaunch(self, now)

    def unexpect(self) -> None:
        """An announced request will not arrive (its earlier stage failed)."""
        self.expected = max(0, self.expected - 1)

    def arrive(self, request: int, now: float, expected: bool = False) -> list[Action]:
        """Request ``request`` arrived at ``now`` (s); ids must not repeat while it is live.
        ``expected``: it was announced by :meth:`expect`. A request arriving again after its
        instance died (a retry) keeps its place in the arrival order."""
        if request in self._live:
            raise InvalidInputError(f"request {request} is already waiting or running", "request")
        if expected:
            self.unexpect()
        self._live.add(request)
        if request not in self._seq:
            self._seq[request] = self._arrivals
            self._arrivals += 1
        return self._policy.place(self, request, now)

    def forget(self, request: int) -> None:
        """The caller gave up on a request :meth:`failed` reported (no retry)."""
        self._seq.pop(request, None)

    def waiting(self) -> dict[int, str]:
        """Each waiting request and where: ``temporary``, ``queue:<instance>`` or
        ``reserved:<instance>`` (for tests and debugging)."""
        where = {r: "temporary" for r in self._temporary}
        for i, inst in self._instances.items():
            where.update({r: f"queue:{i}" for r in inst.queue})
            if inst.reserved is not None:
                where[inst.reserved] = f"reserved:{i}"
        return where

    def arrival_order(self, request: int) -> int:
        """The position of ``request`` in the arrival order (0 first)."""
        return self._seq[request]

    def ready(self, instance: int, now: float) -> list[Action]:
        """``instance`` finished its cold start at ``now`` (s): it goes idle and takes work."""
        self._get(instance, "ready", "starting")
        return self._went_idle(instance, now)

    def done(self, instance: int, now: float) -> list[Action]:
        """``instance`` finished its request at ``now`` (s): it takes its next work."""
        inst = self._get(instance, "done", "busy")
        if inst.running is not None:  # always set while busy
            self._live.discard(inst.running)
            self._seq.pop(inst.running, None)
        inst.running = None
        return self._went_idle(instance, now)

    def failed(self, instance: int, now: float) -> Failure:
        """``instance`` died at ``now`` (s) in any state; it is removed.

        Its running request is reported in :attr:`Failure.failed`; its waiting requests (naive:
        the one it was launched for; load_aware: its queue, in order) are placed again by the
        arrival rules; if requests still wait and no instance is left, a replacement launches.
        """
        inst = self._get(instance, "failed")
        del self._instances[instance]
        lost = [] if inst.running is None else [inst.running]
        self._live.difference_update(lost)
        pending = ([] if inst.reserved is None else [inst.reserved]) + list(inst.queue)
        actions: list[Action] = []
        for request in pending:
            actions += self._policy.place(self, request, now)
        if self._temporary and not self._instances:
            actions.append(self._launch())  # e.g. the only instance died in its cold start
        return Failure(lost, actions)

    def drop_waiting(self) -> list[int]:
        """Remove every request not running yet (queues, temporary queue, reservations) and
        return them: the caller fails them (e.g. instances keep failing to start)."""
        dropped = list(self._temporary)
        self._temporary.clear()
        for inst in self._instances.values():
            if inst.reserved is not None:
                dropped.append(inst.reserved)
                inst.reserved = None
            dropped += inst.queue
            inst.queue.clear()
        self._live.difference_update(dropped)  # no longer counted in n_requests
        for request in dropped:
            self._seq.pop(request, None)
        return dropped

    def tick(self, now: float) -> list[Action]:
        """Stop (ascending ids) every instance idle for ``keep_alive_s`` or longer at ``now``,
        but the ``min_instances`` most recently idle; launch up to ``min_instances``."""
        expired = [
            i
            for i, x in self._instances.items()
            if x.state == "idle" and now - x.idle_since >= self.keep_alive_s
        ]
        spare = max(0, self.min_instances - (len(self._instances) - len(expired)))
        if spare:
            by_idle = sorted(expired, key=lambda i: (self._instances[i].idle_since, i))
            expired = sorted(by_idle[: len(by_idle) - spare])
        for i in expired:
            del self._instances[i]
        self._count["stops"] += len(expired)
        actions: list[Action] = [Stop(i) for i in expired]
        while len(self._instances) < self.min_instances and self._may_launch():
            actions.append(self._launch())
        return actions

    # helpers for the policies ---------------------------------------------------------------
    def _get(self, instance: int, event: str, state: str | None = None) -> _Instance:
        inst = self._instances.get(instance)
        if inst is None or (state is not None and inst.state != state):
            found = "unknown" if inst is None else inst.state
            raise InvalidInputError(
                f"{event}({instance}): instance is {found}, expected {state or 'a live one'}",
                "instance",
            )
        return inst

    def _went_idle(self, instance: int, now: float) -> list[Action]:
        inst = self._instances[instance]
        inst.state = "idle"
        run = self._policy.take_work(self, instance)
        if run is None:
            inst.idle_since = now
            return []
        return [run]

    def _enqueue(self, queue: deque[int], request: int) -> None:
        """Add ``request`` to ``queue`` in arrival order (a request placed again after its
        instance died may have arrived before some already queued)."""
        order = self._seq[request]
        at = len(queue)
        while at and self._seq[queue[at - 1]] > order:
            at -= 1
        queue.insert(at, request)

    def _may_launch(self) -> bool:
        return self.max_instances is None or len(self._instances) < self.max_instances

    def _latest_idle(self) -> int | None:
        """The idle instance that went idle most recently (lowest id on ties), or None."""
        idle = [(-x.idle_since, i) for i, x in self._instances.items() if x.state == "idle"]
        return min(idle)[1] if idle else None

    def _launch(self) -> Launch:
        instance, self._next_id = self._next_id, self._next_id + 1
        self._instances[instance] = _Instance("starting")
        self._count["launches"] += 1
        return Launch(instance)

    def _run(self, instance: int, request: int) -> Run:
        inst = self._instances[instance]
        inst.state, inst.running = "busy", request
        self._count["runs"] += 1
        return Run(instance, request)
