"""Fault recovery in the orchestrator core, with an in-memory gateway: a dead socket
or agent is noticed by heartbeat, its job's run is stopped at once (the survivors'
calls aborted) and the job retried elsewhere; GetRack's view says what is down, since
when and why.

The tests step the orchestrator: they run each scheduling round (`schedule_once`) and
health round (`supervise_once`) themselves, on a clock they advance. Each runs on both
job stores, SQLite and PostgreSQL (`store_location`, tests/conftest.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from rdurack.errors import LinkFailure
from rdurack.orchestrator.jobs import JobState
from rdurack.orchestrator.orchestrator import Orchestrator
from rdurack.orchestrator.results import CoeResult
from tests.support.fake_rack import (
    RACK,
    FakeClock,
    FakeGateway,
    coe,
    spec,
    stepped,
    until,
    wait_for,
    wait_retried,
)

# The watcher's deadline in the tests' clock (the real default is 2 s).
DEAD_AFTER_S = 0.3


@pytest.fixture
def orch(store_location: str, gateway: FakeGateway, clock: FakeClock) -> Iterator[Orchestrator]:
    with stepped(
        store_location,
        gateway,
        poll_s=0.05,
        dead_after_s=DEAD_AFTER_S,
        retry_backoff_s=0.0,
        clock=clock,
    ) as o:
        yield o


def retry_reasons(orch: Orchestrator, job_id: str) -> list[str]:
    return [
        str(e.payload["reason"])
        for e in orch.events(job_id)
        if e.kind == "state" and str(e.payload.get("reason", "")).startswith("retrying")
    ]


def placed_at_the_gate(orch: Orchestrator, gateway: FakeGateway, job_id: str) -> None:
    """One round places the job; its run starts and waits at the gateway's closed gate."""
    gateway.gate.clear()
    assert orch.schedule_once() == 1
    until(lambda: gateway.held_at_gate(job_id), f"{job_id} running, held at the gate")
    assert orch.get(job_id).state is JobState.RUNNING


def test_a_dead_socket_stops_its_job_at_once_and_the_job_runs_elsewhere(
    orch: Orchestrator, gateway: FakeGateway
) -> None:
    gateway.dead_fails_at_once = False  # the survivors wait: only an abort ends the run
    job, _ = orch.submit(spec(sockets=8, steps=4))
    placed_at_the_gate(orch, gateway, job.id)
    first = orch.get(job.id).sockets
    victim = first[3]
    gateway.dead.add(victim)
    # Noticed by one heartbeat, its run aborted: the job leaves RUNNING for a retry.
    assert [c.socket_id for c in orch.supervise_once()] == [victim]
    wait_retried(orch, job.id, attempts=1)
    (reason,) = retry_reasons(orch, job.id)
    assert victim in reason and "socket actor dead" in reason, reason
    assert any(j == job.id and victim in why for j, why in gateway.abort_log)
    gateway.gate.set()
    assert orch.schedule_once() == 1  # elsewhere: the dead socket is out of the pool
    assert wait_for(orch, job.id) is JobState.SUCCEEDED
    done = orch.get(job.id)
    assert victim not in done.sockets and done.attempts == 2
    down = {s.socket_id: s for n in orch.rack() for s in n.sockets if not s.healthy}
    assert set(down) == {victim}
    assert "socket actor dead" in down[victim].reason and down[victim].since_s is not None


def test_an_agent_that_goes_silent_fails_its_job_over_to_the_other_node(
    orch: Orchestrator, gateway: FakeGateway, clock: FakeClock
) -> None:
    job, _ = orch.submit(spec(sockets=8, steps=4))
    placed_at_the_gate(orch, gateway, job.id)
    node = int(orch.get(job.id).sockets[0].split("-")[1][1:])
    gateway.silent.add(node)  # its calls fail: the job is retried
    wait_retried(orch, job.id, attempts=1)
    gateway.gate.set()
    assert orch.schedule_once() == 1
    assert wait_for(orch, job.id) is JobState.SUCCEEDED
    assert {s.split("-")[1] for s in orch.get(job.id).sockets} == {f"n{1 - node}"}
    # The watcher marks the node down once it has been silent for dead_after_s; GetRack
    # lists its sockets down with the reason, though the agent reports none.
    assert orch.supervise_once() == []  # silent, but not for long enough yet
    assert orch.health is not None and orch.health.node(node).healthy
    clock.advance(DEAD_AFTER_S + 0.01)
    assert [c.what for c in orch.supervise_once()] == [f"node {node}'s agent"]
    assert not orch.health.node(node).healthy
    view = next(n for n in orch.rack() if n.index == node)
    assert not view.healthy and len(view.sockets) == RACK.node.sockets
    assert all(not s.healthy and s.since_s is not None for s in view.sockets)


def test_when_one_node_of_a_job_fails_its_other_node_is_aborted(
    store_location: str, gateway: FakeGateway
) -> None:
    """No watcher: a job's own failure on node 1 stops its part on node 0 at once,
    which would otherwise wait for node 1's messages until its timeout."""
    with stepped(store_location, gateway, heartbeat_s=None, max_attempts=1) as o:
        gateway.gate.clear()  # node 0 waits until aborted
        gateway.fail_node = 1
        job, _ = o.submit(spec(sockets=16, steps=2))
        assert o.schedule_once() == 1
        assert wait_for(o, job.id) is JobState.FAILED
        assert any(
            j == job.id and "another node of the job failed" in why for j, why in gateway.abort_log
        )
        assert "link down" in o.get(job.id).error


def test_a_retried_job_waits_its_backoff_before_it_is_placed_again(
    store_location: str, gateway: FakeGateway
) -> None:
    """On the real clock: rounds run until the job is placed again, which is no sooner
    than its backoff after it was retried (a slow machine: later)."""
    with stepped(store_location, gateway, heartbeat_s=None, retry_backoff_s=0.4) as o:
        failures = iter([LinkFailure("link down")])
        gateway.fail = lambda job_id: next(failures, None)
        job, _ = o.submit(spec(sockets=2, steps=1))
        assert o.schedule_once() == 1
        wait_retried(o, job.id, attempts=1)
        until(lambda: o.schedule_once() == 1, "placed again after its backoff")
        assert wait_for(o, job.id) is JobState.SUCCEEDED
        states = [(e.payload["state"], e.time_s) for e in o.events(job.id) if e.kind == "state"]
        retried = next(t for s, t in states if s == "PENDING" and t > states[0][1])
        placed_again = next(t for s, t in states if s == "SCHEDULED" and t > retried)
        assert placed_again - retried >= 0.4  # at least the backoff (a slow machine: more)


def test_a_retried_jobs_backoff_doubles_with_each_attempt(
    store_location: str, gateway: FakeGateway, clock: FakeClock
) -> None:
    """On the test's clock: no round places the job before its backoff is over (times
    in binary fractions of a second, so the sums are exact)."""
    options = {"heartbeat_s": None, "retry_backoff_s": 0.5, "clock": clock}
    with stepped(store_location, gateway, **options) as o:
        failures = iter([LinkFailure("link down"), LinkFailure("link down")])
        gateway.fail = lambda job_id: next(failures, None)
        job, _ = o.submit(spec(sockets=2, steps=1))
        assert o.schedule_once() == 1
        wait_retried(o, job.id, attempts=1)
        clock.advance(0.25)
        assert o.schedule_once() == 0  # within its backoff (0.5 s after a first attempt)
        clock.advance(0.25)
        assert o.schedule_once() == 1
        wait_retried(o, job.id, attempts=2)
        clock.advance(0.75)
        assert o.schedule_once() == 0  # the backoff doubled: 1 s after a second attempt
        clock.advance(0.25)
        assert o.schedule_once() == 1
        assert wait_for(o, job.id) is JobState.SUCCEEDED
        assert o.get(job.id).attempts == 3


def test_a_coe_job_that_loses_one_replica_is_served_by_the_other_without_a_retry(
    orch: Orchestrator, gateway: FakeGateway, clock: FakeClock
) -> None:
    job, _ = orch.submit(coe(num_experts=20, num_sockets=16, prompts=["a", "b", "c", "d"]))
    placed_at_the_gate(orch, gateway, job.id)  # the replicas' programs wait
    gateway.silent.add(1)  # replica 1 is node 1's: its agent goes silent
    clock.advance(DEAD_AFTER_S + 0.01)
    assert [c.what for c in orch.supervise_once()] == ["node 1's agent"]
    assert orch.health is not None and not orch.health.node(1).healthy
    gateway.gate.set()
    assert wait_for(orch, job.id) is JobState.SUCCEEDED
    done = orch.get(job.id)
    assert done.attempts == 1 and not retry_reasons(orch, job.id)
    assert isinstance(done.result, CoeResult) and done.result.failed_replicas == (1,)
    served = {r.replica for r in done.result.per_request}
    assert served == {0} and len(done.result.per_request) == 4
