"""An orchestrator killed mid-run: restarted on its store (both stores), or taken over by
a second replica on a shared PostgreSQL store. Every acknowledged job finishes, none is
lost and none is run twice. The orchestrators are processes (tests/support/
orchestrators.py) on the session's two node agents."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from rdurack.api.server import channel
from rdurack.orchestrator.leadership import LEASE_TTL_S, RENEWALS_PER_TTL
from rdurack.orchestrator.store import JobStore
from rdurack.v1 import common_pb2, job_pb2, job_pb2_grpc, rack_pb2, rack_pb2_grpc
from tests.support.agents import ServedAgent
from tests.support.control import (
    SUCCEEDED,
    TERMINAL,
    held_sockets,
    kernel,
    list_all,
    release_held,
    state_changes,
    submit,
    wait_terminal,
    watch,
)
from tests.support.fake_rack import until
from tests.support.orchestrators import Process, restart_specs

pytestmark = pytest.mark.integration

# docs/control-plane.md: a dead leader's lease expires at most a TTL after its last
# renewal and a follower claims it within one claim interval (Elector.takeover_bound_s).
TAKEOVER_BOUND_S = LEASE_TTL_S * (1 + 1 / RENEWALS_PER_TTL)
# What a loaded machine may add: the follower's claiming thread waits for a core.
LOAD_SLACK_S = 4.0


def test_killed_orchestrator_restarts_and_finishes_every_job(
    rack: list[ServedAgent], tmp_path: Path, store_location: str
) -> None:
    """On both stores: SQLite, the default in the state dir (store_location is that
    file), and PostgreSQL, which --store names."""
    agents = [a.server.address for a in rack]
    state = tmp_path / "state"
    store = store_location if store_location.startswith("postgresql://") else ""
    started: list[Process] = []
    ids: list[str] = []
    try:
        first = Process(state, agents, tmp_path, "first", store)
        started.append(first)
        with channel(first.ready()) as ch:
            stub = job_pb2_grpc.JobServiceStub(ch)
            specs = restart_specs()
            ids += [submit(stub, s).id for s in specs[:6]]
            deadline = time.monotonic() + 60
            while sum(j.state in TERMINAL for j in list_all(stub) if j.id in ids) < 3:
                assert time.monotonic() < deadline, "the first jobs did not finish"
                time.sleep(0.02)
            ids += [submit(stub, s).id for s in specs[6:]]  # each acknowledged = stored
        first.proc.send_signal(signal.SIGKILL)
        first.proc.wait(timeout=30)
        assert len(set(ids)) == 20

        # What the killed orchestrator left in its store: some finished, some not.
        with JobStore(store_location) as left:
            at_kill = {j.id: j.state.value for j in left.list()}
        assert sorted(at_kill) == sorted(ids)
        finished = [i for i, s in at_kill.items() if s in ("SUCCEEDED", "FAILED", "CANCELLED")]
        assert len(finished) >= 3, at_kill
        assert len(finished) < 20, "every job finished before the kill: nothing to recover"
        was_running = [i for i, s in at_kill.items() if s == "RUNNING"]

        second = Process(state, agents, tmp_path, "second", store)
        started.append(second)
        with channel(second.ready()) as ch:
            stub = job_pb2_grpc.JobServiceStub(ch)
            listed = list_all(stub)
            assert sorted(j.id for j in listed) == sorted(ids), "a job was lost or invented"
            for j in listed:
                if at_kill[j.id] in ("SUCCEEDED", "FAILED", "CANCELLED"):
                    assert common_pb2.JobState.Name(j.state) == f"JOB_STATE_{at_kill[j.id]}"
            jobs = wait_terminal(stub, ids, timeout_s=120)
            failed = {
                i: (j.state, j.error_message) for i, j in jobs.items() if j.state != SUCCEEDED
            }
            assert not failed, failed
            for i in ids:
                assert jobs[i].result.kernel.emulated_s > 0
                assert jobs[i].emulated_end_ns > jobs[i].emulated_start_ns
            for i in was_running:  # their lost run was retried, and the history says so
                reasons = [c.reason for c in state_changes(watch(stub, i))]
                assert any("restarted" in r for r in reasons), reasons

            # No socket is left reserved for any of these jobs, restart or not...
            deadline = time.monotonic() + 10
            while (held := {s: j for s, j in held_sockets(rack).items() if j in ids}) and (
                time.monotonic() < deadline
            ):
                time.sleep(0.1)
            # ...so the whole rack is usable again: a 16-socket job runs.
            wide = submit(stub, kernel(sockets=16, tokens=20, name="after-restart")).id
            ids.append(wide)
            try:
                ran = wait_terminal(stub, [wide], timeout_s=20)[wide]
            except AssertionError:
                stub.CancelJob(job_pb2.CancelJobRequest(job_id=wide), timeout=30)
                raise AssertionError(
                    "a 16-socket job cannot start after the restart; sockets still reserved "
                    f"on the agents for finished jobs: {held}"
                ) from None
            assert ran.state == SUCCEEDED, ran.error_message
            assert not held, f"sockets left reserved after every job finished: {held}"
        second.proc.send_signal(signal.SIGTERM)
        assert second.proc.wait(timeout=30) == 0, second.err.read_text()[-2000:]
    finally:
        for p in started:
            p.stop()
        release_held(rack, ids)


def test_the_leader_killed_mid_run_is_taken_over_and_nothing_is_lost_or_run_twice(
    rack: list[ServedAgent], tmp_path: Path, postgres_url: str
) -> None:
    agents = [a.server.address for a in rack]
    started: list[Process] = []
    ids: list[str] = []
    try:
        a = Process(tmp_path / "a", agents, tmp_path, "a", postgres_url, ["--replica", "a"])
        started.append(a)
        a_address = a.ready()
        b = Process(tmp_path / "b", agents, tmp_path, "b", postgres_url, ["--replica", "b"])
        started.append(b)
        b_address = b.ready()
        assert "orchestrator a leads" in a.out.read_text()
        assert "orchestrator b follows a" in b.out.read_text()
        with JobStore(postgres_url) as store, channel(a_address) as ca, channel(b_address) as cb:
            to_a, to_b = job_pb2_grpc.JobServiceStub(ca), job_pb2_grpc.JobServiceStub(cb)
            specs = restart_specs()
            # Both replicas accept; only a, the leader, runs them.
            ids += [submit(to_a if i % 2 else to_b, s).id for i, s in enumerate(specs[:10])]
            until(
                lambda: any(j.state.value == "RUNNING" for j in store.list()),
                "a job runs on a",
                60,
            )
            a.proc.send_signal(signal.SIGKILL)
            killed_at = time.time()
            a.proc.wait(timeout=30)
            # A stream of jobs goes on through the failover: b accepts while nobody leads.
            ids += [submit(to_b, s).id for s in specs[10:]]
            at_kill = {j.id: j.state.value for j in store.list()}
            assert len(set(ids)) == 20 and sorted(at_kill) == sorted(ids)
            assert any(s not in ("SUCCEEDED", "FAILED", "CANCELLED") for s in at_kill.values())

            jobs = wait_terminal(to_b, ids, timeout_s=180)
            failed = {
                i: (j.state, j.error_message) for i, j in jobs.items() if j.state != SUCCEEDED
            }
            assert not failed, failed  # 0 lost: every acknowledged job finished, on b
            assert store.lease().holder == "b" and store.lease().epoch == 2
            # What a client sees: b answers that it leads, in the second term.
            seen = rack_pb2_grpc.RackServiceStub(cb).GetRack(rack_pb2.GetRackRequest(), timeout=30)
            control = seen.rack.control_plane
            assert (control.replica, control.leader, control.term) == ("b", "b", 2)

            # b's term began when it first wrote: its recovery, or its first placement.
            histories = {i: [e for e in store.events(i) if e.kind == "state"] for i in ids}
            b_first = min(
                e.time_s for h in histories.values() for e in h if e.payload.get("term") == 2
            )
            took_over_s = b_first - killed_at
            assert took_over_s <= TAKEOVER_BOUND_S + LOAD_SLACK_S, took_over_s

            for job_id, history in histories.items():
                moves = [(e.payload["state"], e.payload.get("term")) for e in history]
                terms = [t for _, t in moves if t is not None]
                assert terms == sorted(terms) and set(terms) <= {1, 2}, moves  # a, then b
                assert [s for s, _ in moves].count("SUCCEEDED") == 1, moves  # 0 twice
                runs = [t for s, t in moves if s == "RUNNING"]
                assert runs.count(2) <= 1 and runs.count(1) <= 1, moves
                if runs == [1, 2]:  # a's run was lost with a: b's recovery says so
                    retried = next(e for e in history if e.payload.get("term") == 2)
                    assert retried.payload["state"] == "PENDING", moves
                    assert "restarted" in retried.payload["reason"], retried.payload
                assert jobs[job_id].result.kernel.emulated_s > 0

            until(
                lambda: not {s for s, j in held_sockets(rack).items() if j in ids}, "released", 60
            )
        b.proc.send_signal(signal.SIGTERM)
        assert b.proc.wait(timeout=60) == 0, b.err.read_text()[-2000:]
        with JobStore(postgres_url) as store:
            assert not store.lease().live  # b gave the lease up as it stopped
    finally:
        for p in started:
            p.stop()
        release_held(rack, ids)
