"""What a node's sockets must be told about the faults in force: pure decisions.

A node agent keeps the faults with a part on its node (docs/faults.md) and what it last
told each socket actor. From those alone, with no Ray and no clock, this module says:
- whether a new fault may be injected (`admit`: one fault per id, no two of one kind on
  the same target);
- the fault state every local socket and outbound link must have (`wanted`): the most
  severe slowdown of a socket, a link down if any fault drops it, the sum of its delays;
- the calls that bring the actors from what they were told to that (`changes`), in the
  order the agent makes them, each with the line it reports;
- which faults a heal ends and which dead sockets it restarts (`clearing`).
The agent applies the changes and records them (`FaultState.after`), and forgets what a
replaced actor was told (`FaultState.without`): a new actor runs at full speed with
every link up.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from rdurack.errors import InvalidRequest
from rdurack.rack.faults import LINK_KINDS, Fault, FaultConflict, FaultKind
from rdurack.rack.topology import Topology


@dataclass(frozen=True)
class LinkState:
    """One outbound link's fault state."""

    down: bool = False  # every transfer over it fails at once
    delay_ns: int = 0  # extra emulated latency per transfer, ns


UP = LinkState()  # no fault: the link as built
FULL_SPEED = 1.0  # no slowdown: kernels take the time the model says


@dataclass(frozen=True)
class FaultState:
    """Socket slowdowns and outbound link states; what is not listed has no fault."""

    slowdowns: Mapping[str, float] = field(default_factory=dict)  # socket -> factor > 1
    links: Mapping[tuple[str, str], LinkState] = field(default_factory=dict)  # (src, dst)

    def slowdown(self, socket: str) -> float:
        return self.slowdowns.get(socket, FULL_SPEED)

    def link(self, src: str, dst: str) -> LinkState:
        return self.links.get((src, dst), UP)

    def after(self, applied: Iterable[Change]) -> FaultState:
        """This state once the actors have taken `applied`."""
        slowdowns = dict(self.slowdowns)
        links = dict(self.links)
        for c in applied:
            if c.kind is ChangeKind.SLOW:
                slowdowns[c.socket] = float(c.value)
                continue
            key = (c.socket, c.peer)
            was = links.get(key, UP)
            if c.kind is ChangeKind.LINK_DOWN:
                links[key] = LinkState(bool(c.value), was.delay_ns)
            else:
                links[key] = LinkState(was.down, int(c.value))
        return FaultState(
            {s: f for s, f in slowdowns.items() if f != FULL_SPEED},
            {k: v for k, v in links.items() if v != UP},
        )

    def without(self, socket: str) -> FaultState:
        """This state with nothing told to `socket` (its actor was replaced)."""
        return FaultState(
            {s: f for s, f in self.slowdowns.items() if s != socket},
            {k: v for k, v in self.links.items() if k[0] != socket},
        )


class ChangeKind(StrEnum):
    """What a change sets; the value is the socket actor's control method that does."""

    SLOW = "slow"
    LINK_DOWN = "set_link_down"
    LINK_DELAY = "set_link_delay"


@dataclass(frozen=True)
class Change:
    """One call to a socket actor: set its slowdown, or one outbound link's state."""

    kind: ChangeKind
    socket: str  # the actor told (a link's sending end)
    value: float | bool | int  # factor; down; extra latency in ns
    peer: str = ""  # a link's receiving end

    @property
    def args(self) -> tuple[object, ...]:
        """The control method's arguments."""
        return (self.value,) if self.kind is ChangeKind.SLOW else (self.peer, self.value)

    def describe(self) -> str:
        """One line for people, as InjectFault reports it."""
        if self.kind is ChangeKind.SLOW:
            return f"{self.socket} slowdown {self.value:g}"
        if self.kind is ChangeKind.LINK_DOWN:
            return f"{self.socket} -> {self.peer} {'down' if self.value else 'up'}"
        return f"{self.socket} -> {self.peer} +{self.value:,} ns"


def admit(fault: Fault, in_force: Mapping[str, Fault], node_index: int, topology: Topology) -> None:
    """Refuse what node `node_index` cannot inject: KILL_AGENT (ending the agent's
    process is its server's job) and a fault with nothing on this node
    (InvalidRequest); an id already in force, or a fault of the same kind on the same
    target as one in force (FaultConflict)."""
    if fault.kind is FaultKind.KILL_AGENT:
        raise InvalidRequest("kill-agent: the agent's process ends itself, not NodeAgent")
    if node_index not in fault.nodes_touched(topology):
        raise InvalidRequest(f"{fault.describe()}: nothing of it is on node {node_index}")
    if fault.id in in_force:
        raise FaultConflict(f"fault {fault.id} is already in force on this node")
    for other in in_force.values():
        if other.kind is fault.kind and same_target(other, fault):
            raise FaultConflict(
                f"{fault.describe()}: fault {other.id} ({other.describe()}) is already "
                "in force on the same target; heal it first"
            )


def same_target(a: Fault, b: Fault) -> bool:
    """Two faults of one kind on the same socket, link (either way round) or nodes."""
    return set(a.sockets) == set(b.sockets) and set(a.nodes) == set(b.nodes)


def wanted(faults: Iterable[Fault], topology: Topology, local: Collection[str]) -> FaultState:
    """The fault state the faults in force ask of the `local` sockets and of the links
    they send on: the most severe slowdown, down if any fault drops a link, the sum of
    its delays. A link's other direction belongs to its sender's node."""
    slow: dict[str, float] = {}
    links: dict[tuple[str, str], LinkState] = {}
    for f in faults:
        if f.kind is FaultKind.SLOW_SOCKET:
            s = f.sockets[0]
            slow[s] = max(slow.get(s, FULL_SPEED), f.slow_factor)
        elif f.kind in LINK_KINDS:
            for key in f.directed_links(topology):
                if key[0] not in local:
                    continue  # the other node's direction
                was = links.get(key, UP)
                if f.kind is FaultKind.DELAY_LINK:
                    links[key] = LinkState(was.down, was.delay_ns + f.extra_latency_ns)
                else:
                    links[key] = LinkState(True, was.delay_ns)
    return FaultState(
        {s: x for s, x in slow.items() if x != FULL_SPEED},
        {k: v for k, v in links.items() if v != UP},
    )


def changes(want: FaultState, told: FaultState, alive: Sequence[str]) -> list[Change]:
    """The calls that bring the `alive` sockets (in their order) from `told` to `want`:
    slowdowns first, then links in (src, dst) order, a link's down before its delay.
    A dead socket is skipped: it is told everything when it is restarted."""
    out = [
        Change(ChangeKind.SLOW, s, want.slowdown(s))
        for s in alive
        if told.slowdown(s) != want.slowdown(s)
    ]
    up = set(alive)
    for src, dst in sorted(set(want.links) | set(told.links)):
        if src not in up:
            continue
        w, t = want.link(src, dst), told.link(src, dst)
        if w.down != t.down:
            out.append(Change(ChangeKind.LINK_DOWN, src, w.down, dst))
        if w.delay_ns != t.delay_ns:
            out.append(Change(ChangeKind.LINK_DELAY, src, w.delay_ns, dst))
    return out


def clearing(
    fault_id: str, in_force: Mapping[str, Fault], dead: Iterable[str]
) -> tuple[list[Fault], list[str]]:
    """What healing `fault_id` (empty: every fault) ends, and the sockets it restarts:
    a killed socket when its fault ends; every dead socket, whatever killed it, when all
    end. An id with no part here ends nothing."""
    if fault_id:
        cleared = [in_force[fault_id]] if fault_id in in_force else []
        return cleared, [f.sockets[0] for f in cleared if f.kind is FaultKind.KILL_SOCKET]
    return list(in_force.values()), sorted(dead)
