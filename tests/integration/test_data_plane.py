"""The data plane on local Ray: 2 node agents x 8 socket actors, gRPC links."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from rdurack.rack.collectives import Algorithm, all_reduce
from rdurack.rack.models import model
from rdurack.rack.presets import platform
from rdurack.rack.topology import SocketId, Topology
from rdurack.v1 import common_pb2, node_agent_pb2
from tests.support.agents import ServedAgent, start_agents, stop_agents

pytestmark = pytest.mark.integration
RACK = platform("sn40l-rack16")
ALL = [str(s) for s in Topology(RACK).sockets]


def group(ids: list[str], agents: list[ServedAgent]) -> node_agent_pb2.CollectiveGroup:
    addresses = {sid: a for s in agents for sid, a in s.agent.addresses().items()}
    return node_agent_pb2.CollectiveGroup(
        members=[
            node_agent_pb2.GroupMember(
                socket=common_pb2.SocketRef(id=sid), rank=rank, link_address=addresses[sid]
            )
            for rank, sid in enumerate(ids)
        ]
    )


def latest_clock(agents: list[ServedAgent], ids: list[str]) -> int:
    clocks = {
        s.ref.id: s.emulated_clock_ns
        for a in agents
        for s in a.stub.GetNode(node_agent_pb2.GetNodeRequest()).node.sockets
    }
    return max(clocks[i] for i in ids)


def collective(
    agents: list[ServedAgent], ids: list[str], **fields: object
) -> list[node_agent_pb2.SocketCollectiveTiming]:
    """Ask every agent holding members to run its part, at once, over gRPC, all members
    starting at the latest of their clocks (as a job does)."""
    request = node_agent_pb2.CollectiveRequest(
        group=group(ids, agents),
        emulated_start_ns=latest_clock(agents, ids),
        **fields,  # type: ignore[arg-type]
    )
    involved = [a for a in agents if any(s in a.agent.socket_ids for s in ids)]
    futures = [a.stub.Collective.future(request, timeout=60) for a in involved]
    return [t for f in futures for t in f.result().sockets]


@pytest.fixture
def job(rack: list[ServedAgent], request: pytest.FixtureRequest) -> Iterator[str]:
    """A job holding all 16 sockets, released afterwards."""
    job_id = f"job-{request.node.name}"
    for a in rack:
        a.stub.ReserveSockets(
            node_agent_pb2.ReserveSocketsRequest(job_id=job_id, socket_ids=a.agent.socket_ids)
        )
    yield job_id
    for a in rack:
        a.stub.ReleaseSockets(
            node_agent_pb2.ReleaseSocketsRequest(job_id=job_id, socket_ids=a.agent.socket_ids)
        )


def test_agents_report_16_healthy_sockets(rack: list[ServedAgent]) -> None:
    for index, a in enumerate(rack):
        node = a.stub.GetNode(node_agent_pb2.GetNodeRequest()).node
        assert node.index == index and node.healthy
        assert [s.ref.id for s in node.sockets] == a.agent.socket_ids
        for s in node.sockets:
            assert s.link_address.startswith("127.0.0.1:")
            assert {t.tier for t in s.tiers} == {
                common_pb2.TIER_SRAM,
                common_pb2.TIER_HBM,
                common_pb2.TIER_DDR,
            }
            hbm = next(t for t in s.tiers if t.tier == common_pb2.TIER_HBM)
            assert hbm.capacity_bytes == 64_000_000_000
        checker: Any = health_pb2_grpc.HealthStub(a.channel)  # its stubs lack Check
        health = checker.Check(health_pb2.HealthCheckRequest(service=""))
        assert health.status == health_pb2.HealthCheckResponse.SERVING


def test_functional_ring_all_reduce_across_16_sockets_equals_numpy(
    rack: list[ServedAgent], job: str
) -> None:
    rng = np.random.default_rng(42)
    data = {sid: rng.standard_normal(100_003).astype(np.float32) for sid in ALL}
    for a in rack:
        for sid in a.agent.socket_ids:
            a.agent.put_tensor(job, sid, "grad", data[sid])
    timings = collective(
        rack,
        ALL,
        job_id=job,
        op=node_agent_pb2.COLLECTIVE_OP_ALL_REDUCE,
        tag="ar-f",
        tensor="grad",
        algorithm="ring",
        payload_mode=common_pb2.PAYLOAD_MODE_FUNCTIONAL,
    )
    assert len(timings) == 16
    expected = np.sum(np.stack(list(data.values())), axis=0)
    for a in rack:
        for sid in a.agent.socket_ids:
            np.testing.assert_allclose(
                a.agent.get_tensor(job, sid, "grad"), expected, rtol=1e-4, atol=1e-4
            )
    assert all(t.bytes_received > 0 for t in timings)


@pytest.mark.parametrize("algorithm", ["ring", "auto"])
def test_emulated_all_reduce_time_matches_the_predictor(
    rack: list[ServedAgent], job: str, algorithm: str
) -> None:
    nbytes = 16_000_000
    timings = collective(
        rack,
        ALL,
        job_id=job,
        op=node_agent_pb2.COLLECTIVE_OP_ALL_REDUCE,
        tag=f"ar-{algorithm}",
        size_bytes=nbytes,
        algorithm=algorithm,
    )
    start = max(t.emulated_start_ns for t in timings)
    assert all(t.emulated_start_ns == start for t in timings)  # a job's sockets start together
    emulated = (max(t.emulated_end_ns for t in timings) - start) * 1e-9
    members = [SocketId.parse(s) for s in ALL]
    predicted = all_reduce(
        Topology(RACK), members, nbytes, Algorithm(algorithm), itemsize=4
    ).total_s
    assert emulated == pytest.approx(predicted, rel=0.02)


def test_an_inter_node_transfer_costs_what_the_spec_says(rack: list[ServedAgent], job: str) -> None:
    pair = ["rdu-n0-s3", "rdu-n1-s3"]
    nbytes = 64_000_000
    timings = collective(
        rack,
        pair,
        job_id=job,
        op=node_agent_pb2.COLLECTIVE_OP_SEND,
        tag="p2p",
        size_bytes=nbytes,
        root_rank=0,
    )
    receiver = next(t for t in timings if t.socket_id == pair[1])
    link = RACK.inter_node_link
    expected_ns = link.latency_ns + nbytes / link.bandwidth_bytes_per_s * 1e9
    assert receiver.emulated_duration_ns == pytest.approx(expected_ns, abs=2)
    assert receiver.bytes_received == nbytes


def test_an_allocation_that_does_not_fit_is_resource_exhausted(
    rack: list[ServedAgent], job: str
) -> None:
    with pytest.raises(grpc.RpcError) as err:
        rack[0].stub.RunKernel(
            node_agent_pb2.RunKernelRequest(
                job_id=job,
                socket_ids=["rdu-n0-s0"],
                model="llama3.1-405b",
                phase=common_pb2.PHASE_DECODE,
                fusion_plan=common_pb2.FUSION_PLAN_KERNEL_LOOPED,
                sequence_length=1024,
                batch_size=1,
            )
        )
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    message = err.value.details() or ""
    m = model("llama3.1-405b")
    asked = m.weight_bytes + 1024 * m.kv_bytes_per_token()  # its weights and KV cache
    assert f"HBM cannot hold {asked:,} bytes for llama3.1-405b on 1" in message
    assert "64,000,000,000 bytes free" in message


def test_a_busy_socket_refuses_a_second_job(rack: list[ServedAgent], job: str) -> None:
    with pytest.raises(grpc.RpcError) as err:
        rack[1].stub.ReserveSockets(
            node_agent_pb2.ReserveSocketsRequest(job_id="intruder", socket_ids=["rdu-n1-s2"])
        )
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "one job at a time" in (err.value.details() or "")


def test_kernels_run_on_the_actors(rack: list[ServedAgent], job: str) -> None:
    reply = rack[0].stub.RunKernel(
        node_agent_pb2.RunKernelRequest(
            job_id=job,
            socket_ids=rack[0].agent.socket_ids,
            model="llama2-7b",
            phase=common_pb2.PHASE_DECODE,
            fusion_plan=common_pb2.FUSION_PLAN_KERNEL_LOOPED,
            sequence_length=1024,
            batch_size=1,
            output_tokens=20,
        )
    )
    assert len(reply.sockets) == 8
    durations = {t.emulated_duration_ns for t in reply.sockets}
    assert len(durations) == 1 and durations.pop() > 0
    assert all(
        t.kernel_calls == 3 * 20 for t in reply.sockets
    )  # embed, looped layers, head per token


@pytest.mark.parametrize(
    ("request_fields", "code"),
    [
        ({"model": "gpt-9"}, grpc.StatusCode.NOT_FOUND),
        ({"phase": 0}, grpc.StatusCode.INVALID_ARGUMENT),
        ({"sequence_length": 0}, grpc.StatusCode.INVALID_ARGUMENT),
        ({"socket_ids": ["rdu-n7-s0"]}, grpc.StatusCode.NOT_FOUND),
        ({"payload_mode": common_pb2.PAYLOAD_MODE_FUNCTIONAL}, grpc.StatusCode.INVALID_ARGUMENT),
    ],
)
def test_bad_kernel_requests_get_proper_codes(
    rack: list[ServedAgent], job: str, request_fields: dict[str, object], code: grpc.StatusCode
) -> None:
    fields: dict[str, object] = {
        "job_id": job,
        "socket_ids": ["rdu-n0-s0"],
        "model": "llama2-7b",
        "phase": common_pb2.PHASE_DECODE,
        "fusion_plan": common_pb2.FUSION_PLAN_FUSED_HO,
        "sequence_length": 128,
        "batch_size": 1,
    }
    fields.update(request_fields)
    with pytest.raises(grpc.RpcError) as err:
        rack[0].stub.RunKernel(node_agent_pb2.RunKernelRequest(**fields))  # type: ignore[arg-type]
    assert err.value.code() == code
    assert err.value.details()


def test_a_link_down_ends_in_a_clear_error_within_the_timeout(
    rack: list[ServedAgent], job: str
) -> None:
    rack[0].agent.set_link_down("rdu-n0-s7", "rdu-n1-s7")
    try:
        started = time.monotonic()
        with pytest.raises(grpc.RpcError) as err:
            collective(
                rack,
                ALL,
                job_id=job,
                op=node_agent_pb2.COLLECTIVE_OP_ALL_REDUCE,
                tag="down",
                size_bytes=1_000_000,
                algorithm="ring",
            )
        assert time.monotonic() - started < 30
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "rdu-n" in (err.value.details() or "")
    finally:
        rack[0].agent.set_link_down("rdu-n0-s7", "rdu-n1-s7", down=False)


def test_a_killed_socket_actor_is_a_clear_error(ray_session: None) -> None:
    small = platform("sn40l-node").overridden({"node": {"sockets": 2}}, "test: 1 node x 2 sockets")
    served = start_agents(small, link_timeout_s=3.0)
    try:
        agent = served[0]
        agent.agent.reserve("k", agent.agent.socket_ids)
        agent.agent.kill_socket("rdu-n0-s1")
        started = time.monotonic()
        with pytest.raises(grpc.RpcError) as err:
            collective(
                served,
                agent.agent.socket_ids,
                job_id="k",
                op=node_agent_pb2.COLLECTIVE_OP_ALL_REDUCE,
                tag="dead",
                size_bytes=1024,
            )
        assert time.monotonic() - started < 30
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        node = agent.stub.GetNode(node_agent_pb2.GetNodeRequest()).node
        assert not node.healthy
        dead = next(s for s in node.sockets if s.ref.id == "rdu-n0-s1")
        assert dead.health != 1  # not SOCKET_HEALTH_HEALTHY
    finally:
        stop_agents(served)
