"""Job states and their transition table; job specs."""

from __future__ import annotations

import pickle

import pytest
from pydantic import ValidationError

from rdurack.errors import InvalidRequest
from rdurack.orchestrator.jobs import (
    TERMINAL,
    TRANSITIONS,
    IllegalTransition,
    Job,
    JobSpec,
    JobState,
    KernelWorkload,
    parse_state,
)
from rdurack.orchestrator.results import KernelResult
from rdurack.rack.kernels import FusionPlan, Phase

SPEC = JobSpec(
    workload={"kind": "kernel", "model": "llama2-7b", "phase": "decode", "num_sockets": 4}
)


def test_the_six_states_by_their_api_names() -> None:
    assert [s.value for s in JobState] == [
        "PENDING",
        "SCHEDULED",
        "RUNNING",
        "SUCCEEDED",
        "FAILED",
        "CANCELLED",
    ]
    assert {s for s in JobState if s.terminal} == TERMINAL


def test_terminal_states_never_change() -> None:
    for state in TERMINAL:
        assert TRANSITIONS[state] == frozenset()
        job = Job("j", SPEC, state=state)
        for target in JobState:
            with pytest.raises(IllegalTransition, match="finished"):
                job.moved(target)


def test_every_non_terminal_state_can_be_cancelled_or_failed() -> None:
    for state in set(JobState) - TERMINAL:
        assert {JobState.CANCELLED, JobState.FAILED} <= TRANSITIONS[state]


def test_the_happy_path_and_a_retry() -> None:
    job = Job("j", SPEC)
    job = job.moved(JobState.SCHEDULED, sockets=("rdu-n0-s0",))
    job = job.moved(JobState.RUNNING, attempts=1)
    job = job.moved(JobState.PENDING, sockets=())  # retried after a failure
    job = job.moved(JobState.SCHEDULED).moved(JobState.RUNNING, attempts=2)
    done = job.moved(JobState.SUCCEEDED, result=KernelResult(emulated_s=1.0))
    assert done.state is JobState.SUCCEEDED and done.attempts == 2
    assert job.state is JobState.RUNNING  # jobs are immutable values


def test_an_illegal_move_names_the_job_and_what_is_allowed() -> None:
    with pytest.raises(IllegalTransition) as err:
        Job("j7", SPEC).moved(JobState.RUNNING)
    assert (
        str(err.value)
        == "job j7 is PENDING; it cannot become RUNNING (allowed: CANCELLED, FAILED, SCHEDULED)"
    )
    again = pickle.loads(pickle.dumps(err.value))
    assert str(again) == str(err.value)


def test_specs_validate_with_field_paths() -> None:
    w = SPEC.workload
    assert isinstance(w, KernelWorkload)
    assert w.phase is Phase.DECODE and w.fusion_plan is FusionPlan.FUSED_HO
    assert SPEC.sockets == 4
    with pytest.raises(ValidationError) as err:
        JobSpec(workload={"kind": "kernel", "model": "x", "phase": "decode", "num_sockets": 0})
    assert err.value.errors()[0]["loc"] == ("workload", "kernel", "num_sockets")
    with pytest.raises(ValidationError):
        JobSpec(workload={"kind": "dance", "model": "x", "phase": "decode"})
    with pytest.raises(ValidationError):
        JobSpec(priority=5000, workload={"kind": "kernel", "model": "x", "phase": "decode"})


def test_parse_state_accepts_api_names_only() -> None:
    assert parse_state("running") is JobState.RUNNING
    with pytest.raises(InvalidRequest, match="PENDING"):
        parse_state("sleeping")
