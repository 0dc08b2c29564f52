"""Hostile input to a node agent: every NodeAgentService method, over mutual TLS as the
orchestrator calls it, with random, truncated, type-confused and absurd requests, and
near-valid ones that reserve, run and release real sockets. Every answer is a proper
status code and the agent keeps serving (tests/unit/test_fuzz.py does the other
services)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import grpc
import pytest
from google.protobuf.descriptor import MethodDescriptor
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from rdurack.api.node_agent_service import SERVICE, NodeAgentService
from rdurack.api.server import Server, channel
from rdurack.node_agent.agent import NodeAgent
from rdurack.rack.presets import platform
from rdurack.v1 import common_pb2, node_agent_pb2, node_agent_pb2_grpc
from tests.support.certs import RackCerts
from tests.support.fuzz_messages import hostile
from tests.support.grpc_calls import PROPER, call

pytestmark = pytest.mark.integration

AGENT = node_agent_pb2.DESCRIPTOR.services_by_name["NodeAgentService"]
INPUTS = [m.input_type for m in AGENT.methods]
FUZZ = settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
SOCKETS = ["rdu-n0-s0", "rdu-n0-s1"]


@dataclass
class Agent:
    agent: NodeAgent
    server: Server
    channel: grpc.Channel


@pytest.fixture(scope="module")
def agent(ray_session: None, rack_certs: RackCerts) -> Iterator[Agent]:
    """One node of two sockets, its links and its server mutual TLS."""
    small = platform("sn40l-node").overridden({"node": {"sockets": 2}}, "test: 1 node x 2")
    a = NodeAgent(0, small, link_timeout_s=2.0, call_timeout_s=20.0, tls=rack_certs.member)
    a.start()
    service = NodeAgentService(a)
    server = Server([(SERVICE, service.add_to)], tls=rack_certs.member, rack_peers=True)
    ch = channel(server.address, tls=rack_certs.member, rack=True)
    yield Agent(a, server, ch)
    ch.close()
    server.stop(0)
    a.stop()


def still_serves(a: Agent) -> None:
    stub = node_agent_pb2_grpc.NodeAgentServiceStub(a.channel)
    node = stub.GetNode(node_agent_pb2.GetNodeRequest(), timeout=20).node
    assert node.healthy and [s.ref.id for s in node.sockets] == SOCKETS
    assert not any(s.current_job_id for s in node.sockets), "a fuzzed job kept a socket"


@pytest.mark.parametrize("method", list(AGENT.methods), ids=lambda m: m.name)
@FUZZ
@given(data=st.data())
def test_every_agent_method_answers_hostile_requests_properly(
    agent: Agent, method: MethodDescriptor, data: st.DataObject
) -> None:
    payload = data.draw(hostile(method, INPUTS), label="request")
    code, details = call(agent.channel, method, payload, timeout_s=30)
    assert code in PROPER, f"{method.name}: {code.name}: {details}"
    if method.name == "ReserveSockets" and code == grpc.StatusCode.OK:
        # A random job id that happened to name real sockets: give them back.
        request = node_agent_pb2.ReserveSocketsRequest.FromString(payload)
        agent.agent.release(request.job_id, [s for s in request.socket_ids if s in SOCKETS])


ids = st.one_of(
    st.sampled_from([[SOCKETS[0]], SOCKETS, [SOCKETS[1]]]),
    st.lists(st.sampled_from([*SOCKETS, "rdu-n0-s9", "rdu-n1-s0", "x"]), max_size=3),
)


@FUZZ
@given(
    sockets=ids,
    # Mostly valid values, sometimes not.
    model=st.sampled_from(["llama2-7b", "llama2-7b", "llama2-7b", "tiny-lm", "nope", ""]),
    phase=st.sampled_from([1, 2, 3, 1, 2, 3, 0, 4]),
    seq=st.one_of(st.integers(1, 2048), st.integers(1, 2048), st.integers(0, 1 << 20)),
    batch=st.one_of(st.integers(1, 4), st.integers(0, 64)),
    tokens=st.integers(0, 40),
    group=st.sampled_from([0, 0, 1, 2, 5]),
)
def test_near_valid_kernels_run_or_are_refused_properly(
    agent: Agent,
    sockets: list[str],
    model: str,
    phase: int,
    seq: int,
    batch: int,
    tokens: int,
    group: int,
) -> None:
    stub = node_agent_pb2_grpc.NodeAgentServiceStub(agent.channel)
    answers: list[tuple[grpc.StatusCode, str | None]] = []
    try:
        stub.ReserveSockets(
            node_agent_pb2.ReserveSocketsRequest(job_id="fz", socket_ids=sockets), timeout=20
        )
        reserved = True
    except grpc.RpcError as e:
        assert isinstance(e, grpc.Call)
        answers.append((e.code(), e.details()))
        reserved = False
    try:
        stub.RunKernel(
            node_agent_pb2.RunKernelRequest(
                job_id="fz",
                socket_ids=sockets,
                model=model,
                phase=phase,  # type: ignore[arg-type]
                fusion_plan=common_pb2.FUSION_PLAN_FUSED_HO,
                sequence_length=seq,
                batch_size=batch,
                output_tokens=tokens,
                group_size=group,
            ),
            timeout=30,
        )
    except grpc.RpcError as e:
        assert isinstance(e, grpc.Call)
        answers.append((e.code(), e.details()))
    finally:
        if reserved:
            stub.ReleaseSockets(
                node_agent_pb2.ReleaseSocketsRequest(job_id="fz", socket_ids=sockets), timeout=20
            )
    event("kernel ran" if len(answers) == 0 else f"refused: {answers[-1][0].name}")
    for code, details in answers:
        assert code in PROPER, f"{code.name}: {details}"


def test_the_agent_still_serves_after_the_fuzzing(agent: Agent) -> None:
    still_serves(agent)
