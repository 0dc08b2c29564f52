"""Which sockets link to which: all-to-all inside a node, rails between the nodes of a
rack, the spine (on the same rails) between racks."""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum
from functools import total_ordering

from rdurack.errors import InvalidRequest
from rdurack.rack.spec import LinkSpec, PlatformSpec

_NAME = re.compile(r"rdu(?:-r(\d+))?-n(\d+)-s(\d+)")


@total_ordering
@dataclass(frozen=True, slots=True)
class SocketId:
    """Socket `index` of node `node`, in rack `rack`.

    Nodes count across the platform, as hosts do: rack r holds nodes r·N..r·N+N-1 (N
    nodes a rack), so a node's number alone names its host and its agent, on one rack or
    many. Names: `rdu-n<node>-s<index>` in rack 0 (so a one-rack platform's names are
    what they always were) and `rdu-r<rack>-n<node>-s<index>` in any other rack, which
    carries the rack for the reader (Topology.check holds it to node // N). Sockets
    order rack by rack, node by node, then by index: rank order."""

    node: int
    index: int
    rack: int = 0

    def __str__(self) -> str:
        rack = f"-r{self.rack}" if self.rack else ""
        return f"rdu{rack}-n{self.node}-s{self.index}"

    def _key(self) -> tuple[int, int, int]:
        return (self.rack, self.node, self.index)

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, SocketId):
            return NotImplemented
        return self._key() < other._key()

    @classmethod
    def parse(cls, text: str) -> SocketId:
        match = _NAME.fullmatch(text)
        # rdu-r0-... is refused: rack 0's name has no rack part, so each socket has one name.
        if match is None or (match[1] is not None and int(match[1]) == 0):
            raise InvalidRequest(
                f"bad socket id {text!r}: expected rdu-n<node>-s<index> (rack 0) or "
                "rdu-r<rack>-n<node>-s<index>"
            )
        return cls(int(match[2]), int(match[3]), int(match[1] or 0))


class LinkKind(StrEnum):
    """What a transfer between two sockets crosses."""

    INTRA_NODE = "intra-node"  # the node's mesh or switch
    INTER_NODE = "inter-node"  # a rail to the other node (then its mesh, if the index differs)
    INTER_RACK = "inter-rack"  # the spine to another rack (then its mesh, if the index differs)


def link_name(src: SocketId, dst: SocketId) -> str:
    """One direction of a link as traces name it: `rdu-n0-s0->rdu-n0-s1`."""
    return f"{src}->{dst}"


class Topology:
    """The links of a platform. Inside a node every socket reaches every other one over
    `intra_node_link` (a link per pair on a mesh, a port per socket on a switch); between
    the nodes of a rack a socket reaches the socket of the same index over its rail
    (`inter_node_link`); between racks, the socket of the same index over the spine
    (`spine.link`). Other pairs route through the rail (or spine) peer, then its mesh."""

    def __init__(self, platform: PlatformSpec) -> None:
        self.platform = platform
        self._sockets = [
            SocketId(r * platform.nodes + n, i, r)
            for r in range(platform.racks)
            for n in range(platform.nodes)
            for i in range(platform.node.sockets)
        ]

    @property
    def sockets(self) -> list[SocketId]:
        return list(self._sockets)

    def check(self, socket: SocketId) -> None:
        if not (
            0 <= socket.rack < self.platform.racks
            and 0 <= socket.node < self.platform.nodes_total
            and socket.node // self.platform.nodes == socket.rack
            and 0 <= socket.index < self.platform.node.sockets
        ):
            raise InvalidRequest(f"{socket} is not a socket of {self.platform.name}")

    def _across(self, src: SocketId, dst: SocketId) -> LinkSpec:
        """The link between hosts: the rail inside a rack, the spine between racks."""
        if src.rack == dst.rack:
            return self.platform.inter_node_link
        assert self.platform.spine is not None  # the spec refuses racks > 1 without one
        return self.platform.spine.link

    def link(self, src: SocketId, dst: SocketId) -> LinkSpec | None:
        """The direct link src -> dst, or None when there is none."""
        if src == dst:
            return None
        if src.node == dst.node:
            return self.platform.node.intra_node_link
        if src.index == dst.index:
            return self._across(src, dst)
        return None

    def kind(self, src: SocketId, dst: SocketId) -> LinkKind:
        """Whether a transfer src -> dst stays in a node, crosses to another node of the
        rack, or to another rack."""
        self.check(src)
        self.check(dst)
        if src.rack != dst.rack:
            return LinkKind.INTER_RACK
        return LinkKind.INTRA_NODE if src.node == dst.node else LinkKind.INTER_NODE

    def path(self, src: SocketId, dst: SocketId) -> list[LinkSpec]:
        """Links a transfer crosses: direct, or the rail (spine) then the destination
        node's mesh."""
        self.check(src)
        self.check(dst)
        if src == dst:
            return []
        direct = self.link(src, dst)
        if direct is not None:
            return [direct]
        return [self._across(src, dst), self.platform.node.intra_node_link]

    def ring(self, group: list[SocketId]) -> list[SocketId]:
        """An order for a ring over `group` that crosses between nodes (and racks) as few
        times as possible: rack by rack, node by node, alternating index direction, so
        that consecutive nodes meet on a rail when the group holds whole nodes
        (n0s0..n0s7, n1s7..n1s0, then r1-n0s0...)."""
        for s in group:
            self.check(s)
        if len(set(group)) != len(group):
            raise InvalidRequest("a collective group lists a socket twice")
        by_host: dict[int, list[SocketId]] = {}
        for s in sorted(group):
            by_host.setdefault(s.node, []).append(s)
        order: list[SocketId] = []
        for k, host in enumerate(sorted(by_host)):
            members = by_host[host]
            order += members if k % 2 == 0 else list(reversed(members))
        return order

    def nodes_of(self, group: list[SocketId]) -> int:
        """Distinct nodes (hosts) the group spans, over all racks."""
        return len({s.node for s in group})

    def racks_of(self, group: list[SocketId]) -> int:
        return len({s.rack for s in group})
