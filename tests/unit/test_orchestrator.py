"""The orchestrator core with an in-memory gateway: scheduling, running, failures.

The tests step the orchestrator: each scheduling round a test needs, it runs
(`schedule_once`); the jobs it places run on the orchestrator's workers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rdurack.errors import (
    InvalidRequest,
    LinkFailure,
    OneProcessPerSocket,
    OutOfMemory,
    RdurackError,
    UnknownName,
)
from rdurack.orchestrator.jobs import EndpointWorkload, IllegalTransition, JobSpec, JobState
from rdurack.orchestrator.orchestrator import Orchestrator
from rdurack.orchestrator.results import CoeResult, KernelResult
from rdurack.orchestrator.store import JobStore
from rdurack.rack import kernels
from rdurack.workloads.training.job import TrainingWorkload
from tests.support.fake_rack import (
    RACK,
    STEP_FLOPS,
    STEP_NS,
    FakeClock,
    FakeGateway,
    coe,
    spec,
    stepped,
    until,
    wait_for,
    wait_retried,
)


def test_a_job_runs_to_success_with_its_result(orch: Orchestrator, gateway: FakeGateway) -> None:
    job, created = orch.submit(spec(steps=20))
    assert created and job.state is JobState.PENDING
    assert orch.schedule_once() == 1
    assert wait_for(orch, job.id) is JobState.SUCCEEDED
    done = orch.get(job.id)
    assert len(done.sockets) == 8 and {s.split("-")[1] for s in done.sockets} == {"n0"}
    assert done.emulated_end_ns - done.emulated_start_ns == 20 * STEP_NS  # type: ignore[operator]
    assert isinstance(done.result, KernelResult) and done.result.kernel_calls == 60
    assert done.result.tokens_per_s == pytest.approx(20 / (20 * STEP_NS * 1e-9))
    # Achieved FLOP/s of a socket over its peak: the sockets' FLOPs over the job's time.
    achieved = 20 * STEP_FLOPS / (20 * STEP_NS * 1e-9)
    assert done.result.compute_utilization == pytest.approx(achieved / RACK.socket.peak_flops_per_s)
    kinds = [e.kind for e in orch.events(job.id)]
    assert kinds[:4] == ["state", "state", "state", "progress"]
    assert kinds[-2:] == ["result", "state"]
    fractions = [e.payload["fraction"] for e in orch.events(job.id) if e.kind == "progress"]
    assert fractions == sorted(fractions) and fractions[-1] == 1.0
    assert not gateway.held  # sockets released


def test_a_job_starts_at_the_latest_clock_of_its_sockets(
    orch: Orchestrator, gateway: FakeGateway
) -> None:
    gateway.clock["rdu-n0-s3"] = 5_000_000
    job, _ = orch.submit(spec(sockets=8, steps=1))
    assert orch.schedule_once() == 1
    wait_for(orch, job.id)
    assert orch.get(job.id).emulated_start_ns == 5_000_000


def test_idempotent_submission(orch: Orchestrator) -> None:
    first, created = orch.submit(spec(), "req-1")
    again, created_again = orch.submit(spec(), "req-1")
    assert created and not created_again and again.id == first.id


@pytest.mark.parametrize(
    ("bad", "error", "text"),
    [
        (spec(platform="dgx-h100"), InvalidRequest, "spec.platform"),
        (spec(model="gpt-9"), InvalidRequest, "spec.kernel.model"),
        (spec(sockets=17), InvalidRequest, "spec.kernel.num_sockets"),
        (spec(sockets=3), InvalidRequest, "divide heads"),
        (spec(sockets=1, model="llama3.1-405b"), OutOfMemory, "HBM"),
        (spec(payload_mode="functional"), InvalidRequest, "spec.payload_mode"),
    ],
)
def test_impossible_jobs_are_refused_before_they_are_stored(
    orch: Orchestrator, bad: JobSpec, error: type[Exception], text: str
) -> None:
    with pytest.raises(error, match=text):
        orch.submit(bad)
    assert orch.jobs() == []


def test_a_workload_is_priced_once_to_validate_it_and_a_refused_one_every_time(
    orch: Orchestrator, monkeypatch: pytest.MonkeyPatch
) -> None:
    priced: list[str] = []
    real_step = kernels.step

    def counted_step(model: Any, *args: Any) -> Any:
        priced.append(model.name)
        return real_step(model, *args)

    monkeypatch.setattr("rdurack.orchestrator.kinds.kernel.step", counted_step)
    for _ in range(3):
        orch.validate(spec())  # the same workload: checked once, then known good
    assert priced == ["llama2-7b"]
    for _ in range(2):  # a refused workload is not remembered: it is refused each time
        with pytest.raises(OutOfMemory):
            orch.validate(spec(sockets=1, model="llama3.1-405b"))
    assert priced == ["llama2-7b", "llama3.1-405b", "llama3.1-405b"]
    # The platform is the spec's, not the workload's: a known-good workload on another
    # platform is still refused.
    with pytest.raises(InvalidRequest, match=r"spec\.platform"):
        orch.validate(spec(platform="dgx-h100"))


def test_gang_queueing_never_overcommits(orch: Orchestrator, gateway: FakeGateway) -> None:
    gateway.gate.clear()  # hold every run until the rounds below are done
    jobs = [orch.submit(spec(sockets=8))[0] for _ in range(3)]
    assert orch.schedule_once() == 2
    assert orch.schedule_once() == 0  # a further round must not place the third
    states = [orch.get(j.id).state for j in jobs]
    assert states.count(JobState.PENDING) == 1  # the rack holds two 8-socket jobs
    gateway.gate.set()
    assert [wait_for(orch, j.id) for j in jobs[:2]] == [JobState.SUCCEEDED] * 2
    assert orch.schedule_once() == 1  # their sockets are free again
    assert wait_for(orch, jobs[2].id) is JobState.SUCCEEDED
    assert gateway.max_running <= 2


def test_a_passed_over_job_keeps_its_count_across_rounds_until_it_leaves_the_queue(
    orch: Orchestrator, gateway: FakeGateway
) -> None:
    gateway.gate.clear()  # every run held: the sockets stay taken
    orch.submit(spec(sockets=1))
    assert orch.schedule_once() == 1
    wide, _ = orch.submit(spec(sockets=16))  # cannot fit while one socket is taken
    for n in (1, 2):
        orch.submit(spec(sockets=1))
        assert orch.schedule_once() == 1  # the small job behind it starts: overtaken
        assert orch.scheduler.skips == {wide.id: n}  # its count kept from round to round
    orch.cancel(wide.id)
    orch.submit(spec(sockets=1))
    assert orch.schedule_once() == 1
    assert orch.scheduler.skips == {}  # it left the queue: its count is forgotten


def test_cancel_pending_and_finished(orch: Orchestrator, gateway: FakeGateway) -> None:
    gateway.gate.clear()
    running = [orch.submit(spec(sockets=8))[0] for _ in range(2)]
    queued, _ = orch.submit(spec(sockets=8))
    assert orch.schedule_once() == 2
    assert orch.cancel(queued.id).state is JobState.CANCELLED
    cancelled_running = orch.cancel(running[0].id)
    assert cancelled_running.state is JobState.CANCELLED
    gateway.gate.set()
    assert wait_for(orch, running[1].id) is JobState.SUCCEEDED
    assert orch.get(running[0].id).state is JobState.CANCELLED  # the late worker did not win
    with pytest.raises(IllegalTransition, match="finished"):
        orch.cancel(running[1].id)
    until(lambda: not gateway.held, "the cancelled job's sockets released", timeout_s=5)
    assert not gateway.held


def test_a_link_failure_is_retried_and_a_bad_run_fails(
    orch: Orchestrator, gateway: FakeGateway, clock: FakeClock
) -> None:
    failures = {"flaky": 1}

    def fail(job_id: str) -> Exception | None:
        name = orch.get(job_id).spec.name
        if name == "flaky" and failures["flaky"] > 0:
            failures["flaky"] -= 1
            return LinkFailure("link rdu-n0-s0 -> rdu-n0-s1 is down")
        if name == "broken":
            return RdurackError("the model exploded")
        return None

    gateway.fail = fail
    flaky, _ = orch.submit(spec(name="flaky"))
    broken, _ = orch.submit(spec(name="broken"))
    assert orch.schedule_once() == 2
    assert wait_for(orch, broken.id) is JobState.FAILED
    assert orch.get(broken.id).error == "the model exploded"
    wait_retried(orch, flaky.id, attempts=1)
    assert orch.schedule_once() == 0  # its backoff (1 s after a first attempt) not over
    clock.advance(1.0)
    assert orch.schedule_once() == 1
    assert wait_for(orch, flaky.id) is JobState.SUCCEEDED
    assert orch.get(flaky.id).attempts == 2


def test_watch_streams_until_the_job_ends(orch: Orchestrator) -> None:
    job, _ = orch.submit(spec(steps=5))
    assert orch.schedule_once() == 1
    events = list(orch.watch(job.id))
    assert events[-1].kind == "state" and events[-1].payload["state"] == "SUCCEEDED"
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert list(orch.watch(job.id, after=events[-1].seq)) == []


def test_watching_an_unknown_job_fails_before_any_wait(orch: Orchestrator) -> None:
    # The first read of its events fails it: no wait for an event that cannot come.
    with pytest.raises(UnknownName, match="no-such-job"):
        next(orch.watch("no-such-job"))


def test_a_restarted_orchestrator_runs_what_was_queued(store_location: str) -> None:
    """On both stores: a SQLite file, a PostgreSQL database (tests/conftest.py)."""
    gateway = FakeGateway()
    store = JobStore(store_location)
    first = Orchestrator(store, gateway, RACK)  # never started: it only accepts
    ids = [first.submit(spec(sockets=2, steps=3))[0].id for _ in range(5)]
    store.close()
    with stepped(store_location, gateway, poll_s=0.05) as second:
        assert second.schedule_once() == 5
        assert [wait_for(second, i) for i in ids] == [JobState.SUCCEEDED] * 5


def test_wall_start_and_finish_are_recorded(orch: Orchestrator) -> None:
    job, _ = orch.submit(spec(steps=2))
    assert orch.schedule_once() == 1
    wait_for(orch, job.id)
    done = orch.get(job.id)
    assert done.started_s is not None and done.finished_s is not None
    assert done.created_s <= done.started_s <= done.finished_s


# ------------------------------------------------------------------ CoE inference


def test_a_coe_job_serves_its_requests_and_reports(orch: Orchestrator) -> None:
    job, _ = orch.submit(coe(num_experts=30, num_sockets=16, prompts=["a", "b", "c"]))
    assert orch.schedule_once() == 1
    assert wait_for(orch, job.id) is JobState.SUCCEEDED
    done = orch.get(job.id)
    assert isinstance(done.result, CoeResult) and done.result.kind == "coe_inference"
    assert done.result.requests == 3 and not done.result.oom
    assert done.emulated_end_ns is not None and done.emulated_start_ns is not None
    emulated = (done.emulated_end_ns - done.emulated_start_ns) * 1e-9
    assert emulated == pytest.approx(done.result.emulated_s, abs=1e-9)
    kinds = [e.kind for e in orch.events(job.id)]
    assert kinds.count("result") == 1 and "progress" in kinds


def test_a_dgx_that_cannot_hold_the_experts_fails_with_oom(orch: Orchestrator) -> None:
    job, _ = orch.submit(coe("dgx-a100", num_experts=150))
    assert orch.schedule_once() == 1
    assert wait_for(orch, job.id) is JobState.FAILED
    failed = orch.get(job.id)
    assert isinstance(failed.result, CoeResult) and failed.result.oom is True
    assert "143 fit" in failed.error


def test_impossible_coe_jobs_are_refused_before_they_are_stored(orch: Orchestrator) -> None:
    with pytest.raises(OneProcessPerSocket, match="one process per socket"):
        orch.submit(coe(num_sockets=4, tensor_parallel=8))
    with pytest.raises(InvalidRequest, match="dgx-a100 job runs on one emulated node"):
        orch.submit(coe("dgx-a100", num_sockets=16))
    with pytest.raises(RdurackError, match="pinned_experts"):
        orch.submit(coe(pinned_experts=["no-such-expert"]))
    with pytest.raises(RdurackError, match="tiny-lm"):
        orch.submit(coe(num_experts=4).model_copy(update={"payload_mode": "functional"}))
    with pytest.raises(InvalidRequest, match="decode_plan: fused-ho: a dgx-h100 socket runs"):
        orch.submit(coe("dgx-h100", num_experts=100, decode_plan="fused-ho"))
    assert orch.jobs() == []


# ------------------------------------------------------------------ training (validation)


def test_impossible_training_jobs_are_refused_before_they_are_stored(
    orch: Orchestrator,
) -> None:
    def training(mode: str = "functional", **fields: object) -> JobSpec:
        return JobSpec(payload_mode=mode, workload=TrainingWorkload.model_validate(fields))

    with pytest.raises(OutOfMemory, match="llama2-7b training") as err:
        orch.submit(training("timing", model="llama2-7b", world_size=2, global_batch=2))
    assert err.value.tier == "hbm" and err.value.asked_bytes > RACK.socket.hbm.capacity_bytes
    with pytest.raises(InvalidRequest, match="run it in TIMING mode"):
        orch.submit(training(model="llama3.2-1b", world_size=2, global_batch=2))
    with pytest.raises(InvalidRequest, match="run it in FUNCTIONAL mode"):
        orch.submit(training("timing"))
    with pytest.raises(InvalidRequest, match="9 sockets"):
        orch.submit(training(world_size=9, global_batch=9))  # not rail-aligned
    with pytest.raises(OneProcessPerSocket, match="one process per socket"):
        orch.submit(training(world_size=16).model_copy(update={"platform": "dgx-a100"}))
    # Under an HBM cap per socket: full training of a 4-block MLP does not fit (the
    # numbers: tier, asked, free under the cap), progressive training of it does.
    capped = TrainingWorkload(
        blocks=4, hidden=64, world_size=4, global_batch=64, hbm_cap_bytes=128_000
    )
    with pytest.raises(OutOfMemory, match="under hbm_cap_bytes 128,000") as err:
        orch.submit(JobSpec(payload_mode="functional", workload=capped))
    assert (err.value.tier, err.value.asked_bytes, err.value.free_bytes) == (
        "hbm",
        228_732,
        128_000,
    )
    assert orch.jobs() == []
    progressive = capped.model_copy(update={"strategy": "progressive"})
    orch.validate(JobSpec(payload_mode="functional", workload=progressive))


def test_a_submission_during_a_round_calls_for_another_round(
    tmp_path: Path, gateway: FakeGateway, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The scheduling thread, with a poll far beyond the test's patience: only the
    # submission's wake-up can bring the second round. It arrives at the end of the
    # first round, after the round read the queue and before the thread waits (where a
    # wake-up was once lost until the next poll).
    o = Orchestrator(JobStore(tmp_path / "jobs.sqlite"), gateway, RACK, poll_s=600)
    rounds: list[int] = []
    one_round = o.schedule_once

    def counted() -> int:
        started = one_round()
        rounds.append(started)
        if len(rounds) == 1:
            o.submit(spec(sockets=1))
        return started

    monkeypatch.setattr(o, "schedule_once", counted)
    o.start()
    try:
        until(lambda: len(rounds) >= 2, "a second round after the submission")
        assert rounds[:2] == [0, 1]  # the second round placed the job
    finally:
        o.stop()
        o.store.close()


def test_a_submission_to_a_full_rack_calls_for_a_round_only_once_a_socket_frees(
    orch: Orchestrator,
) -> None:
    model = JobSpec(workload=EndpointWorkload(model="llama3.1-8b", num_sockets=8))
    holders = [orch.submit(model)[0] for _ in range(2)]  # both nodes, until cancelled
    assert orch.schedule_once() == 2 and not orch.round_due
    until(lambda: all(orch.get(h.id).state is JobState.RUNNING for h in holders), "held")
    first, _ = orch.submit(spec(sockets=1))
    assert orch.round_due  # the last round placed jobs: whether the rack is full is news
    assert orch.schedule_once() == 0  # it is
    second, _ = orch.submit(spec(sockets=1))
    assert not orch.round_due  # a round could place nothing: none is called for
    orch.cancel(holders[0].id)
    assert orch.round_due  # a socket frees
    assert wait_for(orch, holders[0].id) is JobState.CANCELLED
    assert orch.schedule_once() == 2  # both queued jobs, on the freed node
    assert {wait_for(orch, j.id) for j in (first, second)} == {JobState.SUCCEEDED}
