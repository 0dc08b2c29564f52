"""Node agents served over gRPC on free ports, as the integration tests run them."""

from __future__ import annotations

from dataclasses import dataclass

import grpc

from rdurack.api.node_agent_service import SERVICE, NodeAgentService
from rdurack.api.server import Server, channel
from rdurack.node_agent.agent import NodeAgent
from rdurack.node_agent.in_process import start_rack
from rdurack.rack.spec import PlatformSpec
from rdurack.v1 import node_agent_pb2_grpc


@dataclass
class ServedAgent:
    agent: NodeAgent
    server: Server
    channel: grpc.Channel
    stub: node_agent_pb2_grpc.NodeAgentServiceStub


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
