"""JobStore: jobs survive restarts, transitions are atomic and legal, recovery settles crashes.

Every test that takes `store_location` or `store` runs on both stores: a SQLite file and
a PostgreSQL database (tests/conftest.py). Writers at once: test_store_concurrency.py."""

from __future__ import annotations

import subprocess
import sys

import pytest
from pydantic_core import PydanticSerializationError

from rdurack.errors import InvalidRequest, UnknownName
from rdurack.orchestrator.jobs import IllegalTransition, JobState
from rdurack.orchestrator.results import (
    CoeResult,
    KernelResult,
)
from rdurack.orchestrator.store import JobStore
from rdurack.rack.kernels import FusionPlan
from rdurack.workloads.coe.report import RequestResult
from tests.support.store import DONE, S, run, spec, states

# ------------------------------------------------------------------ round trips


def test_submit_get_list_round_trip_every_field(store_location: str) -> None:
    original = spec(
        "decode-7",
        priority=5,
        sockets=4,
        fusion_plan=FusionPlan.KERNEL_LOOPED,
        sequence_length=2048,
        output_tokens=16,
    )
    with JobStore(store_location) as store:
        job, created = store.submit("j1", original, client_request_id="req-1")
        assert created and job.state is S.PENDING and job.seq == 1
        result = CoeResult(
            platform="sn40l-rack16",
            tokens_per_s=1234.5,
            switches_per_expert={"e0": 2},
            per_request=(RequestResult(index=0, expert="e0", tokens=(1, 2), hit=True),),
            failed_replicas=(1,),
        )
        store.transition("j1", S.SCHEDULED, sockets=("n0.s0", "n0.s1", "n1.s0", "n1.s1"))
        store.transition("j1", S.RUNNING, attempts=1, emulated_start_ns=10)
        done = store.transition(
            "j1", S.SUCCEEDED, emulated_end_ns=2**62, result=result, error="a note"
        )
    with JobStore(store_location) as store:
        again = store.get("j1")
        assert again == done  # every field, timestamps included
        assert again.spec == original
        assert again.spec.workload == original.workload  # a kernel workload, kernel-looped
        assert again.sockets == ("n0.s0", "n0.s1", "n1.s0", "n1.s1")
        assert again.result == result
        assert (again.client_request_id, again.attempts) == ("req-1", 1)
        assert (again.emulated_start_ns, again.emulated_end_ns) == (10, 2**62)
        assert again.created_s == job.created_s and again.updated_s >= again.created_s
        assert store.list() == [again]


def test_a_fresh_job_has_empty_optional_fields(store: JobStore) -> None:
    job, _ = store.submit("j1", spec())
    got = store.get("j1")
    assert got == job
    assert got.client_request_id is None and got.result is None and got.sockets == ()
    assert got.emulated_start_ns is None and got.error == ""
    assert [(e.seq, e.kind, e.payload) for e in store.events("j1")] == [
        (1, "state", {"state": "PENDING"})
    ]


def test_list_filters_by_state_in_submission_order(store: JobStore) -> None:
    for i in range(5):
        store.submit(f"j{i}", spec(priority=i))
    store.transition("j3", S.CANCELLED)
    store.transition("j1", S.FAILED, error="boom")
    assert [j.id for j in store.list()] == ["j0", "j1", "j2", "j3", "j4"]
    assert [j.id for j in store.list({S.CANCELLED, S.FAILED})] == ["j1", "j3"]
    assert [j.id for j in store.list([S.PENDING])] == ["j0", "j2", "j4"]
    assert store.list([]) == []
    assert [j.id for j in store.list(tenant="")] == [f"j{i}" for i in range(5)]
    assert store.list(tenant="bob") == []


# ------------------------------------------------------------------ durability


def test_a_reopened_store_has_every_job_state_and_event(store_location: str) -> None:
    store = JobStore(store_location)
    for i in range(6):
        store.submit(f"j{i}", spec(priority=i % 2))
    run(store, "j0")
    store.transition("j0", S.SUCCEEDED, result=DONE)
    store.transition("j1", S.CANCELLED)
    store.transition("j2", S.SCHEDULED, sockets=("n0.s0",))
    store.add_event("j0", "progress", {"step": 1})
    before = {j.id: j for j in store.list()}
    history = {j: store.events(j) for j in before}
    store.close()

    restarted = JobStore(store_location)  # a new orchestrator process on the same file
    jobs = restarted.list()
    assert [j.id for j in jobs] == ["j0", "j1", "j2", "j3", "j4", "j5"]
    assert [j.seq for j in jobs] == [1, 2, 3, 4, 5, 6]
    assert {j.id: j for j in jobs} == before
    assert [j.state for j in jobs] == [S.SUCCEEDED, S.CANCELLED, S.SCHEDULED, *[S.PENDING] * 3]
    assert {j: restarted.events(j) for j in before} == history
    assert states(restarted, "j0") == ["PENDING", "SCHEDULED", "RUNNING", "SUCCEEDED"]
    # Submission order continues after the restart.
    assert restarted.submit("j6", spec())[0].seq == 7
    restarted.close()


def test_an_acknowledged_write_survives_a_crash_without_close(store_location: str) -> None:
    # The child stores jobs and dies without closing the store or checkpointing the WAL.
    code = (
        "import os, sys\n"
        "from rdurack.orchestrator.store import JobStore\n"
        "from rdurack.orchestrator.jobs import JobSpec, JobState, KernelWorkload\n"
        "s = JobStore(sys.argv[1])\n"
        "w = KernelWorkload(model='m', phase='decode')\n"
        "s.submit('a', JobSpec(workload=w))\n"
        "s.submit('b', JobSpec(workload=w))\n"
        "s.transition('a', JobState.SCHEDULED, sockets=('n0.s0',))\n"
        "s.transition('a', JobState.RUNNING, attempts=1)\n"
        "os._exit(0)\n"
    )
    done = subprocess.run([sys.executable, "-c", code, store_location], capture_output=True)
    assert done.returncode == 0, done.stderr.decode()
    with JobStore(store_location) as store:
        assert [(j.id, j.state) for j in store.list()] == [("a", S.RUNNING), ("b", S.PENDING)]
        assert [(j.id, j.state) for j in store.recover()] == [("a", S.PENDING)]
        assert [j.id for j in store.queued()] == ["a", "b"]


# ------------------------------------------------------------------ idempotent submission


def test_a_reused_client_request_id_returns_the_same_job(store: JobStore) -> None:
    first, created = store.submit("j1", spec("x"), client_request_id="req-1")
    assert created
    again, created = store.submit("j2", spec("x"), client_request_id="req-1")
    assert not created and again == first
    assert [j.id for j in store.list()] == ["j1"]  # nothing new was stored
    assert len(store.events("j1")) == 1
    # It still answers after the job moved on.
    store.transition("j1", S.CANCELLED)
    assert store.submit("j3", spec("x"), client_request_id="req-1")[0].state is S.CANCELLED


def test_a_reused_client_request_id_with_another_spec_is_refused(store: JobStore) -> None:
    store.submit("j1", spec("x"), client_request_id="req-1")
    with pytest.raises(InvalidRequest, match=r"req-1.*different job spec"):
        store.submit("j2", spec("x", priority=3), client_request_id="req-1")
    with pytest.raises(UnknownName):
        store.get("j2")


def test_a_duplicate_job_id_is_refused(store: JobStore) -> None:
    store.submit("j1", spec())
    with pytest.raises(InvalidRequest, match="'j1' is already"):
        store.submit("j1", spec("other"))
    with pytest.raises(InvalidRequest, match="'j1' is already"):
        store.submit("j1", spec(), client_request_id="new")
    assert len(store.list()) == 1 and store.get("j1").spec.name == "job"
    # The refused submission did not claim its request id.
    assert store.submit("j2", spec(), client_request_id="new")[1]


def test_jobs_without_a_client_request_id_never_collide(store: JobStore) -> None:
    store.submit("j1", spec())
    store.submit("j2", spec())
    assert [j.client_request_id for j in store.list()] == [None, None]


# ------------------------------------------------------------------ scheduling order


def test_queued_is_priority_first_then_fifo(store: JobStore) -> None:
    for job_id, prio in [("a", 0), ("b", 5), ("c", -1), ("d", 5), ("e", 0), ("f", 9)]:
        store.submit(job_id, spec(priority=prio))
    store.transition("f", S.SCHEDULED, sockets=("n0.s0",))  # no longer queued
    assert [j.id for j in store.queued()] == ["b", "d", "a", "e", "c"]
    assert store.any_queued()
    store.transition("f", S.PENDING, sockets=())  # placement undone: keeps its seq
    assert [j.id for j in store.queued()] == ["f", "b", "d", "a", "e", "c"]


# ------------------------------------------------------------------ transitions


def test_an_illegal_transition_raises_and_changes_nothing(store: JobStore) -> None:
    store.submit("j1", spec())
    with pytest.raises(IllegalTransition, match="PENDING; it cannot become RUNNING"):
        store.transition("j1", S.RUNNING, attempts=1)
    run(store, "j1")
    store.transition("j1", S.SUCCEEDED, result=DONE)
    before, history = store.get("j1"), store.events("j1")
    for target in JobState:
        with pytest.raises(IllegalTransition, match="finished"):
            store.transition("j1", target, error="late")
    assert store.get("j1") == before and store.events("j1") == history


def test_a_transition_cannot_rewrite_fixed_fields(store: JobStore) -> None:
    store.submit("j1", spec())
    with pytest.raises(InvalidRequest, match="cannot change priority, spec"):
        store.transition("j1", S.SCHEDULED, spec=spec("new"), priority=3)
    with pytest.raises(InvalidRequest, match="cannot change created_s, id, seq"):
        store.transition("j1", S.SCHEDULED, seq=0, id="j9", created_s=0.0)
    assert store.get("j1").state is S.PENDING and len(store.events("j1")) == 1


def test_a_result_that_is_not_json_changes_nothing(store: JobStore) -> None:
    store.submit("j1", spec())
    run(store, "j1")
    before, history = store.get("j1"), store.events("j1")
    bad = KernelResult.model_construct(emulated_s=object())  # type: ignore[arg-type]
    with pytest.raises(PydanticSerializationError):
        store.transition("j1", S.SUCCEEDED, result=bad)
    assert store.get("j1") == before and store.events("j1") == history


def test_transition_records_a_state_event(store: JobStore) -> None:
    store.submit("j1", spec())
    store.transition("j1", S.SCHEDULED, sockets=["n0.s0", "n0.s1"], reason="fits on node 0")
    job = store.get("j1")
    assert job.sockets == ("n0.s0", "n0.s1")  # a list is stored as a tuple
    last = store.events("j1")[-1]
    assert (last.seq, last.kind) == (2, "state")
    assert last.payload == {
        "state": "SCHEDULED",
        "previous": "PENDING",
        "sockets": ["n0.s0", "n0.s1"],
        "reason": "fits on node 0",
    }
    assert last.time_s == job.updated_s


def test_transition_of_an_unknown_job(store: JobStore) -> None:
    with pytest.raises(UnknownName, match=r"unknown job 'nope'$"):
        store.transition("nope", S.CANCELLED)


# ------------------------------------------------------------------ events


def test_events_after_n_returns_only_later_events(store: JobStore) -> None:
    store.submit("j1", spec())
    store.submit("j2", spec())
    assert store.add_event("j1", "progress", {"step": 1}) == 2
    assert store.add_event("j2", "progress", {"step": 1}) == 2  # seq is per job
    run(store, "j1")
    assert store.add_event("j1", "progress", {"step": 2, "note": "x"}) == 5
    assert [e.seq for e in store.events("j1")] == [1, 2, 3, 4, 5]
    later = store.events("j1", after=3)
    assert [(e.seq, e.kind) for e in later] == [(4, "state"), (5, "progress")]
    assert later[1].payload == {"step": 2, "note": "x"} and later[1].job_id == "j1"
    assert store.events("j1", after=5) == []


def test_events_and_get_of_an_unknown_job(store: JobStore) -> None:
    store.submit("j1", spec())
    for call in (
        lambda: store.get("nope"),
        lambda: store.events("nope"),
        lambda: store.add_event("nope", "progress", {}),
    ):
        with pytest.raises(UnknownName, match=r"unknown job 'nope'$") as info:
            call()
        assert info.value.accepted == []  # never the list of every job


def test_an_event_payload_that_is_not_json_is_refused(store: JobStore) -> None:
    store.submit("j1", spec())
    with pytest.raises(TypeError):
        store.add_event("j1", "progress", {"x": {1, 2}})
    assert len(store.events("j1")) == 1


# ------------------------------------------------------------------ recovery


def crashed_store(store_location: str) -> JobStore:
    """Jobs in every state, as a crash would leave them."""
    store = JobStore(store_location)
    for job_id in ("pending", "scheduled", "run1", "run3", "done", "failed", "cancelled"):
        store.submit(job_id, spec())
    store.transition("scheduled", S.SCHEDULED, sockets=("n0.s0",))
    run(store, "run1")  # started once
    run(store, "run3")  # started three times
    store.transition("run3", S.PENDING, sockets=())
    run(store, "run3")
    store.transition("run3", S.PENDING, sockets=())
    run(store, "run3")
    run(store, "done")
    store.transition("done", S.SUCCEEDED, result=DONE)
    store.transition("failed", S.FAILED, error="bad model")
    store.transition("cancelled", S.CANCELLED)
    return store


TERMINALS = ("done", "failed", "cancelled")


def test_recover_retries_running_jobs_until_max_attempts(store_location: str) -> None:
    with crashed_store(store_location) as store:
        untouched = {j: (store.get(j), store.events(j)) for j in (*TERMINALS, "pending")}
    with JobStore(store_location) as store:
        changed = store.recover(policy="retry", max_attempts=3)
        assert [(j.id, j.state) for j in changed] == [
            ("scheduled", S.PENDING),
            ("run1", S.PENDING),
            ("run3", S.FAILED),
        ]
        assert {j: (store.get(j), store.events(j)) for j in untouched} == untouched
        scheduled, run1, run3 = (store.get(j) for j in ("scheduled", "run1", "run3"))
        assert scheduled.sockets == () and scheduled.attempts == 0
        assert run1.sockets == () and run1.attempts == 1 and run1.emulated_start_ns is None
        assert run3.error == ("orchestrator restarted while the job was running (attempt 3 of 3)")
        assert run3.sockets == ("n0.s0",)  # where it ran stays on record
        assert "placement was undone" in store.events("scheduled")[-1].payload["reason"]
        assert store.events("run1")[-1].payload["reason"] == (
            "orchestrator restarted while the job was running (attempt 1 of 3); retrying"
        )
        assert store.events("run3")[-1].payload["error"] == run3.error
        assert [j.id for j in store.queued()] == ["pending", "scheduled", "run1"]
        assert store.recover() == []  # nothing left to settle


def test_recover_with_a_higher_max_attempts_retries_more(store_location: str) -> None:
    with crashed_store(store_location) as store:
        changed = store.recover(policy="retry", max_attempts=4)
        assert {j.id: j.state for j in changed} == {
            "scheduled": S.PENDING,
            "run1": S.PENDING,
            "run3": S.PENDING,
        }


def test_recover_with_the_fail_policy_fails_running_jobs(store_location: str) -> None:
    with crashed_store(store_location) as store:
        terminal = {j: store.get(j) for j in TERMINALS}
        changed = store.recover(policy="fail", max_attempts=3)
        assert {j.id: j.state for j in changed} == {
            "scheduled": S.PENDING,  # it never started: nothing was lost
            "run1": S.FAILED,
            "run3": S.FAILED,
        }
        assert store.get("run1").error == (
            "orchestrator restarted while the job was running (attempt 1 of 3)"
        )
        assert store.events("run1")[-1].payload["reason"] == "recovery policy is fail"
        assert {j: store.get(j) for j in TERMINALS} == terminal
        assert len(store.list()) == 7  # never forgotten


def test_recover_refuses_nonsense_arguments(store: JobStore) -> None:
    with pytest.raises(InvalidRequest, match="policy"):
        store.recover(policy="maybe")  # type: ignore[arg-type]
    with pytest.raises(InvalidRequest, match="max_attempts"):
        store.recover(max_attempts=0)


def test_in_memory_stores_are_independent() -> None:
    with JobStore(":memory:") as a, JobStore(":memory:") as b:
        a.submit("j1", spec())
        assert b.list() == []


def test_queued_lazily_reads_the_queue_in_order_a_page_at_a_time(store: JobStore) -> None:
    for i, priority in enumerate([0, 5, 0, 5, -1, 0, 5]):
        store.submit(f"j{i}", spec(f"j{i}", priority=priority))
    store.transition("j2", S.CANCELLED)  # left the queue
    expected = [j.id for j in store.queued()]
    assert expected == ["j1", "j3", "j6", "j0", "j5", "j4"]
    assert [j.id for j in store.queued_lazily(page=2)] == expected  # across pages
    assert [j.id for j in store.queued_lazily(page=100)] == expected  # one page
    assert store.queued_ids() == set(expected)
    # Taken one at a time, a job queued ahead of the position reached waits for the
    # next walk; one queued behind it is still met.
    walk = store.queued_lazily(page=2)
    assert next(walk).id == "j1"
    store.submit("first", spec("first", priority=9))
    store.submit("last", spec("last", priority=-5))
    assert [j.id for j in walk] == [*expected[1:], "last"]
