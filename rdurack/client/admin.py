"""A client of rdurack.v1.AdminService over a channel that carries the caller's
credentials (`connection.Target.channel`: TLS, bearer token), the faults as `rdu fault`
shows them, and `wait_healthy`, which waits for restarted node agents to be found again.
The CLI (`rdu fault`) and the chaos run use it."""

from __future__ import annotations

import time
from typing import Any

import grpc
from google.protobuf import json_format

from rdurack.client.rack import RackClient
from rdurack.errors import RdurackError
from rdurack.v1 import admin_pb2, admin_pb2_grpc, fault_pb2
from rdurack.wire.faults import KINDS

RPC_TIMEOUT_S = 60.0  # a heal restarts socket actors: seconds on a loaded machine


class AdminClient:
    def __init__(self, channel: grpc.Channel, timeout_s: float = RPC_TIMEOUT_S):
        self._stub = admin_pb2_grpc.AdminServiceStub(channel)
        self.timeout_s = timeout_s

    def _fault(self, method: str, request: Any) -> fault_pb2.Fault:
        call = getattr(self._stub, method)
        reply = call(request, timeout=self.timeout_s)
        assert isinstance(reply, admin_pb2.FaultResponse)
        return reply.fault

    def kill_socket(self, socket_id: str) -> fault_pb2.Fault:
        return self._fault("KillSocket", admin_pb2.KillSocketRequest(socket_id=socket_id))

    def kill_agent(self, node: int) -> fault_pb2.Fault:
        return self._fault("KillAgent", admin_pb2.KillAgentRequest(node_index=node))

    def slow(self, socket_id: str, factor: float) -> fault_pb2.Fault:
        request = admin_pb2.SlowSocketRequest(socket_id=socket_id, slow_factor=factor)
        return self._fault("SlowSocket", request)

    def drop_link(self, a: str, b: str) -> fault_pb2.Fault:
        return self._fault("DropLink", admin_pb2.DropLinkRequest(socket_a=a, socket_b=b))

    def delay_link(self, a: str, b: str, extra_latency_ns: int) -> fault_pb2.Fault:
        request = admin_pb2.DelayLinkRequest(
            socket_a=a, socket_b=b, extra_latency_ns=extra_latency_ns
        )
        return self._fault("DelayLink", request)

    def partition(self, a: int = 0, b: int = 1) -> fault_pb2.Fault:
        return self._fault("Partition", admin_pb2.PartitionRequest(node_a=a, node_b=b))

    def heal(self, fault_id: str = "") -> admin_pb2.HealResponse:
        reply: admin_pb2.HealResponse = self._stub.Heal(
            admin_pb2.HealRequest(fault_id=fault_id),
            timeout=self.timeout_s,
        )
        return reply

    def faults(self) -> list[fault_pb2.Fault]:
        reply: admin_pb2.ListFaultsResponse = self._stub.ListFaults(
            admin_pb2.ListFaultsRequest(), timeout=self.timeout_s
        )
        return list(reply.faults)


def fault_dict(f: fault_pb2.Fault) -> dict[str, Any]:
    """A fault as the CLI prints it (--json)."""
    data = json_format.MessageToDict(
        f, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )
    data["kind"] = kind_name(f)
    data["extra_latency_ns"] = int(f.extra_latency_ns)
    return data


def kind_name(f: fault_pb2.Fault) -> str:
    """The fault's kind as `rdu fault` names it: kill-socket, slow, drop-link, ..."""
    return KINDS[f.kind].value if f.kind in KINDS else "unknown"


def wait_healthy(ch: grpc.Channel, nodes: list[int], wait_s: float) -> None:
    """Until the orchestrator's GetRack shows `nodes` healthy (a restarted agent found
    again, its sockets back in the pool); RdurackError after `wait_s` wall seconds."""
    racks = RackClient(ch, RPC_TIMEOUT_S)
    deadline = time.monotonic() + wait_s
    while True:
        rack = racks.status()
        if all(n.healthy for n in rack.nodes if n.index in nodes):
            return
        if time.monotonic() > deadline:
            raise RdurackError(f"node(s) {nodes} restarted but not healthy after {wait_s:g} s")
        time.sleep(0.25)
