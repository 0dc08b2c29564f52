"""rdurack.v1.RackService: the rack's state, and node agents joining it from other hosts.

Any authenticated caller may read the rack. A tenant sees which of its own jobs holds
a socket; another tenant's job shows as OTHER_TENANT, not by id.

`RegisterNode` is how `rdu join` grows a rack across machines (docs/scale-out.md): an
agent started on another host takes a node whose agent has not joined (or is gone), and
the orchestrator reaches that node at the agent's address from then on. Only admins may
(the open API's caller is one): whoever registers a node receives its jobs. With TLS the
orchestrator still dials the agent as a rack member, so an agent without the rack's
certificate is registered but never reached.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import grpc

from rdurack.api.status import rpc
from rdurack.errors import RdurackError
from rdurack.orchestrator.orchestrator import Orchestrator
from rdurack.security.auth import Authenticator
from rdurack.v1 import rack_pb2, rack_pb2_grpc
from rdurack.wire import jobs as jc

SERVICE = rack_pb2.DESCRIPTOR.services_by_name["RackService"].full_name


@dataclass(frozen=True)
class Joining:
    """What agents on other hosts need: `register(node, address)` (the gateway's;
    whether anything changed), the Ray cluster they join and the platform as a what-if
    YAML naming its base preset."""

    register: Callable[[int, str], bool]
    ray_address: str = ""
    platform_spec: str = ""


class RackService(rack_pb2_grpc.RackServiceServicer):
    """`joining`: None refuses RegisterNode (a rack whose agents are all given)."""

    def __init__(
        self,
        orchestrator: Orchestrator,
        auth: Authenticator | None = None,
        joining: Joining | None = None,
    ) -> None:
        self.o = orchestrator
        self.auth = auth or Authenticator.open()
        self.joining = joining

    def add_to(self, server: grpc.Server) -> None:
        rack_pb2_grpc.add_RackServiceServicer_to_server(self, server)

    @rpc
    def GetRack(
        self, request: rack_pb2.GetRackRequest, context: grpc.ServicerContext
    ) -> rack_pb2.GetRackResponse:
        scope = self.auth.principal(context).scope
        nodes = [jc.node_to_proto(n) for n in self.o.rack(scope)]
        lease = self.o.store.lease()
        control = rack_pb2.ControlPlane(
            replica=self.o.elector.holder,
            leader=lease.holder if lease.live else "",
            term=lease.epoch if lease.live else 0,
        )
        rack = rack_pb2.RackStatus(
            platform=self.o.platform.name, nodes=nodes, control_plane=control
        )
        if self.joining is not None:
            rack.ray_address = self.joining.ray_address
            rack.platform_spec = self.joining.platform_spec
        return rack_pb2.GetRackResponse(rack=rack)

    @rpc
    def ListNodes(
        self, request: rack_pb2.ListNodesRequest, context: grpc.ServicerContext
    ) -> rack_pb2.ListNodesResponse:
        scope = self.auth.principal(context).scope
        nodes = [jc.node_to_proto(n) for n in self.o.rack(scope)]
        return rack_pb2.ListNodesResponse(nodes=nodes)

    @rpc
    def RegisterNode(
        self, request: rack_pb2.RegisterNodeRequest, context: grpc.ServicerContext
    ) -> rack_pb2.RegisterNodeResponse:
        self.auth.require_admin(context)
        register = self.joining.register if self.joining is not None else _refuse
        changed = register(request.index, request.agent_address)
        if changed:
            print(f"node {request.index}'s agent joined at {request.agent_address}", flush=True)
        return rack_pb2.RegisterNodeResponse(changed=changed)


def _refuse(node: int, address: str) -> bool:
    raise RdurackError("this orchestrator's server takes no node agents from other hosts")
