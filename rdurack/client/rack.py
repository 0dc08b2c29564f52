"""A client of rdurack.v1.RackService: the rack as its orchestrator sees it."""

from __future__ import annotations

import grpc

from rdurack.client.connection import RPC_TIMEOUT_S
from rdurack.v1 import rack_pb2, rack_pb2_grpc


class RackClient:
    def __init__(self, channel: grpc.Channel, timeout_s: float = RPC_TIMEOUT_S) -> None:
        self._stub = rack_pb2_grpc.RackServiceStub(channel)
        self.timeout_s = timeout_s

    def status(self) -> rack_pb2.RackStatus:
        """Every node and socket: health, current job, emulated clock, memory per tier."""
        return self._stub.GetRack(rack_pb2.GetRackRequest(), timeout=self.timeout_s).rack
