"""proto <-> domain conversion of injected faults (rdurack.v1.Fault), both directions."""

from __future__ import annotations

from rdurack.errors import InvalidRequest
from rdurack.rack.faults import Fault, FaultKind, make_fault
from rdurack.rack.topology import Topology
from rdurack.v1 import fault_pb2
from rdurack.wire.jobs import timestamp

KINDS: dict[int, FaultKind] = {
    fault_pb2.FAULT_KIND_KILL_SOCKET: FaultKind.KILL_SOCKET,
    fault_pb2.FAULT_KIND_KILL_AGENT: FaultKind.KILL_AGENT,
    fault_pb2.FAULT_KIND_SLOW_SOCKET: FaultKind.SLOW_SOCKET,
    fault_pb2.FAULT_KIND_DROP_LINK: FaultKind.DROP_LINK,
    fault_pb2.FAULT_KIND_DELAY_LINK: FaultKind.DELAY_LINK,
    fault_pb2.FAULT_KIND_PARTITION: FaultKind.PARTITION,
}
KIND_TO_PROTO = {v: fault_pb2.FaultKind.ValueType(k) for k, v in KINDS.items()}


def fault_to_proto(f: Fault) -> fault_pb2.Fault:
    return fault_pb2.Fault(
        id=f.id,
        kind=KIND_TO_PROTO[f.kind],
        socket_ids=list(f.sockets),
        node_indices=list(f.nodes),
        slow_factor=f.slow_factor,
        extra_latency_ns=f.extra_latency_ns,
        injected_time=timestamp(f.injected_s),
        description=f.describe(),
    )


def fault_from_proto(p: fault_pb2.Fault, topology: Topology) -> Fault:
    """A fault as a peer sent it, validated again against this rack (bad input is a
    clear InvalidRequest or UnknownName, whoever sent it)."""
    if p.kind not in KINDS:
        raise InvalidRequest(f"fault.kind: {p.kind} is not a fault kind")
    if not p.id:
        raise InvalidRequest("fault.id: required")
    try:
        injected_s = p.injected_time.ToNanoseconds() * 1e-9
    except ValueError as e:  # seconds outside what a Timestamp may hold
        raise InvalidRequest(f"fault.injected_time: {e}") from None
    return make_fault(
        KINDS[p.kind],
        topology,
        fault_id=p.id,
        sockets=tuple(p.socket_ids),
        nodes=tuple(p.node_indices),
        slow_factor=p.slow_factor,
        extra_latency_ns=p.extra_latency_ns,
        injected_s=injected_s,
    )
