"""CoE inference on the emulated rack: jobs over gRPC, run by the socket actors.

PAPER Table V is reproduced by running jobs on the cluster, and checked against both the
fast predictor (within 3%) and the paper (within 15%)."""

from __future__ import annotations

import grpc
import pytest
from google.protobuf import json_format

from rdurack.cli.views import job_dict
from rdurack.rack.models import builtin_models
from rdurack.rack.presets import platform
from rdurack.v1 import common_pb2, job_pb2
from rdurack.workloads.coe.engine import expert_seed
from rdurack.workloads.coe.router import Router, tokenize
from rdurack.workloads.paper.table_v import TABLE_V_DECODE_PLAN
from rdurack.workloads.predictor import CoeSetting, Predictor, predict_coe
from rdurack.workloads.tiny_lm.generation import reference_generate
from rdurack.workloads.tiny_lm.model import TinyLM, TinyLMConfig
from tests.support.control import (
    FAILED,
    SUCCEEDED,
    Control,
    rpc_error,
    submit,
    wait_terminal,
    watch,
)

pytestmark = pytest.mark.integration
MODELS = builtin_models()
# PAPER Table V (batch 8, 20 output tokens): SN40L node vs DGX speedups.
PAPER_SPEEDUP = {"dgx-a100": 6.6, "dgx-h100": 3.7}


def coe(platform_name: str = "", functional: bool = False, **fields: object) -> job_pb2.JobSpec:
    return job_pb2.JobSpec(
        name="coe-test",
        platform=platform_name,
        coe_inference=job_pb2.CoeInferenceJob(**fields),  # type: ignore[arg-type]
        payload_mode=common_pb2.PAYLOAD_MODE_FUNCTIONAL
        if functional
        else common_pb2.PAYLOAD_MODE_TIMING,
    )


def run(control: Control, spec: job_pb2.JobSpec) -> job_pb2.Job:
    job = submit(control.jobs, spec)
    return wait_terminal(control.jobs, [job.id], timeout_s=120)[job.id]


def test_table_v_on_the_cluster_agrees_with_the_predictor_and_the_paper(
    control: Control,
) -> None:
    # The SN40L decodes as Table V is reproduced (workloads/paper/table_v.py says why).
    plan_of_table_v = common_pb2.FusionPlan.Value(f"FUSION_PLAN_{TABLE_V_DECODE_PLAN.name}")
    jobs = {
        "sn40l-rack16": run(control, coe(num_experts=100, decode_plan=plan_of_table_v)),
        "dgx-a100": run(control, coe("dgx-a100", num_experts=100)),
        "dgx-h100": run(control, coe("dgx-h100", num_experts=100)),
    }
    emulated: dict[str, float] = {}
    for name, job in jobs.items():
        assert job.state == SUCCEEDED, (name, job.error_message)
        r = job.result.coe_inference
        plan = TABLE_V_DECODE_PLAN if name == "sn40l-rack16" else None
        setting = CoeSetting(experts=100, decode_plan=plan)
        predicted = predict_coe(Predictor(platform(name)), setting, MODELS)
        assert predicted.total_s is not None
        assert r.emulated_s == pytest.approx(predicted.total_s, rel=0.03), name
        assert (job.emulated_end_ns - job.emulated_start_ns) / 1e9 == pytest.approx(r.emulated_s)
        assert r.requests == 8 and r.switches == 8 and r.platform == platform(name).name
        emulated[name] = r.emulated_s
    for dgx, paper in PAPER_SPEEDUP.items():
        speedup = emulated[dgx] / emulated["sn40l-rack16"]
        assert speedup == pytest.approx(paper, rel=0.10), (dgx, speedup)


def test_150_experts_serve_on_sn40l_and_a_dgx_reports_oom(control: Control) -> None:
    sn = run(control, coe(num_experts=150))
    assert sn.state == SUCCEEDED and not sn.result.coe_inference.oom
    dgx = run(control, coe("dgx-h100", num_experts=150))
    assert dgx.state == FAILED
    r = dgx.result.coe_inference
    assert r.oom and "host DRAM" in r.oom_reason and "143 fit" in r.oom_reason
    assert r.oom_reason in dgx.error_message
    view = job_dict(dgx)  # what `rdu submit coe --json` prints
    assert view["state"] == "FAILED" and view["oom"] is True and view["diagnostics"] == []


def test_functional_experts_generate_the_reference_tokens_over_the_links(
    control: Control,
) -> None:
    prompts = ["translate this sentence into French", "fix this python bug"]
    job = run(
        control,
        coe(
            functional=True,
            num_experts=20,
            expert_model="tiny-lm",
            prompts=prompts,
            output_tokens=6,
            seed=7,
        ),
    )
    assert job.state == SUCCEEDED, job.error_message
    router = Router.for_catalog(20)
    for request in job.result.coe_inference.per_request:
        expert = router.names.index(request.expert)
        assert expert == router.route(prompts[request.index])
        model = TinyLM(TinyLMConfig(), expert_seed(7, expert))
        reference = reference_generate(model, tokenize(prompts[request.index]), 6)
        assert list(request.tokens) == reference


def test_results_stream_over_watch_and_serialize_for_the_cli(control: Control) -> None:
    load = job_pb2.PoissonLoad(requests=200, rate_per_s=20.0, skew=1.2, seed=1)
    job = run(control, coe(num_experts=40, num_sockets=16, poisson=load))
    assert job.state == SUCCEEDED, job.error_message
    assert len({s.node_index for s in job.sockets}) == 2  # both nodes serve
    events = watch(control.jobs, job.id)
    progress = [e.progress.fraction for e in events if e.HasField("progress")]
    assert progress == sorted(progress) and progress[-1] == 1.0
    (result,) = [e.result for e in events if e.HasField("result")]
    assert result.coe_inference == job.result.coe_inference
    r = job.result.coe_inference
    assert r.requests == 200 and 0 < r.hbm_hit_rate < 1 and r.p50_latency_s <= r.p99_latency_s
    assert {q.replica for q in r.per_request} == {0, 1}
    assert sum(r.switches_per_expert.values()) == r.switches
    view = job_dict(job)
    for key in ("emulated_s", "requests", "tokens_per_s", "switch_s", "hbm_hit_rate", "oom"):
        assert view[key] is not None, key
    assert json_format.MessageToDict(r)  # the result is a well-formed message


def test_two_processes_on_one_socket_are_refused_with_the_rule(control: Control) -> None:
    err = rpc_error(
        lambda: control.jobs.SubmitJob(
            job_pb2.SubmitJobRequest(spec=coe(num_sockets=4, tensor_parallel=8)), timeout=30
        )
    )
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "one process per socket" in (err.details() or "")
