"""The load-aware scheduler (FaaS-GNN §4.4, Figure 11) and the naive policy (§3.4.2) on a fake
clock: every decision of scripted scenarios asserted, the two policies contrasted on one trace,
failures, and invariants under random event sequences."""

from __future__ import annotations

import heapq

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from gnnserve.deploy.faas.scheduler import Action, Launch, Run, Scheduler, Stop
from gnnserve.errors import InvalidInputError


def test_figure_11_every_decision_load_aware() -> None:
    s = Scheduler("load_aware", keep_alive_s=100.0)
    # left part: arrival. r0: n_req 1 > n_container 0 and nothing idle -> launch; nothing warm
    # -> temporary queue
    assert s.arrive(0, now=0.0) == [Launch(0)]
    assert s.view().temporary == 1 and s.view().instances["starting"] == 1
    assert s.arrive(1, now=1.0) == [Launch(1)]  # 2 > 1
    # right part: cold start done -> the temporary queue's head (FCFS)
    assert s.ready(0, now=10.0) == [Run(0, 0)]
    assert s.view().temporary == 1
    # r2: 3 > 2 -> launch; the only warm instance (0) queues it
    assert s.arrive(2, now=11.0) == [Launch(2)]
    assert s.view().queue_lengths == {0: 1}
    assert s.ready(1, now=12.0) == [Run(1, 1)]  # temporary head r1
    assert s.view().temporary == 0
    # r3: 4 > 3 -> launch; queues 0:1, 1:0 -> shortest is instance 1
    assert s.arrive(3, now=13.0) == [Launch(3)]
    # r4: 5 > 4 -> launch; queues 0:1, 1:1 tie -> lowest id 0
    assert s.arrive(4, now=14.0) == [Launch(4)]
    assert s.view().queue_lengths == {0: 2, 1: 1}
    # cold start of 2 ends, temporary queue empty -> steal from the longest queue its FRONT
    # (r2; §4.4 takes the tail, r4, which would overtake r2 in that queue)
    assert s.ready(2, now=20.0) == [Run(2, 2)]
    assert s.steals == 1 and s.view().queue_lengths == {0: 1, 1: 1, 2: 0}
    # instance 1 finishes r1 -> the FRONT of its own queue (r3)
    assert s.done(1, now=21.0) == [Run(1, 3)]
    # instance 2 drains early (r2 done, own queue empty) -> steals r4 from instance 0
    assert s.done(2, now=22.0) == [Run(2, 4)]
    assert s.steals == 2 and s.view().queue_lengths == {0: 0, 1: 0, 2: 0}
    # r5: n_req 4 (r0, r3, r2 running + r5) <= n_container 5 -> NO launch; no idle;
    # three empty queues tie -> lowest id 0
    assert (s.n_requests, s.n_containers) == (3, 5)
    assert s.arrive(5, now=23.0) == []
    assert s.view().queue_lengths == {0: 1, 1: 0, 2: 0}
    assert s.ready(3, now=24.0) == [Run(3, 5)]  # steal at cold-start end
    assert s.ready(4, now=25.0) == []  # nothing to take: idle since 25
    assert s.done(3, now=26.0) == []  # idle since 26
    # r6: idle instances exist -> no launch; the one idle most recently (3 @ 26, not 4 @ 25)
    assert s.arrive(6, now=27.0) == [Run(3, 6)]
    assert s.done(0, now=30.0) == [] and s.done(1, now=30.0) == []
    # r7: 0 and 1 both idle since 30 -> lowest id
    assert s.arrive(7, now=31.0) == [Run(0, 7)]
    for inst in (0, 2, 3):
        assert s.done(inst, now=32.0) == []
    assert s.view().instances == {"starting": 0, "idle": 5, "busy": 0}
    # keep-alive 100 s: 4 idle since 25, 1 since 30, 0/2/3 since 32
    assert s.tick(now=124.0) == []
    assert s.tick(now=125.0) == [Stop(4)]
    assert s.tick(now=130.0) == [Stop(1)]
    assert s.tick(now=131.0) == []
    assert s.tick(now=132.0) == [Stop(0), Stop(2), Stop(3)]
    view = s.view()
    assert view.instances == {"starting": 0, "idle": 0, "busy": 0} and view.n_containers == 0
    assert (view.launches, view.steals, view.runs, view.stops) == (5, 3, 8, 5)
    assert view.n_requests == 0 and view.queue_lengths == {} and view.temporary == 0
    # scaled to zero: the next arrival is a cold start again, ids keep increasing
    assert s.arrive(8, now=200.0) == [Launch(5)]


def test_no_launch_at_max_instances_load_aware() -> None:
    s = Scheduler("load_aware", max_instances=1)
    assert s.arrive(0, 0.0) == [Launch(0)]
    assert s.arrive(1, 1.0) == []  # 2 > 1 but at the cap: temporary queue
    assert s.ready(0, 2.0) == [Run(0, 0)]
    assert s.arrive(2, 3.0) == []  # queued on instance 0
    assert s.view().queue_lengths == {0: 1} and s.view().temporary == 1
    # r1 (temporary queue) arrived before r2 (own queue): arrival order decides
    assert s.done(0, 4.0) == [Run(0, 1)]
    assert s.done(0, 5.0) == [Run(0, 2)]
    assert s.done(0, 6.0) == [] and s.launches == 1


def test_naive_launches_per_request_which_waits_for_its_own_cold_start() -> None:
    s = Scheduler("naive", keep_alive_s=100.0)
    assert s.arrive(0, 0.0) == [Launch(0)]
    assert s.view().reserved == 1 and s.view().temporary == 0
    assert s.arrive(1, 1.0) == [Launch(1)]  # no idle instance -> launch, even though 2 start
    assert s.ready(0, 10.0) == [Run(0, 0)]  # its own request
    assert s.arrive(2, 11.0) == [Launch(2)]  # 0 busy -> another launch
    assert s.done(0, 12.0) == []  # 0 idle; r1 and r2 keep waiting for their cold starts
    view = s.view()
    assert view.instances == {"starting": 2, "idle": 1, "busy": 0} and view.reserved == 2
    assert s.arrive(3, 13.0) == [Run(0, 3)]  # an idle instance takes a new arrival
    assert s.ready(2, 20.0) == [Run(2, 2)]
    assert s.ready(1, 21.0) == [Run(1, 1)]  # r1 ran only when its own instance was warm
    assert (s.steals, s.launches, s.runs) == (0, 3, 4)
    assert all(q == 0 for q in s.view().queue_lengths.values())


def test_naive_at_max_instances_waits_for_the_next_idle_instance() -> None:
    s = Scheduler("naive", max_instances=1)
    assert s.arrive(0, 0.0) == [Launch(0)]
    assert s.arrive(1, 1.0) == [] and s.arrive(2, 2.0) == []
    assert s.view().temporary == 2
    assert s.ready(0, 10.0) == [Run(0, 0)]
    assert s.done(0, 11.0) == [Run(0, 1)]  # temporary queue head, FCFS
    assert s.done(0, 12.0) == [Run(0, 2)]
    assert s.done(0, 13.0) == []


def simulate(
    policy: str, arrivals: dict[int, float], cold_s: float, exec_s: float
) -> tuple[dict[int, tuple[int, float]], int, bool]:
    """Discrete-event run on a fake clock: (request -> (instance, start s), launches, whether a
    request ever waited for a cold start while an instance was idle)."""
    s = Scheduler(policy)
    events = [(t, 0, "arrive", r) for r, t in arrivals.items()]
    heapq.heapify(events)
    started: dict[int, tuple[int, float]] = {}
    co_occurrence = False
    seq = 1
    while events:
        now, _, kind, key = heapq.heappop(events)
        actions = getattr(s, kind)(key, now)
        for a in actions:
            seq += 1
            if isinstance(a, Launch):
                heapq.heappush(events, (now + cold_s, seq, "ready", a.instance))
            elif isinstance(a, Run):
                started[a.request] = (a.instance, now)
                heapq.heappush(events, (now + exec_s, seq, "done", a.instance))
        view = s.view()
        waiting_cold = view.reserved + (view.temporary if view.instances["starting"] else 0)
        co_occurrence |= waiting_cold > 0 and view.instances["idle"] > 0
    return started, s.launches, co_occurrence


def test_policies_differ_on_the_same_trace() -> None:
    """Cold start 10 s, execution 1 s. Under naive r1 waits for its own cold start (until
    20.5 s) while instance 0 has been idle since 11 s, and r3 triggers a third launch;
    load_aware queues r1 on instance 0 (starts at 11 s) and never launches a third."""
    arrivals = {0: 0.0, 1: 10.5, 2: 11.5, 3: 12.25}
    naive, naive_launches, naive_co = simulate("naive", arrivals, cold_s=10.0, exec_s=1.0)
    aware, aware_launches, aware_co = simulate("load_aware", arrivals, cold_s=10.0, exec_s=1.0)
    assert naive == {0: (0, 10.0), 1: (1, 20.5), 2: (0, 11.5), 3: (2, 22.25)}
    assert (naive_launches, naive_co) == (3, True)
    assert aware == {0: (0, 10.0), 1: (0, 11.0), 2: (0, 12.0), 3: (0, 13.0)}
    assert (aware_launches, aware_co) == (2, False)


def test_failure_reports_running_request_and_replaces_instance() -> None:
    s = Scheduler("load_aware", max_instances=1)
    assert s.arrive(0, 0.0) == [Launch(0)]
    assert s.arrive(1, 1.0) == []  # at the cap: temporary queue
    assert s.ready(0, 2.0) == [Run(0, 0)]
    assert s.arrive(2, 3.0) == []  # queued on instance 0
    failure = s.failed(0, 4.0)
    assert failure.failed == [0]  # lost with the instance, forgotten by the scheduler
    # r2 placed again: n_req 2 > 0 containers -> replacement; nothing warm -> temporary queue
    assert failure.actions == [Launch(1)]
    assert s.n_requests == 2 and s.view().temporary == 2
    assert s.ready(1, 5.0) == [Run(1, 1)]
    assert s.done(1, 6.0) == [Run(1, 2)]
    assert s.done(1, 7.0) == [] and s.n_requests == 0


def test_failure_keeps_queue_order_without_a_new_launch() -> None:
    s = Scheduler("load_aware")
    s.arrive(0, 0.0)
    s.ready(0, 1.0)
    assert s.arrive(1, 2.0) == [Launch(1)] and s.arrive(2, 3.0) == [Launch(2)]
    assert s.view().queue_lengths == {0: 2}
    failure = s.failed(0, 4.0)
    # n_req 2 <= 2 starting instances: no launch; nothing warm -> temporary, in order
    assert (failure.failed, failure.actions) == ([0], [])
    assert s.ready(2, 5.0) == [Run(2, 1)] and s.ready(1, 6.0) == [Run(1, 2)]


@pytest.mark.parametrize("policy", ["load_aware", "naive"])
def test_death_during_cold_start_launches_a_replacement(policy: str) -> None:
    s = Scheduler(policy)
    assert s.arrive(0, 0.0) == [Launch(0)]
    failure = s.failed(0, 1.0)
    assert (failure.failed, failure.actions) == ([], [Launch(1)])
    assert s.ready(1, 2.0) == [Run(1, 0)]
    # an idle instance dying loses nothing and needs no replacement
    assert s.done(1, 3.0) == []
    assert s.failed(1, 4.0) == type(failure)([], []) and s.n_containers == 0


@pytest.mark.parametrize("policy", ["load_aware", "naive"])
def test_drop_waiting_forgets_every_request_not_running(policy: str) -> None:
    s = Scheduler(policy, max_instances=2)
    s.arrive(0, 0.0)
    s.arrive(1, 1.0)
    s.ready(0, 2.0)  # r0 runs on 0
    s.arrive(2, 3.0)  # load_aware: queued on 0; naive: temporary (at the cap)
    s.arrive(3, 4.0)
    assert sorted(s.drop_waiting()) == [1, 2, 3]
    view = s.view()
    assert view.n_requests == 1 and view.temporary == view.reserved == 0
    assert not any(view.queue_lengths.values())
    assert s.ready(1, 5.0) == []  # nothing left for it
    assert s.arrive(2, 6.0) == [Run(1, 2)]  # a dropped id may arrive again


def test_bad_arguments_and_events() -> None:
    with pytest.raises(InvalidInputError, match="fifo") as err:
        Scheduler("fifo")
    assert err.value.field == "policy"
    with pytest.raises(InvalidInputError, match="keep_alive_s"):
        Scheduler(keep_alive_s=0)
    with pytest.raises(InvalidInputError, match="max_instances"):
        Scheduler(max_instances=0)
    s = Scheduler()
    s.arrive(0, 0.0)
    with pytest.raises(InvalidInputError, match="already") as err:
        s.arrive(0, 1.0)
    assert err.value.field == "request"
    with pytest.raises(InvalidInputError, match="starting, expected busy"):
        s.done(0, 1.0)
    with pytest.raises(InvalidInputError, match="unknown") as err:
        s.failed(7, 1.0)
    assert err.value.field == "instance"
    s.ready(0, 1.0)
    with pytest.raises(InvalidInputError, match="busy, expected starting"):
        s.ready(0, 2.0)


@pytest.mark.parametrize("policy", ["load_aware", "naive"])
def test_an_announced_request_launches_while_its_earlier_stage_runs(policy: str) -> None:
    s = Scheduler(policy)
    assert s.expect(0.0) == [Launch(0)]  # nothing warm: its cold start begins now
    assert s.expect(0.5) == [Launch(1)]  # a second announced request: another instance
    assert s.ready(0, 1.0) == []  # warm before the request arrives: it waits, idle
    assert s.arrive(0, 2.0, expected=True) == [Run(0, 0)]  # no second cold start
    assert s.arrive(1, 2.5, expected=True) == []  # instance 1 still starting: it waits for it
    assert s.ready(1, 3.0) == [Run(1, 1)] and s.launches == 2 and s.expected == 0
    assert s.done(0, 4.0) == []
    assert s.expect(5.0) == []  # an idle instance will take it: no launch
    s.unexpect()  # its earlier stage failed
    assert s.expected == 0 and s.arrive(2, 6.0) == [Run(0, 2)]


EVENTS = st.lists(
    st.tuples(
        st.sampled_from(
            ["arrive", "arrive", "arrive", "expect", "ready", "done", "done", "tick", "fail"]
        ),
        st.integers(0, 7),
    ),
    max_size=80,
)


def check_fcfs(s: Scheduler, before: dict[int, str], actions: list[Action], policy: str) -> None:
    """No request started by ``actions`` overtook an earlier arrival on its path: its own queue
    or reservation, the instance's queue, or the temporary queue."""
    after = s.waiting()
    for a in actions:
        if not isinstance(a, Run):
            continue
        source = before.get(a.request, "new")
        if policy == "naive" and source.startswith("reserved"):
            continue  # naive: a request waits for the instance launched for it
        paths = {source, "temporary", f"queue:{a.instance}"}
        order = s.arrival_order(a.request)
        for waiting, where in after.items():
            if where in paths:
                assert s.arrival_order(waiting) > order, (a, waiting, where, before)


class Model:
    """What the pool would see: instances by state, what runs where, what finished."""

    def __init__(self) -> None:
        self.starting: set[int] = set()
        self.idle: set[int] = set()
        self.running: dict[int, int] = {}  # instance -> request
        self.ran: list[int] = []
        self.lost: list[int] = []
        self.finished = 0
        self.launches = self.stops = 0

    def apply(self, actions: list[Action]) -> None:
        for a in actions:
            if isinstance(a, Launch):
                known = self.starting | self.idle | set(self.running)
                assert a.instance not in known
                self.starting.add(a.instance)
                self.launches += 1
            elif isinstance(a, Run):  # only on an idle warm instance, never a request twice
                assert a.instance in self.idle and a.request not in self.ran
                self.idle.remove(a.instance)
                self.running[a.instance] = a.request
                self.ran.append(a.request)
            else:
                assert a.instance in self.idle
                self.idle.remove(a.instance)
                self.stops += 1

    def check(self, s: Scheduler, arrived: int, policy: str, cap: int | None) -> None:
        view = s.view()
        states = {"starting": len(self.starting), "idle": len(self.idle)}
        assert view.instances == {**states, "busy": len(self.running)}
        live = arrived - self.finished - len(self.lost)
        recount = sum(view.queue_lengths.values()) + view.temporary + view.reserved
        assert s.n_requests == view.n_requests == live == recount + len(self.running)
        assert s.n_containers == len(self.starting) + len(self.idle) + len(self.running)
        assert (view.runs, view.launches, view.stops) == (len(self.ran), self.launches, self.stops)
        assert cap is None or s.n_containers <= cap
        if self.idle:  # nobody waits in a queue while an instance is idle
            assert view.temporary == 0 and not any(view.queue_lengths.values())
        if policy == "naive":
            assert view.steals == 0 and not any(view.queue_lengths.values())
        else:
            assert view.reserved == 0


@settings(max_examples=300, deadline=None)
@given(
    policy=st.sampled_from(["load_aware", "naive"]), events=EVENTS, cap=st.sampled_from([None, 2])
)
@example(  # at the cap: r1 waits in the temporary queue while r3 joins instance 0's queue
    policy="load_aware",
    events=[("arrive", 0)] * 3 + [("ready", 0), ("arrive", 0), ("done", 0)],
    cap=2,
)
@example(  # instance 0 dies: its queued r2 joins instance 1's queue before the later r3
    policy="load_aware",
    events=[("arrive", 0), ("ready", 0), ("arrive", 0), ("ready", 0)]
    + [("arrive", 0), ("arrive", 0), ("fail", 0), ("done", 0)],
    cap=None,
)
@example(  # a steal: instance 1 takes r1, the front of instance 0's queue, not r2 behind it
    policy="load_aware",
    events=[("arrive", 0), ("ready", 0), ("arrive", 0), ("arrive", 0), ("ready", 0)],
    cap=None,
)
def test_every_request_runs_exactly_once(
    policy: str, events: list[tuple[str, int]], cap: int | None
) -> None:
    s = Scheduler(policy, keep_alive_s=3.0, max_instances=cap)
    m = Model()
    arrived = 0
    now = 0.0
    for kind, k in events:
        now += 1.0
        before = s.waiting()
        if kind == "arrive":
            actions = s.arrive(arrived, now, expected=s.expected > 0)
            check_fcfs(s, before, actions, policy)
            m.apply(actions)
            arrived += 1
        elif kind == "expect":
            m.apply(s.expect(now))
        elif kind == "ready" and m.starting:
            inst = sorted(m.starting)[k % len(m.starting)]
            m.starting.remove(inst)
            m.idle.add(inst)
            actions = s.ready(inst, now)
            check_fcfs(s, before, actions, policy)
            m.apply(actions)
        elif kind == "done" and m.running:
            inst = sorted(m.running)[k % len(m.running)]
            del m.running[inst]
            m.idle.add(inst)
            m.finished += 1
            actions = s.done(inst, now)
            check_fcfs(s, before, actions, policy)
            m.apply(actions)
        elif kind == "fail" and (everyone := sorted(m.starting | m.idle | set(m.running))):
            inst = everyone[k % len(everyone)]
            expected = [m.running.pop(inst)] if inst in m.running else []
            m.starting.discard(inst)
            m.idle.discard(inst)
            failure = s.failed(inst, now)
            assert failure.failed == expected
            for request in failure.failed:
                s.forget(request)
            m.lost += failure.failed
            m.apply(failure.actions)
        elif kind == "tick":
            m.apply(s.tick(now))
        m.check(s, arrived, policy, cap)
    while s.expected:  # the announced requests that never came
        s.unexpect()
    while m.starting or m.running:  # drain to quiescence
        now += 1.0
        if m.starting:
            inst = min(m.starting)
            m.starting.remove(inst)
            m.idle.add(inst)
            m.apply(s.ready(inst, now))
        else:
            inst = min(m.running)
            del m.running[inst]
            m.idle.add(inst)
            m.finished += 1
            m.apply(s.done(inst, now))
        m.check(s, arrived, policy, cap)
    assert s.n_requests == 0  # nothing left waiting with no instance to run it
    assert sorted(m.ran) == list(range(arrived))  # every request ran exactly once
    assert len(set(m.lost)) == len(m.lost) and set(m.lost) <= set(m.ran)
    m.apply(s.tick(now + 3.0))
    assert s.n_containers == 0  # scale to zero


def test_min_instances_are_launched_at_once_and_never_stopped_below() -> None:
    s = Scheduler("load_aware", keep_alive_s=100.0, min_instances=2)
    assert s.tick(now=0.0) == [Launch(0), Launch(1)]  # no traffic: launched anyway
    assert s.tick(now=0.5) == []  # starting instances count
    assert s.ready(0, now=5.0) == [] and s.ready(1, now=6.0) == []
    assert s.arrive(0, now=7.0) == [Run(1, 0)]  # warm: no cold start for the first request
    assert s.arrive(1, now=7.5) == [Run(0, 1)]
    assert s.arrive(2, now=8.0) == [Launch(2)]  # 3 requests > 2 instances
    assert s.done(1, now=9.0) == [Run(1, 2)]
    assert s.ready(2, now=10.0) == []
    assert s.done(0, now=11.0) == [] and s.done(1, now=12.0) == []
    # idle since 10, 11, 12: past keep-alive all three, the two most recently idle stay
    assert s.tick(now=500.0) == [Stop(2)]
    assert s.tick(now=1000.0) == [] and s.view().instances["idle"] == 2


def test_min_instances_above_max_instances_is_refused() -> None:
    with pytest.raises(InvalidInputError, match="min_instances"):
        Scheduler("load_aware", max_instances=1, min_instances=2)
    with pytest.raises(InvalidInputError, match="min_instances"):
        Scheduler("load_aware", min_instances=-1)
