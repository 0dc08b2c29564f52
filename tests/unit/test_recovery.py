"""Fault recovery in the orchestrator core, with an in-memory gateway: a dead socket
or agent is noticed by heartbeat, its job's run is stopped at once (the survivors'
calls aborted) and the job retried elsewhere; GetRack's view says what is down, since
when and why."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from rdurack.errors import LinkFailure
from rdurack.orchestrator.jobs import JobState
from rdurack.orchestrator.orchestrator import Orchestrator
from rdurack.orchestrator.store import JobStore
from tests.support.fake_rack import RACK, FakeGateway, coe, spec, wait_for

# Fast watcher for tests: the real defaults are 0.5 s and 2 s.
HEARTBEAT_S = 0.05
DEAD_AFTER_S = 0.3


@pytest.fixture
def gateway() -> FakeGateway:
    return FakeGateway()


@pytest.fixture
def orch(tmp_path: Path, gateway: FakeGateway) -> Iterator[Orchestrator]:
    o = Orchestrator(
        JobStore(tmp_path / "jobs.sqlite"),
        gateway,
        RACK,
        poll_s=0.05,
        heartbeat_s=HEARTBEAT_S,
        dead_after_s=DEAD_AFTER_S,
        retry_backoff_s=0.0,
    )
    o.start()
    yield o
    gateway.gate.set()
    o.stop()
    o.store.close()


def wait_state(
    orch: Orchestrator, job_id: str, states: set[JobState], timeout_s: float = 10
) -> None:
    deadline = time.monotonic() + timeout_s
    while orch.get(job_id).state not in states:
        assert time.monotonic() < deadline, f"{job_id} still {orch.get(job_id).state}"
        time.sleep(0.01)


def retry_reasons(orch: Orchestrator, job_id: str) -> list[str]:
    return [
        str(e.payload["reason"])
        for e in orch.events(job_id)
        if e.kind == "state" and str(e.payload.get("reason", "")).startswith("retrying")
    ]


def test_a_dead_socket_stops_its_job_at_once_and_the_job_runs_elsewhere(
    orch: Orchestrator, gateway: FakeGateway
) -> None:
    gateway.dead_fails_at_once = False  # the survivors wait: only an abort ends the run
    gateway.gate.clear()
    job, _ = orch.submit(spec(sockets=8, steps=4))
    wait_state(orch, job.id, {JobState.RUNNING})
    first = orch.get(job.id).sockets
    victim = first[3]
    gateway.dead.add(victim)
    # Noticed by heartbeat, its run aborted: the job leaves RUNNING for a retry.
    deadline = time.monotonic() + 10
    while not retry_reasons(orch, job.id):
        assert time.monotonic() < deadline, "the dead socket's job was not stopped"
        time.sleep(0.01)
    (reason,) = retry_reasons(orch, job.id)
    assert victim in reason and "socket actor dead" in reason, reason
    assert any(j == job.id and victim in why for j, why in gateway.abort_log)
    gateway.gate.set()
    assert wait_for(orch, job.id) is JobState.SUCCEEDED
    done = orch.get(job.id)
    assert victim not in done.sockets and done.attempts == 2
    down = {s.socket_id: s for n in orch.rack() for s in n.sockets if not s.healthy}
    assert set(down) == {victim}
    assert "socket actor dead" in down[victim].reason and down[victim].since_s is not None


def test_an_agent_that_goes_silent_fails_its_job_over_to_the_other_node(
    orch: Orchestrator, gateway: FakeGateway
) -> None:
    gateway.gate.clear()
    job, _ = orch.submit(spec(sockets=8, steps=4))
    wait_state(orch, job.id, {JobState.RUNNING})
    node = int(orch.get(job.id).sockets[0].split("-")[1][1:])
    gateway.silent.add(node)
    deadline = time.monotonic() + 10
    while not retry_reasons(orch, job.id):
        assert time.monotonic() < deadline
        time.sleep(0.01)
    gateway.gate.set()
    assert wait_for(orch, job.id) is JobState.SUCCEEDED
    assert {s.split("-")[1] for s in orch.get(job.id).sockets} == {f"n{1 - node}"}
    # The watcher marks the node down within dead_after_s; GetRack lists its sockets
    # down with the reason, though the agent reports none.
    deadline = time.monotonic() + 10
    while orch.health is not None and orch.health.node(node).healthy:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    view = next(n for n in orch.rack() if n.index == node)
    assert not view.healthy and len(view.sockets) == RACK.node.sockets
    assert all(not s.healthy and s.since_s is not None for s in view.sockets)


def test_when_one_node_of_a_job_fails_its_other_node_is_aborted(
    tmp_path: Path, gateway: FakeGateway
) -> None:
    """No watcher: a job's own failure on node 1 stops its part on node 0 at once,
    which would otherwise wait for node 1's messages until its timeout."""
    o = Orchestrator(
        JobStore(tmp_path / "jobs.sqlite"), gateway, RACK, poll_s=0.05, heartbeat_s=None
    )
    o.max_attempts = 1
    o.start()
    try:
        gateway.gate.clear()  # node 0 waits until aborted
        gateway.fail_node = 1
        job, _ = o.submit(spec(sockets=16, steps=2))
        assert wait_for(o, job.id) is JobState.FAILED
        assert any(
            j == job.id and "another node of the job failed" in why for j, why in gateway.abort_log
        )
        assert "link down" in o.get(job.id).error
    finally:
        gateway.gate.set()
        o.stop()
        o.store.close()


def test_a_retried_job_waits_its_backoff_before_it_is_placed_again(
    tmp_path: Path, gateway: FakeGateway
) -> None:
    o = Orchestrator(
        JobStore(tmp_path / "jobs.sqlite"),
        gateway,
        RACK,
        poll_s=0.01,
        heartbeat_s=None,
        retry_backoff_s=0.4,
    )
    o.start()
    try:
        failures = iter([LinkFailure("link down")])
        gateway.fail = lambda job_id: next(failures, None)
        job, _ = o.submit(spec(sockets=2, steps=1))
        assert wait_for(o, job.id) is JobState.SUCCEEDED
        states = [(e.payload["state"], e.time_s) for e in o.events(job.id) if e.kind == "state"]
        retried = next(t for s, t in states if s == "PENDING" and t > states[0][1])
        placed_again = next(t for s, t in states if s == "SCHEDULED" and t > retried)
        assert placed_again - retried >= 0.4  # at least the backoff (a slow machine: more)
    finally:
        o.stop()
        o.store.close()


def test_a_coe_job_that_loses_one_replica_is_served_by_the_other_without_a_retry(
    orch: Orchestrator, gateway: FakeGateway
) -> None:
    gateway.gate.clear()  # the replicas' programs wait
    job, _ = orch.submit(coe(num_experts=20, num_sockets=16, prompts=["a", "b", "c", "d"]))
    wait_state(orch, job.id, {JobState.RUNNING})
    gateway.silent.add(1)  # replica 1 is node 1's: its agent goes silent
    deadline = time.monotonic() + 10
    while orch.health is not None and orch.health.node(1).healthy:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    gateway.gate.set()
    assert wait_for(orch, job.id) is JobState.SUCCEEDED
    done = orch.get(job.id)
    assert done.attempts == 1 and not retry_reasons(orch, job.id)
    assert done.result is not None and done.result["failed_replicas"] == [1]
    served = {r["replica"] for r in done.result["per_request"]}
    assert served == {0} and len(done.result["per_request"]) == 4
