"""The wire contracts in proto/rdurack/v1: generated modules, services, enums, round trips.

These pin the first version of the API: renaming or dropping a method, a job state or a
field the tests use is a breaking change and must be deliberate.
"""

from __future__ import annotations

import pytest
from google.protobuf import descriptor_pb2
from google.protobuf.descriptor import FileDescriptor

from rdurack.v1 import (
    admin_pb2,
    admin_pb2_grpc,
    common_pb2,
    fault_pb2,
    job_pb2,
    job_pb2_grpc,
    link_pb2,
    link_pb2_grpc,
    node_agent_pb2,
    node_agent_pb2_grpc,
    rack_pb2,
    rack_pb2_grpc,
    serve_pb2,
    served_pb2,
)

FILES: dict[str, FileDescriptor] = {
    "common": common_pb2.DESCRIPTOR,
    "job": job_pb2.DESCRIPTOR,
    "rack": rack_pb2.DESCRIPTOR,
    "node_agent": node_agent_pb2.DESCRIPTOR,
    "link": link_pb2.DESCRIPTOR,
    "fault": fault_pb2.DESCRIPTOR,
    "admin": admin_pb2.DESCRIPTOR,
    "serve": serve_pb2.DESCRIPTOR,
    "served": served_pb2.DESCRIPTOR,
}

# file -> service -> method -> (client streaming, server streaming)
SERVICES: dict[str, dict[str, dict[str, tuple[bool, bool]]]] = {
    "common": {},
    "job": {
        "JobService": {
            "SubmitJob": (False, False),
            "GetJob": (False, False),
            "ListJobs": (False, False),
            "CancelJob": (False, False),
            "WatchJob": (False, True),
            "RunPasses": (False, False),
            "GetJobLogs": (False, False),
        },
    },
    "rack": {
        "RackService": {
            "GetRack": (False, False),
            "ListNodes": (False, False),
            "RegisterNode": (False, False),
        },
    },
    "node_agent": {
        # Health is the standard grpc.health.v1 service, not redefined here.
        "NodeAgentService": {
            "GetNode": (False, False),
            "ReserveSockets": (False, False),
            "ReleaseSockets": (False, False),
            "RunKernel": (False, False),
            "RunPasses": (False, False),
            "Collective": (False, False),
            "RunProgram": (False, False),
            "RunTraining": (False, False),
            "Heartbeat": (False, False),
            "AbortJob": (False, False),
            "InjectFault": (False, False),
            "ClearFaults": (False, False),
            "ListFaults": (False, False),
        },
    },
    "fault": {},
    "serve": {},
    "admin": {
        "AdminService": {
            "KillSocket": (False, False),
            "KillAgent": (False, False),
            "SlowSocket": (False, False),
            "DropLink": (False, False),
            "DelayLink": (False, False),
            "Partition": (False, False),
            "Heal": (False, False),
            "ListFaults": (False, False),
        },
    },
    "link": {
        "LinkService": {
            "Transfer": (True, False),
            "Deliver": (False, False),
            "Ping": (False, False),
        },
    },
}


@pytest.mark.parametrize("name", sorted(FILES))
def test_every_file_is_in_package_rdurack_v1(name: str) -> None:
    descriptor = FILES[name]
    assert descriptor.package == "rdurack.v1"
    assert descriptor.name == f"rdurack/v1/{name}.proto"
    as_proto = descriptor_pb2.FileDescriptorProto()
    descriptor.CopyToProto(as_proto)
    assert as_proto.syntax == "proto3"


def test_grpc_modules_expose_stubs_servicers_and_registration() -> None:
    assert callable(job_pb2_grpc.JobServiceStub)
    assert callable(job_pb2_grpc.add_JobServiceServicer_to_server)
    assert issubclass(job_pb2_grpc.JobServiceServicer, object)
    assert callable(rack_pb2_grpc.RackServiceStub)
    assert callable(rack_pb2_grpc.add_RackServiceServicer_to_server)
    assert issubclass(rack_pb2_grpc.RackServiceServicer, object)
    assert callable(node_agent_pb2_grpc.NodeAgentServiceStub)
    assert callable(node_agent_pb2_grpc.add_NodeAgentServiceServicer_to_server)
    assert issubclass(node_agent_pb2_grpc.NodeAgentServiceServicer, object)
    assert callable(link_pb2_grpc.LinkServiceStub)
    assert callable(link_pb2_grpc.add_LinkServiceServicer_to_server)
    assert issubclass(link_pb2_grpc.LinkServiceServicer, object)
    # The servicer base classes carry one method per RPC, named as in the proto.
    for servicer, service in [
        (job_pb2_grpc.JobServiceServicer, SERVICES["job"]["JobService"]),
        (rack_pb2_grpc.RackServiceServicer, SERVICES["rack"]["RackService"]),
        (node_agent_pb2_grpc.NodeAgentServiceServicer, SERVICES["node_agent"]["NodeAgentService"]),
        (link_pb2_grpc.LinkServiceServicer, SERVICES["link"]["LinkService"]),
        (admin_pb2_grpc.AdminServiceServicer, SERVICES["admin"]["AdminService"]),
    ]:
        for method in service:
            assert callable(getattr(servicer, method)), (servicer.__name__, method)


@pytest.mark.parametrize("name", sorted(SERVICES))
def test_each_file_defines_exactly_the_expected_services_and_methods(name: str) -> None:
    descriptor = FILES[name]
    expected = SERVICES[name]
    assert set(descriptor.services_by_name) == set(expected)
    for service_name, methods in expected.items():
        service = descriptor.services_by_name[service_name]
        assert service.full_name == f"rdurack.v1.{service_name}"
        assert set(service.methods_by_name) == set(methods)
        for method_name, (client_streaming, server_streaming) in methods.items():
            method = service.methods_by_name[method_name]
            assert (method.client_streaming, method.server_streaming) == (
                client_streaming,
                server_streaming,
            ), f"{service_name}.{method_name}"


def test_streaming_methods_carry_the_documented_messages() -> None:
    watch = job_pb2.DESCRIPTOR.services_by_name["JobService"].methods_by_name["WatchJob"]
    assert watch.input_type.full_name == "rdurack.v1.WatchJobRequest"
    assert watch.output_type.full_name == "rdurack.v1.JobEvent"
    transfer = link_pb2.DESCRIPTOR.services_by_name["LinkService"].methods_by_name["Transfer"]
    assert transfer.input_type.full_name == "rdurack.v1.TransferChunk"
    assert transfer.output_type.full_name == "rdurack.v1.TransferAck"


def test_job_state_has_the_six_states_in_lifecycle_order() -> None:
    enum = common_pb2.DESCRIPTOR.enum_types_by_name["JobState"]
    assert [(value.name, value.number) for value in enum.values] == [
        ("JOB_STATE_UNSPECIFIED", 0),
        ("JOB_STATE_PENDING", 1),
        ("JOB_STATE_SCHEDULED", 2),
        ("JOB_STATE_RUNNING", 3),
        ("JOB_STATE_SUCCEEDED", 4),
        ("JOB_STATE_FAILED", 5),
        ("JOB_STATE_CANCELLED", 6),
    ]
    # The module-level constants the code uses match the descriptor.
    assert [
        common_pb2.JOB_STATE_PENDING,
        common_pb2.JOB_STATE_SCHEDULED,
        common_pb2.JOB_STATE_RUNNING,
        common_pb2.JOB_STATE_SUCCEEDED,
        common_pb2.JOB_STATE_FAILED,
        common_pb2.JOB_STATE_CANCELLED,
    ] == [1, 2, 3, 4, 5, 6]


def test_tier_enum_names_the_three_tiers() -> None:
    enum = common_pb2.DESCRIPTOR.enum_types_by_name["Tier"]
    assert [value.name for value in enum.values] == [
        "TIER_UNSPECIFIED",
        "TIER_SRAM",
        "TIER_HBM",
        "TIER_DDR",
    ]


@pytest.mark.parametrize("name", sorted(FILES))
def test_every_enum_starts_with_unspecified_zero(name: str) -> None:
    enums = list(FILES[name].enum_types_by_name.values())
    enums += [
        nested
        for message in FILES[name].message_types_by_name.values()
        for nested in message.enum_types
    ]
    for enum in enums:
        first = enum.values[0]
        assert first.number == 0, enum.full_name
        assert first.name.endswith("_UNSPECIFIED"), enum.full_name


def _kernel_spec() -> job_pb2.JobSpec:
    return job_pb2.JobSpec(
        name="llama decode",
        priority=5,
        platform="sn40l-rack16",
        client_request_id="req-0001",
        payload_mode=common_pb2.PAYLOAD_MODE_TIMING,
        kernel=job_pb2.KernelJob(
            model="llama2-7b",
            phase=common_pb2.PHASE_DECODE,
            fusion_plan=common_pb2.FUSION_PLAN_KERNEL_LOOPED,
            sequence_length=4096,
            batch_size=8,
            num_sockets=16,
            output_tokens=128,
        ),
    )


def test_job_spec_with_kernel_job_round_trips() -> None:
    spec = _kernel_spec()
    wire = spec.SerializeToString()
    assert wire  # non-default fields were set, so the encoding is not empty

    back = job_pb2.JobSpec.FromString(wire)

    assert back == spec
    assert back.WhichOneof("workload") == "kernel"
    assert back.name == "llama decode"
    assert back.priority == 5
    assert back.platform == "sn40l-rack16"
    assert back.client_request_id == "req-0001"
    assert back.payload_mode == common_pb2.PAYLOAD_MODE_TIMING
    assert back.kernel.model == "llama2-7b"
    assert back.kernel.phase == common_pb2.PHASE_DECODE
    assert back.kernel.fusion_plan == common_pb2.FUSION_PLAN_KERNEL_LOOPED
    assert back.kernel.sequence_length == 4096
    assert back.kernel.batch_size == 8
    assert back.kernel.num_sockets == 16
    assert back.kernel.output_tokens == 128
    assert not back.HasField("training")
    assert not back.HasField("coe_inference")


def test_setting_another_workload_replaces_the_kernel_job() -> None:
    spec = _kernel_spec()
    spec.training.world_size = 16
    assert spec.WhichOneof("workload") == "training"
    assert not spec.HasField("kernel")


def test_job_with_sockets_timestamps_and_result_round_trips() -> None:
    job = job_pb2.Job(
        id="job-000042",
        spec=_kernel_spec(),
        state=common_pb2.JOB_STATE_SUCCEEDED,
        sockets=[
            common_pb2.SocketRef(node_index=1, socket_index=3, id="rdu-n1-s3"),
            common_pb2.SocketRef(node_index=0, socket_index=0, id="rdu-n0-s0"),
        ],
        emulated_start_ns=1_000,
        emulated_end_ns=2**40,  # beyond 32 bits: ns fields are uint64
        result=job_pb2.JobResult(
            kernel=job_pb2.KernelResult(
                emulated_s=1.5,
                kernel_calls=1,
                hbm_bandwidth_utilization=0.9,
                tier_usage=[
                    common_pb2.TierUsage(
                        tier=common_pb2.TIER_HBM,
                        used_bytes=10,
                        peak_bytes=2**36,
                        capacity_bytes=64 * 10**9,
                    )
                ],
            )
        ),
    )
    job.create_time.FromNanoseconds(1_700_000_000_123_456_789)

    back = job_pb2.Job.FromString(job.SerializeToString())

    assert back == job
    assert [s.id for s in back.sockets] == ["rdu-n1-s3", "rdu-n0-s0"]
    assert back.emulated_end_ns == 2**40
    assert back.create_time.ToNanoseconds() == 1_700_000_000_123_456_789
    assert back.result.WhichOneof("result") == "kernel"
    assert back.result.kernel.tier_usage[0].peak_bytes == 2**36


def test_job_event_carries_exactly_one_kind_of_event() -> None:
    event = job_pb2.JobEvent(
        job_id="job-1",
        sequence=3,
        progress=job_pb2.JobProgress(fraction=0.25, message="decode token 32/128"),
    )
    assert event.WhichOneof("event") == "progress"
    event.state_change.to_state = common_pb2.JOB_STATE_RUNNING
    assert event.WhichOneof("event") == "state_change"
    assert not event.HasField("progress")
    assert job_pb2.JobEvent.FromString(event.SerializeToString()) == event


def test_transfer_chunks_are_either_header_or_data() -> None:
    header = link_pb2.TransferChunk(
        header=link_pb2.TransferHeader(
            transfer_id="t-1",
            src_socket_id="rdu-n0-s0",
            dst_socket_id="rdu-n0-s1",
            total_bytes=6 * 4,
            emulated_send_ns=123,
            collective_tag="grad-allreduce/step-1",
            collective_step=2,
            dtype="float32",
            shape=[2, 3],
        )
    )
    data = link_pb2.TransferChunk(data=b"\x00" * 24)
    assert header.WhichOneof("chunk") == "header"
    assert data.WhichOneof("chunk") == "data"
    back = link_pb2.TransferChunk.FromString(header.SerializeToString())
    assert back == header
    assert list(back.header.shape) == [2, 3]
    assert back.header.timing_only is False
    assert link_pb2.TransferChunk.FromString(data.SerializeToString()).data == b"\x00" * 24


# ------------------------------------------------------------------ training, both ways


def test_a_progressive_training_spec_round_trips_with_its_cap_and_freezing() -> None:
    from rdurack.wire import training as training_convert
    from rdurack.workloads.training.job import TrainingWorkload

    w = TrainingWorkload(
        strategy="progressive",
        blocks=4,
        hidden=64,
        hbm_cap_bytes=2**40,  # beyond 32 bits: a uint64 on the wire
        freeze_window=30,
        freeze_threshold=0.4,
        epochs=5,
    )
    msg = training_convert.workload_to_proto(w)
    assert (msg.strategy, msg.blocks, msg.hbm_cap_bytes) == ("progressive", 4, 2**40)
    assert (msg.freeze_window, msg.freeze_threshold) == (30, 0.4)
    back = job_pb2.TrainingJob.FromString(msg.SerializeToString())
    assert TrainingWorkload.model_validate(training_convert.workload_from_proto(back)) == w
    # Zero means the default: full training, one block, no cap, the metric's defaults.
    plain = TrainingWorkload.model_validate(
        training_convert.workload_from_proto(job_pb2.TrainingJob())
    )
    assert (plain.strategy, plain.blocks, plain.hbm_cap_bytes) == ("full", 1, 0)
    assert (plain.freeze_window, plain.freeze_threshold) == (25, 0.45)


def _stage(phase: str, block: int | None, converged: bool) -> dict[str, object]:
    return {
        "phase": phase,
        "block": block,
        "start_step": 10,
        "steps": 25,
        "converged": converged,
        "frozen_at_step": 35 if converged else None,
        "movement": 0.3,
        "loss": 0.5,
        "test_accuracy": 0.9 if block != 1 else None,
        "peak_bytes": {"sram": 0, "hbm": 2**33, "ddr": 7},
        "emulated_s": 0.25,
    }


def test_a_ranks_report_round_trips_with_its_stages_and_tier_peaks() -> None:
    from rdurack.wire import training as training_convert
    from rdurack.workloads.training.job import RankReport

    report = RankReport(
        socket_id="rdu-n1-s2",
        rank=10,
        step=35,
        total=40,
        finished=True,
        losses=[0.5],
        start_ns=1,
        end_ns=2**40,
        steps_began_ns=5,
        compute_ns=3,
        all_reduce_ns=4,
        exposed_ns=1,
        memory={
            "weights": 1,
            "gradients": 2,
            "optimizer": 3,
            "activations": 4,
            "movement": 5,
            "total": 15,
        },
        hbm_peak_bytes=2**33,
        result={
            "diagnostics": [],
            "samples_seen": 8,
            "start_step": 0,
            "checkpoints": [],
            "test_accuracy": None,
            "final_loss": 0.5,
            "stages": [_stage("shrink", 1, False), _stage("grow", 0, True)],
        },
        peak_bytes={"sram": 0, "hbm": 2**33, "ddr": 7},
        stage="grow block 0",
    )
    msg = training_convert.report_to_proto(report)
    assert [s.name for s in msg.stages] == ["shrink block 1", "grow block 0"]
    assert not msg.stages[0].HasField("frozen_at_step") and msg.stages[1].frozen_at_step == 35
    wire = type(msg).FromString(msg.SerializeToString())
    assert training_convert.report_from_proto(wire) == report


def test_a_training_result_carries_stages_and_each_sockets_peaks() -> None:
    from rdurack.orchestrator.kinds.training import stage_fields
    from rdurack.orchestrator.results import TrainingResult
    from rdurack.wire import jobs as job_convert

    stages = [stage_fields([_stage("full", None, False), _stage("full", None, False)])]
    result = {
        "kind": "training",
        "strategy": "progressive",
        "hbm_cap_bytes": 128_000,
        "peak_hbm_bytes": 2**33,
        "peak_ddr_bytes": 7,
        "socket_memory": [
            {
                "socket_id": "rdu-n0-s0",
                "peak_sram_bytes": 0,
                "peak_hbm_bytes": 2**33,
                "peak_ddr_bytes": 7,
            },
        ],
        "stages": stages,
    }
    msg = job_convert.result_to_proto(TrainingResult.model_validate(result)).training
    assert msg.strategy == "progressive" and msg.hbm_cap_bytes == 128_000
    assert msg.socket_memory[0].peak_hbm_bytes == 2**33 and msg.peak_ddr_bytes == 7
    (stage,) = msg.stages
    assert (stage.name, stage.phase, stage.HasField("block")) == ("full", "full", False)
    assert (stage.steps, stage.peak_hbm_bytes, stage.test_accuracy) == (25, 2**33, 0.9)
    assert stage.final_loss == 0.5 and stage.emulated_s == 0.25
