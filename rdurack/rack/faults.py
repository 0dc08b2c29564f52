"""Faults the emulated rack can be made to suffer, and which links and sockets each one
touches. Pure: the orchestrator validates and splits a fault with this module, and each
node agent applies its own part (docs/faults.md says how each fault is noticed and what
becomes of the jobs it hits).

A link fault names the link between two sockets and acts in both directions: each
direction belongs to the node of its sending socket, whose agent applies it. A
partition is every link between two nodes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum

from rdurack.errors import InvalidRequest, RdurackError, UnknownName
from rdurack.rack.topology import SocketId, Topology

# Largest slowdown and extra link latency accepted: beyond them a fault is a typo (a
# socket 10^6 times slower never finishes a job; a transfer delayed by an hour of
# emulated time is a dead link, which DROP_LINK says plainly).
MAX_SLOW_FACTOR = 1e6
MAX_EXTRA_LATENCY_NS = 3_600 * 10**9


class FaultKind(StrEnum):
    KILL_SOCKET = "kill-socket"
    KILL_AGENT = "kill-agent"
    SLOW_SOCKET = "slow"
    DROP_LINK = "drop-link"
    DELAY_LINK = "delay-link"
    PARTITION = "partition"


LINK_KINDS = frozenset({FaultKind.DROP_LINK, FaultKind.DELAY_LINK, FaultKind.PARTITION})


class FaultConflict(RdurackError):
    """A fault that would overlap one in force, or hit a target that is already down
    (FAILED_PRECONDITION on the wire)."""


@dataclass(frozen=True)
class Fault:
    """One injected fault. `sockets`: the socket (kill, slow) or the link's two ends;
    `nodes`: the node (kill-agent) or the two nodes (partition)."""

    id: str
    kind: FaultKind
    sockets: tuple[str, ...] = ()
    nodes: tuple[int, ...] = ()
    slow_factor: float = 1.0  # SLOW_SOCKET: kernels take this many times longer
    extra_latency_ns: int = 0  # DELAY_LINK: per transfer, emulated ns
    injected_s: float = 0.0  # wall clock, s

    def describe(self) -> str:
        """One line for people."""
        k = self.kind
        if k is FaultKind.KILL_SOCKET:
            return f"socket {self.sockets[0]} killed"
        if k is FaultKind.KILL_AGENT:
            return f"node {self.nodes[0]}'s agent killed"
        if k is FaultKind.SLOW_SOCKET:
            return f"socket {self.sockets[0]} {self.slow_factor:g}x slower"
        if k is FaultKind.DROP_LINK:
            return f"link {self.sockets[0]} <-> {self.sockets[1]} dropped"
        if k is FaultKind.DELAY_LINK:
            return (
                f"link {self.sockets[0]} <-> {self.sockets[1]} delayed by "
                f"{self.extra_latency_ns:,} ns"
            )
        return f"nodes {self.nodes[0]} and {self.nodes[1]} partitioned"

    def directed_links(self, topology: Topology) -> list[tuple[str, str]]:
        """The (sender, receiver) pairs a link fault or partition cuts or delays."""
        if self.kind in (FaultKind.DROP_LINK, FaultKind.DELAY_LINK):
            a, b = self.sockets
            return [(a, b), (b, a)]
        if self.kind is FaultKind.PARTITION:
            m, n = self.nodes
            on = {k: [str(s) for s in topology.sockets if s.node == k] for k in (m, n)}
            return [(s, d) for x, y in ((m, n), (n, m)) for s in on[x] for d in on[y]]
        return []

    def nodes_touched(self, topology: Topology) -> list[int]:
        """The nodes whose agents apply a part of this fault, in order."""
        if self.kind is FaultKind.KILL_AGENT:
            return [self.nodes[0]]
        if self.kind in LINK_KINDS:
            return sorted({SocketId.parse(s).node for s, _ in self.directed_links(topology)})
        return [SocketId.parse(self.sockets[0]).node]


def make_fault(
    kind: FaultKind,
    topology: Topology,
    *,
    fault_id: str,
    sockets: tuple[str, ...] = (),
    nodes: tuple[int, ...] = (),
    slow_factor: float = 1.0,
    extra_latency_ns: int = 0,
    injected_s: float = 0.0,
) -> Fault:
    """A validated fault: unknown sockets and nodes are UnknownName (NOT_FOUND), bad
    values InvalidRequest naming the field."""
    if kind in (FaultKind.KILL_SOCKET, FaultKind.SLOW_SOCKET):
        _sockets(topology, sockets, 1, "socket_id")
    if kind in (FaultKind.DROP_LINK, FaultKind.DELAY_LINK):
        _sockets(topology, sockets, 2, "socket_a, socket_b")
        if sockets[0] == sockets[1]:
            raise InvalidRequest(f"socket_b: a link joins two sockets; both ends are {sockets[0]}")
    if kind is FaultKind.KILL_AGENT:
        _nodes(topology, nodes, 1)
    if kind is FaultKind.PARTITION:
        _nodes(topology, nodes, 2)
        if nodes[0] == nodes[1]:
            raise InvalidRequest(f"node_b: a partition cuts two nodes apart; both are {nodes[0]}")
    if kind is FaultKind.SLOW_SOCKET and not (
        math.isfinite(slow_factor) and 1.0 <= slow_factor <= MAX_SLOW_FACTOR
    ):
        raise InvalidRequest(
            f"slow_factor: {slow_factor} is not in 1..{MAX_SLOW_FACTOR:g} (1 is full speed)"
        )
    if kind is FaultKind.DELAY_LINK and not 0 < extra_latency_ns <= MAX_EXTRA_LATENCY_NS:
        raise InvalidRequest(
            f"extra_latency_ns: {extra_latency_ns} is not in 1..{MAX_EXTRA_LATENCY_NS:,} "
            "(to cut a link, drop it)"
        )
    return Fault(
        fault_id,
        kind,
        sockets=tuple(sockets),
        nodes=tuple(nodes),
        slow_factor=slow_factor if kind is FaultKind.SLOW_SOCKET else 1.0,
        extra_latency_ns=extra_latency_ns if kind is FaultKind.DELAY_LINK else 0,
        injected_s=injected_s,
    )


def _sockets(topology: Topology, sockets: tuple[str, ...], count: int, field: str) -> None:
    if len(sockets) != count or not all(sockets):
        raise InvalidRequest(f"{field}: required")
    known = [str(s) for s in topology.sockets]
    for s in sockets:
        if s not in known:
            raise UnknownName(f"socket of {topology.platform.name}", s, known)


def _nodes(topology: Topology, nodes: tuple[int, ...], count: int) -> None:
    if len(nodes) != count:
        raise InvalidRequest(f"node: {count} node index(es) needed, got {len(nodes)}")
    known = [str(n) for n in range(topology.platform.nodes_total)]
    for n in nodes:
        if str(n) not in known:
            raise UnknownName(f"node of {topology.platform.name}", str(n), known)
