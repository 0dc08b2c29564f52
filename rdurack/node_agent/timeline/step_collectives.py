"""The collectives inside a kernel's step, drawn on the socket's trace.

A kernel job prices its step's tensor-parallel all-reduces inside the step
(rack/timing.py): its sockets send nothing over their gRPC links for them, so no
`rdu.collective` would show which links a step uses, what goes on each and how long
it takes. The socket therefore *draws* each distinct collective of the step once, on
the first call of a job: the schedule the timing model prices
(collectives.pick_all_reduce over the job's group, in rank order), simulated by the
link rule, as an `rdu.collective` span with `rdurack.collective.drawn` true and an
`rdu.transfer` per send. They are laid one after another from the kernel's start, in
step order, each starting when the group has finished the one before; the span says how
many times a step runs it (`rdurack.collective.per_step`). Where in the step each runs
is not drawn: a fused plan overlaps them with the weight stream.

In an MoE layer the attention all-reduce is the expert dispatch: it leaves every token
on every socket, beside the experts (rack/layers.py), and the experts' all-reduce is the
combine; `rdurack.moe.role` says which.
"""

from __future__ import annotations

from dataclasses import dataclass

from opentelemetry.context import Context
from opentelemetry.util.types import AttributeValue

from rdurack.errors import InvalidRequest
from rdurack.node_agent.timeline.hardware_trace import HardwareTrace, Sent, Traffic
from rdurack.rack.collectives import BF16_BYTES, Send, elements_of, pick_all_reduce, simulate
from rdurack.rack.layers import MOE_ROLES
from rdurack.rack.ops import OpKind, Step
from rdurack.rack.topology import SocketId, Topology, link_name
from rdurack.telemetry import names


@dataclass(frozen=True, slots=True)
class StepCollective:
    """One all-reduce of a step: its block and op, its buffer, how often a step runs it."""

    block: str
    op: str
    nbytes: float
    per_step: int

    @property
    def tag(self) -> str:
        return f"{self.block}.{self.op}"


def step_collectives(step: Step) -> list[StepCollective]:
    """The step's all-reduces, each (block, op) once, in step order."""
    found: dict[tuple[str, str], StepCollective] = {}
    for block, repeats in step.blocks:
        for op in block.ops:
            if op.kind is not OpKind.ALL_REDUCE:
                continue
            key = (block.name, op.name)
            seen = found.get(key)
            per_step = repeats + (seen.per_step if seen else 0)
            found[key] = StepCollective(block.name, op.name, op.reduce_bytes, per_step)
    return list(found.values())


@dataclass(frozen=True, slots=True)
class Drawn:
    """`me`'s part of one drawn all-reduce."""

    end_ns: int  # when `me` has every part it waits for
    group_end_ns: int  # when the last member has
    attributes: dict[str, AttributeValue]
    traffic: Traffic  # what `me` sent and received


def draw(
    topology: Topology,
    group: list[SocketId],
    me: SocketId,
    collective: StepCollective,
    start_ns: int,
) -> Drawn:
    """`me`'s part of one all-reduce over `group`, every member starting at `start_ns`,
    as the link rule times it."""
    if me not in group:
        raise InvalidRequest(f"{me} is not in the group {[str(g) for g in group]}")
    elements = elements_of(collective.nbytes, BF16_BYTES)
    algorithm, schedule = pick_all_reduce(topology, group, elements, BF16_BYTES)
    traffic = Traffic()

    def observe(s: Send, send_ns: int, arrival_ns: int) -> None:
        if s.src == me:
            traffic.bytes_sent += s.nbytes
            kind = topology.kind(s.src, s.dst).value
            traffic.sends.append(Sent(link_name(s.src, s.dst), kind, send_ns, arrival_ns, s.nbytes))
        if s.dst == me:
            traffic.bytes_received += s.nbytes

    clocks = simulate(topology, schedule, start_ns, observe)
    attributes: dict[str, AttributeValue] = {
        names.ATTR_COLLECTIVE_OP: "all_reduce",
        names.ATTR_COLLECTIVE_ALGORITHM: algorithm.value,
        names.ATTR_COLLECTIVE_TAG: collective.tag,
        names.ATTR_GROUP_SIZE: len(group),
        names.ATTR_BYTES: elements * BF16_BYTES,
        names.ATTR_COLLECTIVE_DRAWN: True,
        names.ATTR_COLLECTIVE_PER_STEP: collective.per_step,
    }
    role = MOE_ROLES.get((collective.block, collective.op))
    if role is not None:
        attributes[names.ATTR_MOE_ROLE] = role
    end_ns = clocks.get(me, start_ns)
    return Drawn(end_ns, max(clocks.values(), default=end_ns), attributes, traffic)


def draw_step(
    hardware: HardwareTrace,
    parent: Context,
    job_id: str,
    topology: Topology,
    group: list[str],
    me: SocketId,
    step: Step,
    start_ns: int,
) -> None:
    """Draw the step's collectives one after another from `start_ns` as `me`'s spans,
    children of `parent`; `group`: the job's sockets in rank order."""
    members = [SocketId.parse(g) for g in group]
    for collective in step_collectives(step):
        d = draw(topology, members, me, collective, start_ns)
        hardware.collective(parent, job_id, start_ns, d.end_ns, d.attributes, d.traffic)
        start_ns = d.group_end_ns
