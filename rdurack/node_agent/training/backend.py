"""A DDP rank's process group over its socket's links: `LinkBackend` is
workloads/training/backend.py's Backend (torch's DDP reaches it through the built-in
loop's process group, workloads/training/group.py), each collective a ring over the
socket's collective engine (node_agent/collective_engine.py).

Streams: gradient buckets are all-reduced on a communication stream of their own:
bucket i starts when its gradients are ready during backward (or when the previous
bucket is done) and the stream is a clock of its own, so all-reduce time hides behind
backward as in torch DDP (scaling.py); the compute stream (the socket's clock) waits
for it before the next step (`settle`). Other collectives (the initial broadcast,
replica checks, barriers) run on the socket's clock. Both take the socket's link busy
times. Clocks of different ranks meet at every transfer (the link rule), so a straggler
delays the step of every rank.

Lateness: when a rank's backward ends, the ranks exchange the emulated times they got
there (a bookkeeping exchange on a scratch clock and scratch links: no emulated time, no
link traffic). A rank later than the process group's timeout (emulated seconds) fails
the job on every rank, naming it (`Straggler`). A rank that never arrives is caught by
the links' wall-clock deadline, the workload's `wall_timeout_s`.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from rdurack.errors import InvalidRequest, RdurackError
from rdurack.node_agent.collective_engine import CollectiveEngine, Exchanged
from rdurack.node_agent.training.spans import GradientWindow
from rdurack.rack.clock import EmulatedClock
from rdurack.rack.topology import SocketId
from rdurack.workloads.training.data import Array


class Straggler(RdurackError):
    """A rank reached a collective later than the process group's timeout allows."""

    def __init__(self, rank: int, socket: str, late_s: float, timeout_s: float, step: int):
        self.args_ = (rank, socket, late_s, timeout_s, step)
        super().__init__(
            f"rank {rank} ({socket}) reached the gradient all-reduce of step {step} "
            f"{late_s:.6g} emulated s after the first rank; the process group's timeout is "
            f"{timeout_s:.6g} s. Raise the timeout above the slowest rank's lag, or find "
            f"why that socket is slow"
        )

    def __reduce__(self) -> tuple[type, tuple[int, str, float, float, int]]:
        return (type(self), self.args_)


class LinkBackend:
    """Rank `rank` of `group` (socket ids, rank order) over `engine`'s links, its
    compute stream `clock` (the socket's)."""

    def __init__(
        self,
        engine: CollectiveEngine,
        clock: EmulatedClock,
        job_id: str,
        group: list[str],
        rank: int,
        wall_timeout_s: float,
    ) -> None:
        """`wall_timeout_s`: how long a collective waits for a peer's message, wall
        seconds (a dead peer)."""
        self.engine = engine
        self.clock = clock
        self.job_id = job_id
        self.group = group
        self._members = [SocketId.parse(g) for g in group]
        self._rank = rank
        self.wall_timeout_s = wall_timeout_s
        self._calls = 0  # collectives so far: their tags, the same on every rank
        self.timeout_s = float("inf")  # the process group's lateness bound, emulated s
        self.step = 0
        self.ready: deque[int] = deque()  # ready times (ns) of pending gradient buckets
        self.comm_free_ns = 0  # when the communication stream is free
        self.all_reduce_ns = 0  # gradient all-reduce time, all of it
        self.exposed_ns = 0  # ... the part the compute stream waited for
        self.compute_s = 0.0  # forward and backward, as the timing model prices them
        self.steps_began_ns: int | None = None  # clock at the first step's forward
        self.step_began_ns = 0  # clock at this step's forward
        self.gradients: GradientWindow | None = None  # this step's all-reduce so far

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def world_size(self) -> int:
        return len(self.group)

    def set_timeout(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s

    def settle(self) -> None:
        """The compute stream waits for the communication stream (torch: the optimizer
        step waits for the last bucket)."""
        now = self.clock.now_ns
        if self.comm_free_ns > now:
            self.exposed_ns += self.comm_free_ns - now
            self.clock.advance_to(self.comm_free_ns)

    def begin_step(self) -> None:
        """A step's forward starts: after the communication stream, and the first one
        marks where steps begin (after DDP's initial broadcast)."""
        self.settle()
        self.step_began_ns = self.clock.now_ns
        if self.steps_began_ns is None:
            self.steps_began_ns = self.step_began_ns

    def _ring(
        self,
        op: str,
        buffer: Array | None = None,
        *,
        what: str = "",
        nbytes: int = 0,
        itemsize: int = 4,
        src: int | None = None,
        clock: EmulatedClock | None = None,
        engine: CollectiveEngine | None = None,
    ) -> Exchanged:
        """A ring `op` over the group (`src`: the rank a broadcast comes from), its tag
        `what` (default: `op`) and a count, the same on every rank; on `clock` (default:
        the compute stream) over `engine`'s link busy times (default: the socket's).
        Timing mode: no buffer, `nbytes` of `itemsize`."""
        engine = engine or self.engine
        self._calls += 1
        tag = f"{self.job_id}/ddp/{self._calls}/{what or op}"
        root = None if src is None else self.group[src]
        plan = engine.plan(op, self._members, buffer, nbytes=nbytes, itemsize=itemsize, root=root)
        return engine.run(tag, plan, clock or self.clock, self.wall_timeout_s, buffer)

    # ------------------------------------------------------------------ Backend

    def all_reduce(self, array: Array, op: str = "sum") -> None:
        if self.world_size > 1:
            self._all_reduce(_flat(array), array.nbytes, array.itemsize)
        if op == "mean":
            array /= np.asarray(self.world_size, dtype=array.dtype)

    def all_reduce_bytes(self, nbytes: int, itemsize: int) -> None:
        """Timing mode: a bucket of `nbytes` travels as a descriptor."""
        if self.world_size > 1:
            self._all_reduce(None, nbytes, itemsize)

    def _all_reduce(self, buffer: Array | None, nbytes: int, itemsize: int) -> None:
        if not self.ready:  # not a gradient bucket: on the compute stream
            self.settle()
            self._ring("all_reduce", buffer, nbytes=nbytes, itemsize=itemsize)
            return
        start = max(self.comm_free_ns, self.ready.popleft())
        stream = EmulatedClock(start)
        done = self._ring("all_reduce", buffer, nbytes=nbytes, itemsize=itemsize, clock=stream)
        self.all_reduce_ns += stream.now_ns - start
        self.comm_free_ns = stream.now_ns
        if self.gradients is None:
            self.gradients = GradientWindow(start, stream.now_ns)
        self.gradients.add(stream.now_ns, nbytes, done.traffic)

    def broadcast(self, array: Array, src: int) -> None:
        self.settle()
        if self.world_size > 1:
            self._ring("broadcast", _flat(array), src=src)

    def broadcast_bytes(self, nbytes: int, itemsize: int, src: int = 0) -> None:
        self.settle()
        if self.world_size > 1:
            self._ring("broadcast", nbytes=nbytes, itemsize=itemsize, src=src)

    def all_gather(self, array: Array) -> list[Array]:
        self.settle()
        if self.world_size == 1:
            return [array.copy()]
        out = self._ring("all_gather", np.ascontiguousarray(array)).buffer
        assert out is not None
        return [part.reshape(array.shape) for part in np.split(out, self.world_size)]

    def barrier(self) -> None:
        self.settle()
        if self.world_size > 1:
            self._ring("barrier")

    # ------------------------------------------------------------------ lateness

    def check_lateness(self) -> None:
        """Every rank tells the others when it finished backward (no emulated cost);
        a rank later than the timeout fails the step on every rank."""
        if self.world_size == 1:
            return
        now = np.array([self.clock.now_ns], dtype=np.int64)
        scratch = EmulatedClock(self.clock.now_ns)
        engine = self.engine.scratch()
        out = self._ring("all_gather", now, what="lateness", clock=scratch, engine=engine).buffer
        assert out is not None
        late = int(np.argmax(out))
        late_s = float(out[late] - out.min()) * 1e-9
        if late_s > self.timeout_s:
            raise Straggler(late, self.group[late], late_s, self.timeout_s, self.step)


def _flat(array: Array) -> Array:
    """A view of `array` as one dimension; collectives work in place on it."""
    if not array.flags.c_contiguous:
        raise InvalidRequest("a collective needs a contiguous array (np.ascontiguousarray)")
    return array.reshape(-1)
