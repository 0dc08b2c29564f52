"""Endpoint jobs (`rdu serve --rack`): the orchestrator holds a model's sockets until the
job is cancelled, and runs the endpoint's passes on them (orchestrator/kinds/endpoint.py),
here on the fake gateway."""

from __future__ import annotations

from pathlib import Path

import pytest

from rdurack.errors import InvalidRequest, LinkFailure
from rdurack.orchestrator.jobs import EndpointWorkload, JobSpec, JobState
from rdurack.rack.kernels import FusionPlan, Shape
from rdurack.rack.topology import SocketId
from rdurack.v1 import job_pb2
from rdurack.wire.jobs import spec_from_proto, spec_to_proto
from rdurack.wire.passes import pass_to_proto, passes_from_proto
from rdurack.workloads.serving.stream.bundle import BundleLayout
from rdurack.workloads.serving.stream.pricing import Pass
from tests.support.fake_rack import STEP_NS, FakeGateway, spec, stepped, until, wait_for

DECODE = Pass(FusionPlan.KERNEL_LOOPED, (Shape(4, 1, 300),), 4, False)


def endpoint(model: str = "llama3.1-8b", sockets: int = 2) -> JobSpec:
    return JobSpec(workload=EndpointWorkload(model=model, num_sockets=sockets))


def bundle(
    router: str = "llama2-7b", sockets: int = 8, experts: int = 150, region: int = 20
) -> JobSpec:
    layout = BundleLayout(experts=experts, router_model=router, region_experts=region)
    w = EndpointWorkload(model="llama2-7b", num_sockets=sockets, bundle=layout)
    return JobSpec(workload=w)


def test_an_endpoint_job_runs_passes_on_its_sockets_until_cancelled(tmp_path: Path) -> None:
    gw = FakeGateway()
    with stepped(tmp_path / "jobs.sqlite", gw) as o:
        job, _ = o.submit(endpoint())
        o.schedule_once()
        until(lambda: o.get(job.id).state is JobState.RUNNING, "the endpoint job runs")
        durations, start = o.run_passes(job.id, 5_000, [DECODE, DECODE], kv_tokens=1_200)
        assert durations == [STEP_NS, STEP_NS]
        assert start == o.get(job.id).emulated_start_ns
        assert gw.kv_tokens[job.id] == 1_200
        sockets = o.get(job.id).sockets
        assert len(sockets) == 2
        assert all(gw.clock[s] == start + 5_000 + 2 * STEP_NS for s in sockets)
        assert all(gw.held.get(s) == job.id for s in sockets)  # held between passes too

        with pytest.raises(InvalidRequest, match="offset_ns: "):
            o.run_passes(job.id, 1 << 62, [DECODE], 0)
        with pytest.raises(InvalidRequest, match="passes: at least one"):
            o.run_passes(job.id, 0, [], 0)

        o.cancel(job.id)
        assert wait_for(o, job.id) is JobState.CANCELLED
        with pytest.raises(LinkFailure, match="not running on its sockets now"):
            o.run_passes(job.id, 0, [DECODE], 0)


def test_a_failed_node_fails_the_pass_and_the_next_one_runs(tmp_path: Path) -> None:
    gw = FakeGateway()
    with stepped(tmp_path / "jobs.sqlite", gw) as o:
        job, _ = o.submit(endpoint())
        o.schedule_once()
        until(lambda: o.get(job.id).state is JobState.RUNNING, "the endpoint job runs")
        gw.fail_node = SocketId.parse(o.get(job.id).sockets[0]).node
        with pytest.raises(LinkFailure, match="link down"):
            o.run_passes(job.id, 0, [DECODE], 0)
        gw.fail_node = None
        assert o.run_passes(job.id, 0, [DECODE], 0)[0] == [STEP_NS]
        o.cancel(job.id)
        wait_for(o, job.id)


def test_passes_run_on_endpoint_jobs_only(tmp_path: Path) -> None:
    with stepped(tmp_path / "jobs.sqlite", FakeGateway()) as o:
        job, _ = o.submit(spec(sockets=2, steps=1))
        with pytest.raises(InvalidRequest, match="kernel job; passes run on endpoint jobs"):
            o.run_passes(job.id, 0, [DECODE], 0)


@pytest.mark.parametrize(
    ("job", "message"),
    [
        (endpoint(model="gpt-9"), "spec.endpoint.model: unknown model 'gpt-9'"),
        (endpoint(model="llama3.1-405b", sockets=1), "spec.endpoint.num_sockets: "),
        (endpoint(sockets=3), "spec.endpoint.num_sockets: .*must divide heads"),
        (endpoint(sockets=24), "num_sockets: 24 sockets asked; the rack has 16"),
        (bundle(router="nope"), "spec.endpoint.bundle.router_model: unknown model 'nope'"),
        (bundle(sockets=16), "spec.endpoint.bundle: .*one node: 16 sockets > 8"),
        (bundle(region=60), r"spec.endpoint.bundle: .*GB of hbm per socket on 8 sockets"),
        (bundle(experts=5000, region=1), r"spec.endpoint.bundle: .*GB of ddr per socket"),
    ],
)
def test_an_endpoint_job_that_could_never_serve_is_refused(
    tmp_path: Path, job: JobSpec, message: str
) -> None:
    with (
        stepped(tmp_path / "jobs.sqlite", FakeGateway()) as o,
        pytest.raises(InvalidRequest, match=message),
    ):
        o.submit(job)


def test_an_endpoint_spec_and_its_passes_round_trip_through_the_wire() -> None:
    for one in (endpoint("llama3.1-70b", 8), bundle()):
        assert spec_from_proto(spec_to_proto(one), "sn40l-rack16") == one
    chunk = Pass(FusionPlan.FUSED_HO, (Shape(1, 512, 1024, True), Shape(3, 1, 90)), 4, True)
    routed = Pass(FusionPlan.FUSED_HO, (Shape(2, 90, 90, True),), 2, True, "math-algebra", True,
                  (Shape(2, 90, 90, True),))  # fmt: skip
    passes = (DECODE, chunk, routed)
    assert passes_from_proto([pass_to_proto(p) for p in passes]) == list(passes)
    bad = job_pb2.JobSpec(endpoint=spec_to_proto(bundle()).endpoint)
    bad.endpoint.bundle.region_experts = 151
    with pytest.raises(
        InvalidRequest,
        match=r"^spec.endpoint.bundle: Value error, region_experts: 151 is more than the 150",
    ):
        spec_from_proto(bad, "sn40l-rack16")
    with pytest.raises(InvalidRequest, match=r"spec.endpoint.num_sockets: "):
        spec_from_proto(job_pb2.JobSpec(endpoint=job_pb2.EndpointJob(model="x")), "sn40l-rack16")
