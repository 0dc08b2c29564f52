"""A socket's collective engine: the schedules of rack/collectives.py run over the
socket's gRPC links.

Every member of a group derives the same schedule from the same arguments (`plan`) and
runs its part of it (`run`): each step's sends go on the wire, then the member takes
the messages that step brings it. Functional mode sends real bytes (a buffer, summed,
averaged or copied in place), timing mode sized descriptors; both price every transfer
by the link rule (rack/links.py) on the engine's link busy times, so the emulated time
equals the predictor's. A call that fails on a link drops what its tag left in the
mailbox.

What a call runs on is given, never swapped on the socket: the clock it advances (the
socket's, or a stream of its own: a training rank's communication stream) and how long
it waits for a peer (wall seconds) per call; the link busy times per engine (the
socket's own sends, or fresh ones from `scratch` for bookkeeping exchanges that the
emulated hardware does not make). A delayed link (a fault) adds its latency to every
transfer on it, whichever engine sends.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from rdurack.errors import InvalidRequest, LinkFailure
from rdurack.node_agent.links.endpoint import LinkEndpoint
from rdurack.node_agent.links.mailbox import Message
from rdurack.node_agent.links.sending import DELIVER_MAX_BYTES, OutgoingTransfer, Sends
from rdurack.node_agent.timeline.hardware_trace import Sent, Traffic
from rdurack.rack.clock import EmulatedClock
from rdurack.rack.collectives import (
    WHOLE,
    Algorithm,
    Links,
    Schedule,
    all_gather_schedule,
    all_reduce_schedule,
    barrier_schedule,
    broadcast_schedule,
    split,
)
from rdurack.rack.collectives import Send as ScheduledSend
from rdurack.rack.topology import SocketId, Topology, link_name

COLLECTIVE_OPS = ("all_reduce", "broadcast", "all_gather", "barrier", "send")
# What an all-reduce makes of the members' buffers: each element-wise, associative and
# commutative (the ring combines chunks in ring order), "mean" the sum divided at the end.
REDUCE_OPS = ("sum", "mean", "max", "min", "product")
_COMBINE: dict[str, np.ufunc] = {
    "sum": np.add,
    "mean": np.add,
    "max": np.maximum,
    "min": np.minimum,
    "product": np.multiply,
}


@dataclass(frozen=True)
class Plan:
    """One collective as every member of its group derives it."""

    op: str
    members: list[SocketId]  # rank order
    schedule: Schedule
    elements: int  # of the buffer each member holds
    itemsize: int  # bytes
    reduce_op: str = "sum"  # an all-reduce's (REDUCE_OPS)

    @property
    def mean(self) -> bool:
        """An all-reduce that divides the sum by the group's size."""
        return self.op == "all_reduce" and self.reduce_op == "mean"

    @property
    def nbytes(self) -> int:
        return self.elements * self.itemsize


class Exchanged(NamedTuple):
    """What a member's part of a collective left: its result and its traffic."""

    buffer: np.ndarray | None  # flat; all-gather's is new, the others' the buffer given
    traffic: Traffic


class CollectiveEngine:
    """The collectives of socket `me` over `endpoint`'s links, with link busy times of
    its own: the ones its sends take and leave."""

    def __init__(
        self,
        me: SocketId,
        topology: Topology,
        endpoint: LinkEndpoint,
        delays_ns: dict[str, int] | None = None,
    ) -> None:
        """`delays_ns`: extra latency per peer (a fault), shared with the engines made
        from this one."""
        self.me = me
        self.topology = topology
        self._endpoint = endpoint
        self._links = Links(topology)
        self._delays_ns = delays_ns if delays_ns is not None else {}

    def scratch(self) -> CollectiveEngine:
        """An engine over the same links with fresh busy times: its transfers leave no
        trace on this one's (bookkeeping the emulated hardware does not make)."""
        return CollectiveEngine(self.me, self.topology, self._endpoint, self._delays_ns)

    def set_delay(self, peer: str, extra_latency_ns: int) -> None:
        """Transfers to `peer` arrive `extra_latency_ns` later (0: no delay)."""
        if extra_latency_ns:
            self._delays_ns[peer] = extra_latency_ns
        else:
            self._delays_ns.pop(peer, None)

    def plan(
        self,
        op: str,
        members: list[SocketId],
        buffer: np.ndarray | None = None,
        *,
        nbytes: int = 0,
        itemsize: int = 4,
        root: str | None = None,
        algorithm: str = "ring",
        reduce_op: str = "sum",
    ) -> Plan:
        """The schedule every member derives identically from the same arguments: for
        `buffer` (functional mode), or `nbytes` of `itemsize` (timing mode: no buffer).
        `root`: the source of a broadcast or send (default: the first member)."""
        check(op, reduce_op)
        if buffer is not None and reduce_op == "mean" and buffer.dtype.kind not in "fc":
            raise InvalidRequest(f"a mean all-reduce needs floating point data, not {buffer.dtype}")
        topo = self.topology
        elements = buffer.size if buffer is not None else nbytes // itemsize
        itemsize = buffer.itemsize if buffer is not None else itemsize
        if op == "all_reduce":
            try:
                alg = Algorithm(algorithm)
            except ValueError:
                accepted = ", ".join(a.value for a in Algorithm)
                raise InvalidRequest(
                    f"unknown algorithm {algorithm!r}; accepted: {accepted}"
                ) from None
            schedule = all_reduce_schedule(topo, members, elements, itemsize, alg)
        elif op == "broadcast":
            src = SocketId.parse(root) if root else members[0]
            schedule = broadcast_schedule(topo, members, src, elements, itemsize)
        elif op == "all_gather":
            schedule = all_gather_schedule(topo, members, elements, itemsize)
        elif op == "barrier":
            schedule = barrier_schedule(topo, members)
        else:  # send: root sends to the other member of a two-member group
            if len(members) != 2:
                raise InvalidRequest(f"send needs a group of two sockets, got {len(members)}")
            src = SocketId.parse(root) if root else members[0]
            dst = members[1] if src == members[0] else members[0]
            schedule = ((ScheduledSend(src, dst, elements * itemsize, WHOLE, False),),)
        return Plan(op, members, schedule, elements, itemsize, reduce_op)

    def run(
        self,
        tag: str,
        plan: Plan,
        clock: EmulatedClock,
        timeout_s: float,
        buffer: np.ndarray | None = None,
        sequence: str = "",
    ) -> Exchanged:
        """This socket's part of `plan` on `clock`, waiting at most `timeout_s` wall
        seconds for each message. `buffer` (functional mode; contiguous) is reduced or
        copied in place, but for all-gather's result, which is larger.

        `sequence`: a prefix of `tag` that names the collective's place in its group's
        sequence (the rest says what it is). A message under the same prefix with
        another tag means a peer issued a different collective in that place: the wait
        fails at once with `CollectiveMismatch` instead of running into the timeout."""
        if buffer is not None:
            buffer = self._gather_buffer(buffer, plan) if plan.op == "all_gather" else buffer
            buffer = buffer.reshape(-1)
        try:
            traffic = self._execute(tag, plan, clock, timeout_s, buffer, sequence)
        except LinkFailure:
            self._endpoint.mailbox.discard(tag)
            raise
        if plan.mean and buffer is not None:
            buffer /= np.asarray(len(plan.members), dtype=buffer.dtype)
        return Exchanged(buffer, traffic)

    def _gather_buffer(self, data: np.ndarray, plan: Plan) -> np.ndarray:
        """All-gather's output: block b travels as the block of ring position b."""
        flat = data.reshape(-1)
        out = np.zeros(len(plan.members) * flat.size, dtype=flat.dtype)
        pos = self.topology.ring(plan.members).index(self.me)
        out[pos * flat.size : (pos + 1) * flat.size] = flat
        return out

    def _execute(
        self,
        tag: str,
        plan: Plan,
        clock: EmulatedClock,
        timeout_s: float,
        buffer: np.ndarray | None,
        sequence: str,
    ) -> Traffic:
        me = self.me
        traffic = Traffic()
        # Sends go on the wire and the socket takes its incoming messages at once: each
        # step waits for its input, not for its own acknowledgements too. They are all
        # collected at the end; one that failed ends the wait for a reply at once.
        # Messages of at most DELIVER_MAX_BYTES (and timing-only ones) go on one stream
        # per peer for the whole collective (the outbox), copied as they go; its deadline
        # allows each step the wait a message is allowed. Larger ones stream from the
        # buffer, each its own call, waited for before the buffer changes.
        pending: list[Sends] = []
        outbox = self._endpoint.outbox(timeout_s * max(1, len(plan.schedule)))

        mailbox = self._endpoint.mailbox
        combine = _COMBINE[plan.reduce_op]

        def failed() -> LinkFailure | None:
            if sequence and (stray := mailbox.stray(sequence, tag)) is not None:
                return CollectiveMismatch(str(me), tag, stray.src, stray.tag)
            if (e := outbox.failure()) is not None:
                return e
            return next((e for p in pending if (e := p.failure()) is not None), None)

        try:
            for index, step in enumerate(plan.schedule):
                large: list[OutgoingTransfer] = []
                for s in step:
                    if s.src == me:
                        t = self._send(tag, index, s, clock.now_ns, buffer, traffic)
                        if t.payload is not None and t.nbytes > DELIVER_MAX_BYTES:
                            large.append(t)
                        else:
                            outbox.send(t)
                if large:
                    sends = self._endpoint.start_all(large, timeout_s=timeout_s)
                    pending.append(sends)
                    if sends.reads_payload:
                        sends.wait()
                for s in (s for s in step if s.dst == me):
                    msg = self._endpoint.receive(tag, index, str(s.src), timeout_s, give_up=failed)
                    clock.advance_to(msg.arrival_ns)
                    traffic.bytes_received += s.nbytes
                    if buffer is not None:
                        _apply(carried(buffer, s), msg, combine if s.reduce else None, timeout_s)
            outbox.wait()
            for sends in pending:
                sends.wait()
        except BaseException:  # a failure, or anything else: nothing stays on the wire
            outbox.cancel()
            for sends in pending:
                sends.cancel()
            raise
        if plan.op == "all_gather" and buffer is not None:
            # Reorder blocks from ring positions to rank order.
            ring = self.topology.ring(plan.members)
            block = buffer.size // len(plan.members)
            ordered = np.concatenate(
                [buffer[ring.index(m) * block : (ring.index(m) + 1) * block] for m in plan.members]
            )
            buffer[...] = ordered
        return traffic

    def _send(
        self,
        tag: str,
        step: int,
        s: ScheduledSend,
        now_ns: int,
        buffer: np.ndarray | None,
        traffic: Traffic,
    ) -> OutgoingTransfer:
        """One send of a step, priced by the link rule and counted in `traffic`."""
        _, arrival = self._links.state(self.me, s.dst).transmit(now_ns, s.nbytes)
        arrival += self._delays_ns.get(str(s.dst), 0)  # a delayed link (fault)
        traffic.bytes_sent += s.nbytes
        traffic.sends.append(
            Sent(
                link_name(self.me, s.dst),
                self.topology.kind(self.me, s.dst).value,
                now_ns,
                arrival,
                s.nbytes,
            )
        )
        return OutgoingTransfer(
            dst=str(s.dst),
            tag=tag,
            step=step,
            send_ns=now_ns,
            arrival_ns=arrival,
            nbytes=s.nbytes,
            # A view, no copy: start_all copies it into its message, or (streamed) is
            # waited for before the buffer changes.
            payload=None if buffer is None else carried(buffer, s).data,
            dtype=str(buffer.dtype) if buffer is not None else "",
        )


class CollectiveMismatch(LinkFailure):
    """Two members issued different collectives at the same place in their group's
    sequence (tags: what each issued)."""

    def __init__(self, me: str, mine: str, peer: str, theirs: str) -> None:
        self.me, self.mine, self.peer, self.theirs = me, mine, peer, theirs
        super().__init__(
            f"{me} issued {mine!r} where {peer} issued {theirs!r}: every member of a group "
            "must issue the same collectives, with the same shapes, in the same order"
        )

    def __reduce__(self) -> tuple[type, tuple[str, str, str, str]]:
        return (type(self), (self.me, self.mine, self.peer, self.theirs))


def check(op: str, reduce_op: str = "sum") -> None:
    """Refuse an operation or a reduce op the engine does not run, naming those it does."""
    if op not in COLLECTIVE_OPS:
        raise InvalidRequest(f"unknown collective {op!r}; accepted: {', '.join(COLLECTIVE_OPS)}")
    if reduce_op not in REDUCE_OPS:
        raise InvalidRequest(f"unknown reduce op {reduce_op!r}; accepted: {', '.join(REDUCE_OPS)}")


def carried(buffer: np.ndarray, send: ScheduledSend) -> np.ndarray:
    """The part of `buffer` a send carries: chunk `send.chunk` of `send.parts` (and part
    `send.sub` of that), split by the same rule the schedule used for its byte counts."""
    if send.chunk == WHOLE:
        return buffer
    sizes = split(buffer.size, send.parts)
    lo = sum(sizes[: send.chunk])
    chunk = buffer[lo : lo + sizes[send.chunk]]
    if send.sub == WHOLE:
        return chunk
    subs = split(chunk.size, send.subparts)
    lo = sum(subs[: send.sub])
    return chunk[lo : lo + subs[send.sub]]


def _apply(target: np.ndarray, msg: Message, combine: np.ufunc | None, timeout_s: float) -> None:
    """Combine (`combine`: add, max, ...) or copy a received message's data into
    `target`, piece by piece as it arrives (mailbox.Parts): no copy of the whole message
    first, and none after its last byte but the last chunk's."""
    if msg.parts is None:
        return
    offset = 0
    for piece in msg.parts.read(timeout_s, multiple=target.itemsize):
        incoming = np.frombuffer(piece, dtype=target.dtype)
        part = target[offset : offset + incoming.size]
        if combine is not None:
            combine(part, incoming, out=part)
        else:
            part[...] = incoming
        offset += incoming.size
