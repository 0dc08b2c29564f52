"""A serve job on the wire and in the CLI's views: PHASE_SERVE and speculative decoding in
a KernelJob (both directions), a serve phase refused where a step's is needed, and a
serve job's JSON before and after its result."""

from __future__ import annotations

import pytest
from google.protobuf import json_format

from rdurack.cli.views import job_dict, serve_fields
from rdurack.errors import InvalidRequest
from rdurack.orchestrator.jobs import Job, JobSpec, JobState, KernelWorkload
from rdurack.orchestrator.results import KernelResult
from rdurack.rack.models import builtin_models
from rdurack.rack.presets import platform
from rdurack.v1 import common_pb2, job_pb2, node_agent_pb2, serve_pb2
from rdurack.wire import programs
from rdurack.wire import rack as convert
from rdurack.wire.jobs import job_to_proto, spec_from_proto, spec_to_proto
from rdurack.workloads.predictor import Predictor
from rdurack.workloads.serving.batch import ServeRequest
from rdurack.workloads.serving.predict import predict_serve
from rdurack.workloads.serving.report import ServeReport
from rdurack.workloads.serving.speculative import SpeculativeSetting


def _serve_spec(**speculative: object) -> job_pb2.JobSpec:
    return job_pb2.JobSpec(
        platform="sn40l-rack16",
        kernel=job_pb2.KernelJob(
            model="llama3.1-70b",
            phase=common_pb2.PHASE_SERVE,
            sequence_length=512,
            batch_size=4,
            num_sockets=16,
            output_tokens=256,
            speculative=serve_pb2.SpeculativeDecoding(**speculative),  # type: ignore[arg-type]
        ),
    )


def test_a_serve_job_with_speculation_round_trips() -> None:
    spec = spec_from_proto(_serve_spec(draft_tokens=6, acceptance=0.0), "sn40l-rack16")
    w = spec.workload
    assert isinstance(w, KernelWorkload) and w.serves
    assert w.fusion_plan is None  # unset: the platform's decode plan
    # Set fields only: acceptance 0 is set (optional), the draft model is the default.
    assert w.speculative == SpeculativeSetting(draft_tokens=6, acceptance=0.0)
    back = spec_to_proto(spec)
    assert back.kernel.phase == common_pb2.PHASE_SERVE
    assert back.kernel.fusion_plan == common_pb2.FUSION_PLAN_UNSPECIFIED
    assert spec_from_proto(back, "sn40l-rack16") == spec
    plain = spec_from_proto(
        job_pb2.JobSpec(
            kernel=job_pb2.KernelJob(
                model="m", phase=common_pb2.PHASE_SERVE, sequence_length=8, num_sockets=8
            )
        ),
        "x",
    )
    assert isinstance(plain.workload, KernelWorkload) and plain.workload.speculative is None


def test_bad_speculative_values_name_their_field() -> None:
    with pytest.raises(InvalidRequest, match=r"^spec\.kernel\.speculative\.acceptance: "):
        spec_from_proto(_serve_spec(acceptance=1.5), "sn40l-rack16")
    with pytest.raises(InvalidRequest, match="PREFILL, DECODE, TRAIN or SERVE"):
        spec_from_proto(job_pb2.JobSpec(kernel=job_pb2.KernelJob(model="m")), "x")


def test_serve_is_refused_where_a_step_is_needed() -> None:
    with pytest.raises(InvalidRequest, match=r"SERVE is a whole batch .* PREFILL, DECODE or TRAIN"):
        convert.phase(common_pb2.PHASE_SERVE)
    op = node_agent_pb2.ProgramOp(
        kernel=node_agent_pb2.KernelOp(
            model="llama2-7b", phase=common_pb2.PHASE_SERVE, batch_size=1, sequence_length=8,
            steps=1, fusion_plan=common_pb2.FUSION_PLAN_FUSED_HO,
        )
    )  # fmt: skip
    with pytest.raises(InvalidRequest, match="not one step"):
        programs.op_from_proto(op, 0)


def _job(result: KernelResult | None = None) -> job_pb2.Job:
    workload = KernelWorkload(
        model="llama3.1-8b", phase="serve", sequence_length=128, output_tokens=64, batch_size=2
    )
    state = JobState.SUCCEEDED if result else JobState.PENDING
    return job_to_proto(Job("job-7", JobSpec(workload=workload), state, result=result))


def test_a_serve_jobs_json_is_its_report_once_it_has_one() -> None:
    request = ServeRequest("llama3.1-8b", 2, 128, 64, sockets=8)
    report = predict_serve(Predictor(platform("sn40l-rack16")), request, builtin_models())
    result = KernelResult(emulated_s=report.e2e_s, tokens_per_s=report.tokens_per_s, serve=report)
    data = job_dict(_job(result))
    predicted = report.model_dump(mode="json")
    assert {k: data[k] for k in predicted} == predicted  # the same fields and values
    assert data["itl_s"] == report.itl_s and data["breakdown"]["kv_cache_bytes"] > 0
    assert data["phase"] == "serve" and data["job_id"] == "job-7"
    # Before its result: the spec's sizes, and nulls.
    pending = job_dict(_job())
    assert set(predicted) <= set(pending)
    assert (pending["batch_size"], pending["prompt_tokens"], pending["output_tokens"]) == (
        2,
        128,
        64,
    )
    assert pending["ttft_s"] is None and pending["breakdown"] is None


def test_a_report_without_itl_reads_back_as_none() -> None:
    report = ServeReport(model="m", ttft_s=1.0, e2e_s=1.0)  # one output token
    msg = json_format.ParseDict(
        report.model_dump(mode="json", exclude_none=True), serve_pb2.ServeReport()
    )
    assert not msg.HasField("itl_s")
    job = _job(KernelResult(serve=report))
    assert serve_fields(job)["itl_s"] is None
    assert serve_fields(job)["tokens_per_s_per_user"] is None
