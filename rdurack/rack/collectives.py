"""Emulated time of transfers and collectives over the links of a topology.

A transfer costs `latency + bytes / bandwidth` over the slowest link of its path, with
the latencies of every hop added. Collectives move data in steps; in a step every
member sends at once over distinct links, so a step lasts as long as its slowest link.
Costs are split into a latency part and a bandwidth part because a fused dataflow
kernel overlaps the bandwidth part with compute but pays the latency serially.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from rdurack.rack.errors import InvalidRequest
from rdurack.rack.spec import LinkSpec
from rdurack.rack.topology import SocketId, Topology

NS = 1e-9


class Algorithm(StrEnum):
    RING = "ring"  # 2(N-1) steps of bytes/N around a ring
    DIRECT = "direct"  # one-shot: whole buffer to every peer; one hop per level
    TWO_SHOT = "two-shot"  # direct reduce-scatter then direct all-gather, bytes/N per peer
    AUTO = "auto"  # the cheapest of the three, as NCCL picks by message size


@dataclass(frozen=True, slots=True)
class Cost:
    latency_s: float
    bandwidth_s: float

    @property
    def total_s(self) -> float:
        return self.latency_s + self.bandwidth_s

    def __add__(self, other: Cost) -> Cost:
        return Cost(self.latency_s + other.latency_s, self.bandwidth_s + other.bandwidth_s)

    def scaled(self, k: float) -> Cost:
        return Cost(self.latency_s * k, self.bandwidth_s * k)


ZERO = Cost(0.0, 0.0)


def link_cost(links: list[LinkSpec], nbytes: float) -> Cost:
    if not links:
        return ZERO
    bandwidth = min(link.bandwidth_bytes_per_s for link in links)
    return Cost(sum(link.latency_ns for link in links) * NS, nbytes / bandwidth)


def transfer(topo: Topology, src: SocketId, dst: SocketId, nbytes: float) -> Cost:
    return link_cost(topo.path(src, dst), nbytes)


def _ring_step(topo: Topology, ring: list[SocketId], chunk: float) -> Cost:
    """One step of a ring: every member sends `chunk` to its successor at once."""
    steps = [transfer(topo, a, ring[(i + 1) % len(ring)], chunk) for i, a in enumerate(ring)]
    return max(steps, key=lambda c: c.total_s)


def ring_all_reduce(topo: Topology, group: list[SocketId], nbytes: float) -> Cost:
    """Reduce-scatter then all-gather around a ring: 2(N-1) steps of nbytes/N each."""
    n = len(group)
    if n == 1:
        return ZERO
    return _ring_step(topo, topo.ring(group), nbytes / n).scaled(2 * (n - 1))


def direct_all_reduce(topo: Topology, group: list[SocketId], nbytes: float) -> Cost:
    """One-shot: every member sends its whole buffer to each peer of its node (one hop),
    then, across nodes, to its rail peers (one more hop), and reduces what it receives.
    Latency is one hop per level. On a mesh the sends to different peers use different
    links; on a switch they share the socket's port, which then carries peers x buffer
    (so there the ring wins once messages are large)."""
    if len(group) == 1:
        return ZERO
    cost = ZERO
    peers = max(sum(1 for t in group if t.node == s.node) - 1 for s in group)
    if peers:
        hop = link_cost([topo.platform.node.intra_node_link], nbytes)
        shared = peers if topo.platform.node.fabric == "switch" else 1
        cost += Cost(hop.latency_s, shared * hop.bandwidth_s)
    nodes = topo.nodes_of(group)
    if nodes > 1:
        hop = link_cost([topo.platform.inter_node_link], nbytes)
        cost += Cost(hop.latency_s, (nodes - 1) * hop.bandwidth_s)
    return cost


def two_shot_all_reduce(topo: Topology, group: list[SocketId], nbytes: float) -> Cost:
    """Reduce-scatter, then all-gather, each as one direct exchange: a member sends the
    peer-th 1/N of its buffer to every peer at once, reduces its own 1/N, and sends the
    result back the same way. Two hops; on a mesh each link carries bytes/N per hop,
    on a switch the port carries (N-1)/N of the buffer. Between nodes the rails join
    the node-level results in one more hop."""
    n = len(group)
    if n == 1:
        return ZERO
    per_node = max(sum(1 for t in group if t.node == s.node) for s in group)
    cost = ZERO
    if per_node > 1:
        hop = link_cost([topo.platform.node.intra_node_link], nbytes / per_node)
        shared = per_node - 1 if topo.platform.node.fabric == "switch" else 1
        cost += Cost(hop.latency_s, shared * hop.bandwidth_s).scaled(2)
    nodes = topo.nodes_of(group)
    if nodes > 1:
        # Each member exchanges its reduced 1/per_node share with its rail peers.
        hop = link_cost([topo.platform.inter_node_link], nbytes / per_node)
        cost += Cost(hop.latency_s, (nodes - 1) * hop.bandwidth_s)
    return cost


ALGORITHMS = {
    Algorithm.RING: ring_all_reduce,
    Algorithm.DIRECT: direct_all_reduce,
    Algorithm.TWO_SHOT: two_shot_all_reduce,
}


def all_reduce(
    topo: Topology, group: list[SocketId], nbytes: float, algorithm: Algorithm = Algorithm.AUTO
) -> Cost:
    if nbytes < 0:
        raise InvalidRequest(f"all-reduce of {nbytes} bytes")
    if algorithm is not Algorithm.AUTO:
        return ALGORITHMS[algorithm](topo, group, nbytes)
    return min((f(topo, group, nbytes) for f in ALGORITHMS.values()), key=lambda c: c.total_s)


def broadcast(topo: Topology, group: list[SocketId], root: SocketId, nbytes: float) -> Cost:
    """Pipelined ring broadcast from `root` in N chunks: (N-1) + (N-1) chunk steps."""
    n = len(group)
    if root not in group:
        raise InvalidRequest(f"broadcast root {root} is not in the group")
    if n == 1:
        return ZERO
    ring = topo.ring(group)
    start = ring.index(root)
    ring = ring[start:] + ring[:start]
    chunk = nbytes / n
    return _ring_step(topo, ring, chunk).scaled(2 * (n - 1))


def all_gather(topo: Topology, group: list[SocketId], nbytes_per_member: float) -> Cost:
    """Ring all-gather: N-1 steps, each forwarding one member's buffer."""
    n = len(group)
    if n == 1:
        return ZERO
    return _ring_step(topo, topo.ring(group), nbytes_per_member).scaled(n - 1)


def barrier(topo: Topology, group: list[SocketId]) -> Cost:
    """A zero-byte direct all-reduce: one hop per level."""
    return direct_all_reduce(topo, group, 0.0)
