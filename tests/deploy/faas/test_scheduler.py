"""The load-aware scheduler (FaaS-GNN §4.4, Figure 11) and the naive policy, on a fake clock:
every decision of a scripted scenario asserted, and invariants under random event sequences."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gnnserve.deploy.faas.scheduler import Launch, Run, Scheduler, Stop
from gnnserve.errors import InvalidInputError


def test_figure_11_arrivals_and_rescheduling() -> None:
    s = Scheduler("load_aware", keep_alive_s=10.0)
    # r0: nothing exists: n_req 1 > n_container 0 -> launch; nothing warm -> temporary queue
    assert s.arrive(0, now=0.0) == [Launch(0)]
    assert s.view().temporary == 1
    # r1: n_req 2 > 1 -> launch another; still nothing warm
    assert s.arrive(1, now=0.1) == [Launch(1)]
    # instance 0 warm: it takes the temporary queue's head (FCFS)
    assert s.ready(0, now=1.0) == [Run(0, 0)]
    # r2: n_req 3 > n_container 2, no idle -> launch; the only warm instance (0) queues it
    assert s.arrive(2, now=1.1) == [Launch(2)]
    assert s.view().queue_lengths == {0: 1}
    # instance 1 warm: r1 (temporary queue head) first
    assert s.ready(1, now=1.2) == [Run(1, 1)]
    # r3: n_req 4 > 3 -> launch; queues 0:[2], 1:[] -> shortest is instance 1
    assert s.arrive(3, now=1.3) == [Launch(3)]
    # r4: n_req 5 > 4 -> launch; queues 0:[2], 1:[3]: tie -> lowest id (0)
    assert s.arrive(4, now=1.4) == [Launch(4)]
    assert s.view().queue_lengths == {0: 2, 1: 1}
    # cold start of 2 ends: no temporary request -> steal the TAIL of the longest queue (0: r4)
    assert s.ready(2, now=2.0) == [Run(2, 4)]
    assert s.steals == 1 and s.view().queue_lengths == {0: 1, 1: 1, 2: 0}
    # instance 1 finishes r1: runs the front of its own queue (r3)
    assert s.done(1, now=2.1) == [Run(1, 3)]
    # instance 2 finishes r4 early (queue drained): steals r2 from instance 0's tail
    assert s.done(2, now=2.2) == [Run(2, 2)]
    assert s.steals == 2
    # cold starts of 3 and 4 end with nothing queued: they stay idle
    assert s.ready(3, now=2.3) == [] and s.ready(4, now=2.4) == []
    # r5: idle instances exist -> no launch; the most recently idle one (4) runs it
    assert s.arrive(5, now=2.5) == [Run(4, 5)]
    assert s.launches == 5
    # everything finishes; keep-alive expiry scales to zero
    for inst, t in ((0, 3.0), (1, 3.0), (2, 3.0), (4, 3.0)):
        assert s.done(inst, now=t) == []
    assert s.tick(now=12.0) == []  # instance 3 idle since 2.3 < 10 s ago? no: 9.7 s
    assert s.tick(now=12.3) == [Stop(3)]
    assert s.tick(now=13.0) == [Stop(0), Stop(1), Stop(2), Stop(4)]
    assert s.n_containers == 0 and s.view().instances == {"starting": 0, "idle": 0, "busy": 0}


def test_no_launch_while_concurrency_suffices() -> None:
    s = Scheduler("load_aware")
    assert s.arrive(0, 0.0) == [Launch(0)]
    assert s.ready(0, 1.0) == [Run(0, 0)]
    # n_req 2 > n_container 1 -> launch; r1 queues on 0
    assert s.arrive(1, 1.1) == [Launch(1)]
    # n_req 3 > 2 -> another launch
    assert s.arrive(2, 1.2) == [Launch(2)]
    # r0 done -> 0 runs r1 from its queue; r2 queued too (shortest queue, tie -> 0)
    assert s.done(0, 1.3) == [Run(0, 1)]
    # n_req now 2 (r1 running, r2 queued), containers 3: r3 makes 3, not > 3: no launch
    assert s.arrive(3, 1.4) == []
    assert s.n_containers == 3


def test_naive_launches_per_request_and_waits_for_its_own_cold_start() -> None:
    s = Scheduler("naive")
    assert s.arrive(0, 0.0) == [Launch(0)]
    assert s.arrive(1, 0.1) == [Launch(1)]
    assert s.ready(0, 1.0) == [Run(0, 0)]
    assert s.done(0, 1.1) == []  # idle now, but r1 waits for instance 1's cold start
    assert s.arrive(2, 1.2) == [Run(0, 2)]  # an idle instance takes a new arrival
    assert s.ready(1, 2.0) == [Run(1, 1)]  # r1 ran only when its own instance was warm
    assert s.steals == 0 and s.launches == 2


def test_policies_differ_on_the_same_script() -> None:
    """A request arriving while a warm instance is busy: naive launches and waits for the cold
    start (and another instance goes idle meanwhile); load_aware queues it and the idle
    instance runs it."""
    runs = {}
    for policy in ("naive", "load_aware"):
        s = Scheduler(policy)
        s.arrive(0, 0.0)
        s.ready(0, 1.0)  # r0 running on instance 0
        s.arrive(1, 1.1)  # both policies launch instance 1 (no idle instance, 2 > 1)
        actions = s.done(0, 1.2)  # instance 0 free long before instance 1 is warm
        runs[policy] = (actions, s.launches)
    assert runs["naive"] == ([], 2)
    assert runs["load_aware"] == ([Run(0, 1)], 2)


def test_max_instances_and_failures() -> None:
    s = Scheduler("load_aware", max_instances=1)
    assert s.arrive(0, 0.0) == [Launch(0)]
    assert s.arrive(1, 0.1) == []  # at the cap: no launch, temporary queue
    assert s.ready(0, 1.0) == [Run(0, 0)]
    assert s.arrive(2, 1.1) == []  # queued on instance 0
    failure = s.failed(0, 1.2)
    assert failure.failed == [0]  # the running request is lost with the instance
    # queued r2 placed again: a replacement launches (nothing left), r1 and r2 wait for it
    assert failure.actions == [Launch(1)]
    assert s.ready(1, 2.0) == [Run(1, 1)]
    assert s.done(1, 2.1) == [Run(1, 2)]


def test_bad_arguments() -> None:
    with pytest.raises(InvalidInputError, match="policy"):
        Scheduler("fifo")
    with pytest.raises(InvalidInputError, match="keep_alive_s"):
        Scheduler(keep_alive_s=0)
    with pytest.raises(InvalidInputError, match="max_instances"):
        Scheduler(max_instances=0)


EVENTS = st.lists(
    st.tuples(
        st.sampled_from(["arrive", "arrive", "arrive", "ready", "done", "done", "tick", "fail"]),
        st.integers(0, 7),
    ),
    max_size=80,
)


@settings(max_examples=150, deadline=None)
@given(
    policy=st.sampled_from(["load_aware", "naive"]), events=EVENTS, cap=st.sampled_from([None, 3])
)
def test_every_request_runs_exactly_once(policy: str, events: list, cap: int | None) -> None:
    s = Scheduler(policy, keep_alive_s=2.0, max_instances=cap)
    starting: set[int] = set()
    running: dict[int, int] = {}  # instance -> request
    ran: list[int] = []
    lost: list[int] = []
    arrived = 0
    now = 0.0

    def apply(actions: list) -> None:
        for a in actions:
            if isinstance(a, Launch):
                starting.add(a.instance)
            elif isinstance(a, Run):
                assert a.instance not in running and a.instance not in starting
                running[a.instance] = a.request
                ran.append(a.request)
            else:
                assert a.instance not in running and a.instance not in starting

    for kind, k in events:
        now += 0.5
        if kind == "arrive":
            apply(s.arrive(arrived, now))
            arrived += 1
        elif kind == "ready" and starting:
            inst = sorted(starting)[k % len(starting)]
            starting.discard(inst)
            apply(s.ready(inst, now))
        elif kind == "done" and running:
            inst = sorted(running)[k % len(running)]
            del running[inst]
            apply(s.done(inst, now))
        elif kind == "fail" and (running or starting):
            inst = sorted(set(running) | starting)[k % len(set(running) | starting)]
            running.pop(inst, None)
            starting.discard(inst)
            failure = s.failed(inst, now)
            lost += failure.failed
            apply(failure.actions)
        elif kind == "tick":
            apply(s.tick(now))
        waiting = s.n_requests - len(running)
        assert waiting >= 0 and s.n_containers >= len(running) + len(starting) - 0
        assert len(ran) == len(set(ran))  # never run twice
    # drain: finish cold starts and requests until quiet
    for _ in range(4 * arrived + 10):
        if starting:
            inst = min(starting)
            starting.discard(inst)
            apply(s.ready(inst, now))
        elif running:
            inst = min(running)
            del running[inst]
            apply(s.done(inst, now))
        else:
            break
    assert len(ran) == len(set(ran))
    assert sorted(set(ran) | set(lost)) == list(range(arrived))  # nobody forgotten
