"""Request bounds: every field of a request, by its proto path."""

from __future__ import annotations

import math

import pytest

from rdurack.api.job_service import JOB_BOUNDS, MAX_ID
from rdurack.errors import InvalidRequest
from rdurack.v1 import common_pb2, job_pb2, link_pb2
from rdurack.workloads.coe.spec import MAX_PROMPT_CHARS, MAX_REQUESTS
from rdurack.workloads.training.job import MAX_LOOP_BYTES


def submit(**workload: object) -> job_pb2.SubmitJobRequest:
    return job_pb2.SubmitJobRequest(spec=job_pb2.JobSpec(**workload))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("request_", "message"),
    [
        (submit(name="x" * (MAX_ID + 1)), f"spec.name: longer than {MAX_ID} characters"),
        (
            job_pb2.CancelJobRequest(job_id="j", reason="r" * 201),
            "reason: longer than 200 characters",
        ),
        (
            submit(coe_inference=job_pb2.CoeInferenceJob(prompts=["ok", "p" * 20_001])),
            f"spec.coe_inference.prompts[1]: longer than {MAX_PROMPT_CHARS} characters",
        ),
        (
            submit(coe_inference=job_pb2.CoeInferenceJob(expert_hints=["e"] * 20_001)),
            f"spec.coe_inference.expert_hints: more than {MAX_REQUESTS} entries",
        ),
        (
            submit(
                coe_inference=job_pb2.CoeInferenceJob(
                    trace=[job_pb2.CoeTraceRequest(arrival_s=0, expert="x" * 300)]
                )
            ),
            "spec.coe_inference.trace[0].expert: longer than 200 characters",
        ),
        (
            submit(
                coe_inference=job_pb2.CoeInferenceJob(
                    trace=[job_pb2.CoeTraceRequest(arrival_s=math.nan)]
                )
            ),
            "spec.coe_inference.trace[0].arrival_s: must be a finite number, got nan",
        ),
        (
            submit(training=job_pb2.TrainingJob(loop=b"x" * (MAX_LOOP_BYTES + 1))),
            f"spec.training.loop: more than {MAX_LOOP_BYTES:,} bytes",
        ),
        (
            submit(kernel=job_pb2.KernelJob(phase=99)),  # type: ignore[arg-type]
            "spec.kernel.phase: 99 is not a Phase",
        ),
        (
            job_pb2.ListJobsRequest(states=[common_pb2.JOB_STATE_RUNNING, 42]),  # type: ignore[list-item]
            "states[1]: 42 is not a JobState",
        ),
        (job_pb2.ListJobsRequest(states=[1] * 1025), "states: more than 1024 entries"),  # type: ignore[list-item]
    ],
)
def test_a_field_out_of_bounds_is_named(request_: object, message: str) -> None:
    with pytest.raises(InvalidRequest) as e:
        JOB_BOUNDS.check(request_)  # type: ignore[arg-type]
    assert str(e.value).startswith(message), str(e.value)


def test_requests_within_bounds_pass() -> None:
    ok = submit(
        name="n" * MAX_ID,
        coe_inference=job_pb2.CoeInferenceJob(
            prompts=["p" * MAX_PROMPT_CHARS], trace=[job_pb2.CoeTraceRequest(arrival_s=1.5)]
        ),
    )
    JOB_BOUNDS.check(ok)
    JOB_BOUNDS.check(submit(training=job_pb2.TrainingJob(loop=b"x" * MAX_LOOP_BYTES)))


def test_link_data_is_not_read_by_the_guard() -> None:
    """Bytes fields without a limit of their own are bounded by the message size alone:
    the guard does not copy a transfer's payload to measure it."""
    from rdurack.node_agent.links.servicer import _BOUNDS

    big = link_pb2.Delivery(header=link_pb2.TransferHeader(shape=[1] * 64), data=b"x" * 10_000)
    _BOUNDS.check(big)
    with pytest.raises(InvalidRequest, match=r"header.shape: more than 64 entries"):
        _BOUNDS.check(link_pb2.Delivery(header=link_pb2.TransferHeader(shape=[1] * 65)))
