"""The load-aware request scheduler of FaaS-GNN (§4.4) and the platform's naive policy (§3.4.2).

Pure decision logic: events in (a request arrives, an instance finishes its cold start or its
request, dies, time passes), actions out (:class:`Launch` a cold instance, :class:`Run` a
request on a warm one, :class:`Stop` an idle one). Time is passed in as ``now`` (seconds), so
tests drive it with a fake clock; :class:`~gnnserve.deploy.faas.pool.FunctionPool` executes the
actions on Ray actors.

load_aware, exactly as §4.4:
- every warm instance has a FCFS queue; a busy instance runs the front of its own queue next;
- on arrival, launch a new instance only when ``n_req > n_container`` (requests waiting or
  running, the new one counted, vs instances warm or starting) and no instance is idle;
- the request then goes to an idle instance, else to the queue of the warm instance with the
  shortest queue, else (nothing warm) to a temporary queue;
- an instance that becomes idle (cold start done, or its queue drained) takes the head of the
  temporary queue, else the request at the tail of the longest queue (a steal).
naive: an idle instance runs the request; otherwise a new instance is launched for it and the
request waits for that instance's cold start (no queues, no steals).
Both: an instance idle for ``keep_alive_s`` is stopped (scale to zero).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from gnnserve.errors import InvalidInputError

POLICIES = ("load_aware", "naive")
STATES = ("starting", "idle", "busy")


@dataclass(frozen=True)
class Launch:
    """Start instance ``instance`` (a cold start)."""

    instance: int


@dataclass(frozen=True)
class Run:
    """Run ``request`` on warm instance ``instance``."""

    instance: int
    request: int


@dataclass(frozen=True)
class Stop:
    """Stop instance ``instance`` (idle past its keep-alive)."""

    instance: int


Action = Launch | Run | Stop


@dataclass
class Failure:
    """What :meth:`Scheduler.failed` decided: the request the dead instance was running (lost
    with it: the caller answers it with an error) and the actions to execute."""

    failed: list[int]
    actions: list[Action]


@dataclass
class SchedulerView:
    """A read-only snapshot for metrics and tests."""

    instances: dict[str, int]  # count per state
    queue_lengths: dict[int, int]  # per warm instance
    temporary: int  # requests waiting for any warm instance
    launches: int  # cold starts so far
    steals: int  # requests re-scheduled from the tail of another queue
    stops: int  # keep-alive expiries


@dataclass
class _Instance:
    state: str  # one of STATES
    queue: deque[int] = field(default_factory=deque)
    running: int | None = None
    idle_since: float = 0.0
    reserved: int | None = None  # naive: the request it was launched for


class Scheduler:
    """Decides launches and placements for one function's instances."""

    def __init__(
        self,
        policy: str = "load_aware",
        keep_alive_s: float = 600.0,
        max_instances: int | None = None,
    ) -> None:
        if policy not in POLICIES:
            raise InvalidInputError(
                f"unknown scheduler policy {policy!r}; choose {POLICIES}", "policy"
            )
        if keep_alive_s <= 0:
            raise InvalidInputError(f"keep_alive_s must be > 0, got {keep_alive_s}", "keep_alive_s")
        if max_instances is not None and max_instances < 1:
            raise InvalidInputError(
                f"max_instances must be >= 1, got {max_instances}", "max_instances"
            )
        self.policy = policy
        self.keep_alive_s = float(keep_alive_s)
        self.max_instances = max_instances
        self._instances: dict[int, _Instance] = {}
        self._temporary: deque[int] = deque()
        self._next_id = 0
        self.launches = self.steals = self.stops = 0

    # counts ---------------------------------------------------------------------------------
    @property
    def n_requests(self) -> int:
        """Requests waiting anywhere or running."""
        queued = sum(len(i.queue) + (i.running is not None) for i in self._instances.values())
        reserved = sum(i.reserved is not None for i in self._instances.values())
        return queued + reserved + len(self._temporary)

    @property
    def n_containers(self) -> int:
        """Instances warm or starting."""
        return len(self._instances)

    def view(self) -> SchedulerView:
        """Counts per state, queue lengths, counters."""
        states = {s: 0 for s in STATES}
        for inst in self._instances.values():
            states[inst.state] += 1
        queues = {i: len(x.queue) for i, x in self._instances.items() if x.state != "starting"}
        return SchedulerView(
            states, queues, len(self._temporary), self.launches, self.steals, self.stops
        )

    # events ---------------------------------------------------------------------------------
    def arrive(self, request: int, now: float) -> list[Action]:
        """A request arrived."""
        if self.policy == "naive":
            return self._arrive_naive(request, now)
        actions: list[Action] = []
        idle = self._idle()
        if self.n_requests + 1 > self.n_containers and idle is None and self._may_launch():
            actions.append(self._launch(now))
        if idle is not None:
            actions.append(self._run(idle, request))
            return actions
        warm = [i for i, x in self._instances.items() if x.state == "busy"]
        if warm:
            target = min(warm, key=lambda i: (len(self._instances[i].queue), i))
            self._instances[target].queue.append(request)
        else:
            self._temporary.append(request)
        return actions

    def _arrive_naive(self, request: int, now: float) -> list[Action]:
        idle = self._idle()
        if idle is not None:
            return [self._run(idle, request)]
        if not self._may_launch():
            self._temporary.append(request)
            return []
        launch = self._launch(now)
        self._instances[launch.instance].reserved = request
        return [launch]

    def ready(self, instance: int, now: float) -> list[Action]:
        """``instance`` finished its cold start."""
        inst = self._instances[instance]
        inst.state = "idle"
        inst.idle_since = now
        if inst.reserved is not None:
            request, inst.reserved = inst.reserved, None
            return [self._run(instance, request)]
        return self._take_work(instance, now)

    def done(self, instance: int, now: float) -> list[Action]:
        """``instance`` finished its running request."""
        inst = self._instances[instance]
        inst.running = None
        inst.state = "idle"
        inst.idle_since = now
        if inst.queue:
            return [self._run(instance, inst.queue.popleft())]
        return self._take_work(instance, now)

    def failed(self, instance: int, now: float) -> Failure:
        """``instance`` died: its running request is lost, its queue is placed again."""
        inst = self._instances.pop(instance)
        lost = [inst.running] if inst.running is not None else []
        pending = ([inst.reserved] if inst.reserved is not None else []) + list(inst.queue)
        actions: list[Action] = []
        for request in pending:
            actions += self.arrive(request, now)
        starting = any(x.state == "starting" for x in self._instances.values())
        if self._temporary and not starting and self._idle() is None and self._may_launch():
            actions.append(self._launch(now))  # waiting requests must not wait for nothing
        return Failure(lost, actions)

    def tick(self, now: float) -> list[Action]:
        """Stop instances idle for ``keep_alive_s`` or longer."""
        expired = [
            i
            for i, x in self._instances.items()
            if x.state == "idle" and now - x.idle_since >= self.keep_alive_s
        ]
        for i in expired:
            del self._instances[i]
        self.stops += len(expired)
        return [Stop(i) for i in expired]

    # helpers --------------------------------------------------------------------------------
    def _may_launch(self) -> bool:
        return self.max_instances is None or len(self._instances) < self.max_instances

    def _idle(self) -> int | None:
        """The idle instance that became idle most recently (lowest id on ties)."""
        idle = [(-x.idle_since, i) for i, x in self._instances.items() if x.state == "idle"]
        return min(idle)[1] if idle else None

    def _launch(self, now: float) -> Launch:
        instance = self._next_id
        self._next_id += 1
        self._instances[instance] = _Instance("starting", idle_since=now)
        self.launches += 1
        return Launch(instance)

    def _run(self, instance: int, request: int) -> Run:
        inst = self._instances[instance]
        inst.state, inst.running = "busy", request
        return Run(instance, request)

    def _take_work(self, instance: int, now: float) -> list[Action]:
        """An instance just became idle: the temporary queue first, then a steal."""
        if self._temporary:
            return [self._run(instance, self._temporary.popleft())]
        if self.policy == "naive":
            return []
        queued = [(len(x.queue), -i) for i, x in self._instances.items() if x.queue]
        if not queued:
            return []
        victim = -max(queued)[1]
        self.steals += 1
        return [self._run(instance, self._instances[victim].queue.pop())]
