"""rdurack.v1.AdminService: fault injection on the wire, admin tokens only.

Every method first asks the server's Authenticator for an admin
(`auth.require_admin(context)`: an admin tenant's token, or anyone on an open rack),
outside the error mapping of `rpc` (its abort must reach the client as UNAUTHENTICATED
or PERMISSION_DENIED), and then the orchestrator's FaultInjector.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar, cast

import grpc

from rdurack.api.status import rpc
from rdurack.orchestrator.fault_injector import FaultInjector
from rdurack.rack.faults import Fault, FaultKind
from rdurack.security.auth import Authenticator
from rdurack.v1 import admin_pb2, admin_pb2_grpc
from rdurack.wire.faults import fault_to_proto

SERVICE = admin_pb2.DESCRIPTOR.services_by_name["AdminService"].full_name

F = TypeVar("F", bound=Callable[..., Any])


def admin(method: F) -> F:
    """`rpc`, for admins only."""
    mapped = rpc(method)

    @functools.wraps(method)
    def wrapper(self: AdminService, request: Any, context: grpc.ServicerContext) -> Any:
        self.auth.require_admin(context)
        return mapped(self, request, context)

    return cast(F, wrapper)


class AdminService(admin_pb2_grpc.AdminServiceServicer):
    def __init__(self, faults: FaultInjector, auth: Authenticator) -> None:
        self.faults = faults
        self.auth = auth

    def add_to(self, server: grpc.Server) -> None:
        admin_pb2_grpc.add_AdminServiceServicer_to_server(self, server)

    @admin
    def KillSocket(
        self, request: admin_pb2.KillSocketRequest, context: grpc.ServicerContext
    ) -> admin_pb2.FaultResponse:
        return _reply(self.faults.inject(FaultKind.KILL_SOCKET, sockets=(request.socket_id,)))

    @admin
    def KillAgent(
        self, request: admin_pb2.KillAgentRequest, context: grpc.ServicerContext
    ) -> admin_pb2.FaultResponse:
        return _reply(self.faults.inject(FaultKind.KILL_AGENT, nodes=(request.node_index,)))

    @admin
    def SlowSocket(
        self, request: admin_pb2.SlowSocketRequest, context: grpc.ServicerContext
    ) -> admin_pb2.FaultResponse:
        fault = self.faults.inject(
            FaultKind.SLOW_SOCKET, sockets=(request.socket_id,), slow_factor=request.slow_factor
        )
        return _reply(fault)

    @admin
    def DropLink(
        self, request: admin_pb2.DropLinkRequest, context: grpc.ServicerContext
    ) -> admin_pb2.FaultResponse:
        link = (request.socket_a, request.socket_b)
        return _reply(self.faults.inject(FaultKind.DROP_LINK, sockets=link))

    @admin
    def DelayLink(
        self, request: admin_pb2.DelayLinkRequest, context: grpc.ServicerContext
    ) -> admin_pb2.FaultResponse:
        fault = self.faults.inject(
            FaultKind.DELAY_LINK,
            sockets=(request.socket_a, request.socket_b),
            extra_latency_ns=request.extra_latency_ns,
        )
        return _reply(fault)

    @admin
    def Partition(
        self, request: admin_pb2.PartitionRequest, context: grpc.ServicerContext
    ) -> admin_pb2.FaultResponse:
        a, b = request.node_a, request.node_b
        nodes = (0, 1) if a == b == 0 else (a, b)
        return _reply(self.faults.inject(FaultKind.PARTITION, nodes=nodes))

    @admin
    def Heal(
        self, request: admin_pb2.HealRequest, context: grpc.ServicerContext
    ) -> admin_pb2.HealResponse:
        healed, restarted = self.faults.heal(request.fault_id)
        return admin_pb2.HealResponse(
            healed=[fault_to_proto(f) for f in healed], restarted_socket_ids=restarted
        )

    @admin
    def ListFaults(
        self, request: admin_pb2.ListFaultsRequest, context: grpc.ServicerContext
    ) -> admin_pb2.ListFaultsResponse:
        return admin_pb2.ListFaultsResponse(faults=[fault_to_proto(f) for f in self.faults.list()])


def _reply(fault: Fault) -> admin_pb2.FaultResponse:
    return admin_pb2.FaultResponse(fault=fault_to_proto(fault))
