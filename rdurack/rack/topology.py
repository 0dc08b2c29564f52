"""Which sockets link to which: all-to-all inside a node, rails between nodes."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from rdurack.errors import InvalidRequest
from rdurack.rack.spec import LinkSpec, PlatformSpec


@dataclass(frozen=True, slots=True, order=True)
class SocketId:
    node: int
    index: int

    def __str__(self) -> str:
        return f"rdu-n{self.node}-s{self.index}"

    @classmethod
    def parse(cls, text: str) -> SocketId:
        try:
            prefix, node, index = text.split("-")
            if prefix != "rdu" or node[0] != "n" or index[0] != "s":
                raise ValueError
            return cls(int(node[1:]), int(index[1:]))
        except (ValueError, IndexError):
            raise InvalidRequest(f"bad socket id {text!r}: expected rdu-n<node>-s<index>") from None


class LinkKind(StrEnum):
    """What a transfer between two sockets crosses."""

    INTRA_NODE = "intra-node"  # the node's mesh or switch
    INTER_NODE = "inter-node"  # a rail to the other node (then its mesh, if the index differs)


def link_name(src: SocketId, dst: SocketId) -> str:
    """One direction of a link as traces name it: `rdu-n0-s0->rdu-n0-s1`."""
    return f"{src}->{dst}"


class Topology:
    """The links of a platform. Inside a node every socket reaches every other one over
    `intra_node_link` (a link per pair on a mesh, a port per socket on a switch); between
    nodes a socket reaches the socket of the same index over its rail
    (`inter_node_link`). Other pairs route through the rail peer."""

    def __init__(self, platform: PlatformSpec) -> None:
        self.platform = platform
        self._sockets = [
            SocketId(n, i) for n in range(platform.nodes) for i in range(platform.node.sockets)
        ]

    @property
    def sockets(self) -> list[SocketId]:
        return list(self._sockets)

    def check(self, socket: SocketId) -> None:
        if not (
            0 <= socket.node < self.platform.nodes
            and 0 <= socket.index < self.platform.node.sockets
        ):
            raise InvalidRequest(f"{socket} is not a socket of {self.platform.name}")

    def link(self, src: SocketId, dst: SocketId) -> LinkSpec | None:
        """The direct link src -> dst, or None when there is none."""
        if src == dst:
            return None
        if src.node == dst.node:
            return self.platform.node.intra_node_link
        if src.index == dst.index:
            return self.platform.inter_node_link
        return None

    def kind(self, src: SocketId, dst: SocketId) -> LinkKind:
        """Whether a transfer src -> dst stays in a node or crosses to the other one."""
        self.check(src)
        self.check(dst)
        return LinkKind.INTRA_NODE if src.node == dst.node else LinkKind.INTER_NODE

    def path(self, src: SocketId, dst: SocketId) -> list[LinkSpec]:
        """Links a transfer crosses: direct, or the rail then the destination node's mesh."""
        self.check(src)
        self.check(dst)
        if src == dst:
            return []
        direct = self.link(src, dst)
        if direct is not None:
            return [direct]
        return [self.platform.inter_node_link, self.platform.node.intra_node_link]

    def ring(self, group: list[SocketId]) -> list[SocketId]:
        """An order for a ring over `group` that crosses between nodes as few times as
        possible: node by node, alternating index direction, so that consecutive nodes
        meet on a rail when the group holds whole nodes (n0s0..n0s7, n1s7..n1s0)."""
        for s in group:
            self.check(s)
        if len(set(group)) != len(group):
            raise InvalidRequest("a collective group lists a socket twice")
        by_node: dict[int, list[SocketId]] = {}
        for s in sorted(group):
            by_node.setdefault(s.node, []).append(s)
        order: list[SocketId] = []
        for k, node in enumerate(sorted(by_node)):
            members = by_node[node]
            order += members if k % 2 == 0 else list(reversed(members))
        return order

    def nodes_of(self, group: list[SocketId]) -> int:
        return len({s.node for s in group})
