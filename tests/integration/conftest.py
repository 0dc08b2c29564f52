"""One local Ray per test session; a rack of two node agents served over gRPC."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import grpc
import pytest
import ray

from rdurack.node_agent.actors import start_ray
from rdurack.node_agent.agent import NodeAgent, start_rack
from rdurack.rack.presets import platform
from rdurack.rack.spec import PlatformSpec
from rdurack.services.grpc_server import Server, channel
from rdurack.services.node_agent_service import SERVICE, NodeAgentService
from rdurack.v1 import node_agent_pb2_grpc


@dataclass
class ServedAgent:
    agent: NodeAgent
    server: Server
    channel: grpc.Channel
    stub: node_agent_pb2_grpc.NodeAgentServiceStub


@pytest.fixture(scope="session")
def ray_session() -> Iterator[None]:
    start_ray()
    yield
    ray.shutdown()


def serve(agent: NodeAgent) -> ServedAgent:
    service = NodeAgentService(agent)
    server = Server([(SERVICE, service.add_to)])
    service.address = server.address
    ch = channel(server.address)
    return ServedAgent(agent, server, ch, node_agent_pb2_grpc.NodeAgentServiceStub(ch))


def start_agents(spec: PlatformSpec, link_timeout_s: float) -> list[ServedAgent]:
    agents = start_rack(spec, link_timeout_s=link_timeout_s, call_timeout_s=60)
    return [serve(a) for a in agents]


def stop_agents(served: list[ServedAgent]) -> None:
    for s in served:
        s.channel.close()
        s.server.stop(0)
        s.agent.stop()


@pytest.fixture(scope="session")
def rack(ray_session: None) -> Iterator[list[ServedAgent]]:
    """Two node agents x 8 sockets of the sn40l-rack16 platform."""
    served = start_agents(platform("sn40l-rack16"), link_timeout_s=5.0)
    yield served
    stop_agents(served)
