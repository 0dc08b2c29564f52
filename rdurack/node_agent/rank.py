"""One DDP rank inside a socket actor: the process group over the socket's links, and
the training loop on the socket's emulated clock.

`LinkBackend` is training.backend.Backend over the rack's links. Gradient buckets are
all-reduced on a communication stream of their own: bucket i starts when its gradients
are ready during backward (or when the previous bucket is done) and the stream is a
clock of its own, so all-reduce time hides behind backward as in torch DDP
(overlap.py); the compute stream waits for it before the next step. Other collectives
(the initial broadcast, replica checks, barriers) run on the socket's clock. Clocks of
different ranks meet at every transfer (the link rule), so a straggler delays the step
of every rank.

Lateness: when a rank's backward ends, the ranks exchange the emulated times they got
there (a bookkeeping exchange: no emulated time, no link traffic). A rank later than the
process group's timeout (emulated seconds) fails the job on every rank, naming it. A
rank that never arrives is caught by the links' wall-clock deadline.

`RankRunner` runs a job on one rank in segments of steps (progress between them): the
built-in loop (training/loop.py) for numpy models, a timing-only loop of the same shape
for model presets, or a user's own function (`loop`) once.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Generator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from ray import cloudpickle

from rdurack.rack.clock import EmulatedClock, seconds_to_ns
from rdurack.rack.errors import InvalidRequest, RdurackError
from rdurack.rack.memory import TieredMemory
from rdurack.rack.models import ModelSpec
from rdurack.rack.presets import platform as preset
from rdurack.rack.spec import PlatformSpec, Tier
from rdurack.workloads.training.arrays import Array, Params
from rdurack.workloads.training.distributed import Distributed
from rdurack.workloads.training.job import RankReport, StepCost, TrainingWorkload, step_cost
from rdurack.workloads.training.loop import RankContext, RankResult, StepInfo, train_steps
from rdurack.workloads.training.models import Model
from rdurack.workloads.training.overlap import split_by_bytes

if TYPE_CHECKING:
    from rdurack.node_agent.socket import Socket


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
    """Rank `rank` of `group` (socket ids, rank order) over `socket`'s links."""

    def __init__(self, socket: Socket, job_id: str, group: list[str], rank: int) -> None:
        self.socket = socket
        self.job_id = job_id
        self.group = group
        self._rank = rank
        self._calls = 0  # collectives so far: their tags, the same on every rank
        self.timeout_s = float("inf")
        self.step = 0
        self.ready: deque[int] = deque()  # ready times (ns) of pending gradient buckets
        self.comm_free_ns = 0  # when the communication stream is free
        self.all_reduce_ns = 0  # gradient all-reduce time, all of it
        self.exposed_ns = 0  # ... the part the compute stream waited for
        self.steps_began_ns: int | None = None  # clock at the first step's forward

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def world_size(self) -> int:
        return len(self.group)

    def set_timeout(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s

    def _tag(self, what: str) -> str:
        self._calls += 1
        return f"{self.job_id}/ddp/{self._calls}/{what}"

    def settle(self) -> None:
        """The compute stream waits for the communication stream (torch: the optimizer
        step waits for the last bucket)."""
        now = self.socket.clock.now_ns
        if self.comm_free_ns > now:
            self.exposed_ns += self.comm_free_ns - now
            self.socket.clock.advance_to(self.comm_free_ns)

    def begin_step(self) -> None:
        """A step's forward starts: after the communication stream, and the first one
        marks where steps begin (after DDP's initial broadcast)."""
        self.settle()
        if self.steps_began_ns is None:
            self.steps_began_ns = self.socket.clock.now_ns

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
        tag = self._tag("all_reduce")
        if not self.ready:  # not a gradient bucket: on the socket's own clock
            self.settle()
            self.socket.exchange(tag, "all_reduce", self.group, buffer, nbytes=nbytes,
                                 itemsize=itemsize)  # fmt: skip
            return
        start = max(self.comm_free_ns, self.ready.popleft())
        stream = EmulatedClock(start)
        self.socket.exchange(
            tag, "all_reduce", self.group, buffer, nbytes=nbytes, itemsize=itemsize, clock=stream
        )
        self.all_reduce_ns += stream.now_ns - start
        self.comm_free_ns = stream.now_ns

    def broadcast(self, array: Array, src: int) -> None:
        self.settle()
        if self.world_size > 1:
            self.socket.exchange(
                self._tag("broadcast"), "broadcast", self.group, _flat(array), root=self.group[src]
            )

    def broadcast_bytes(self, nbytes: int, itemsize: int, src: int = 0) -> None:
        self.settle()
        if self.world_size > 1:
            self.socket.exchange(
                self._tag("broadcast"), "broadcast", self.group, None, nbytes=nbytes,
                itemsize=itemsize, root=self.group[src],
            )  # fmt: skip

    def all_gather(self, array: Array) -> list[Array]:
        self.settle()
        if self.world_size == 1:
            return [array.copy()]
        out = self.socket.exchange(
            self._tag("all_gather"), "all_gather", self.group, np.ascontiguousarray(array)
        )
        assert out is not None
        return [part.reshape(array.shape) for part in np.split(out, self.world_size)]

    def barrier(self) -> None:
        self.settle()
        if self.world_size > 1:
            self.socket.exchange(self._tag("barrier"), "barrier", self.group)

    # ------------------------------------------------------------------ lateness

    def check_lateness(self) -> None:
        """Every rank tells the others when it finished backward (no emulated cost);
        a rank later than the timeout fails the step on every rank."""
        if self.world_size == 1:
            return
        now = np.array([self.socket.clock.now_ns], dtype=np.int64)
        scratch = EmulatedClock(self.socket.clock.now_ns)
        out = self.socket.exchange(
            self._tag("lateness"), "all_gather", self.group, now, clock=scratch,
            scratch_links=True,
        )  # fmt: skip
        assert out is not None
        late = int(np.argmax(out))
        late_s = float(out[late] - out.min()) * 1e-9
        if late_s > self.timeout_s:
            raise Straggler(late, self.group[late], late_s, self.timeout_s, self.step)


class TimedModel:
    """A numpy model whose passes advance the socket's emulated clock by the timing
    model, and whose backward marks when each gradient bucket is ready."""

    def __init__(self, model: Model, backend: LinkBackend, cost: StepCost, socket: Socket):
        self.model = model
        self.backend = backend
        self.cost = cost
        self.socket = socket
        # The model's own dicts: optimizers and DDP update them in place.
        self.params: Params = model.params
        self.grads: Params = model.grads
        self.dtype = model.dtype

    def forward(self, x: Array, y: Array) -> float:
        self.backend.begin_step()
        self.socket.clock.advance(self.cost.forward_s * self.socket.slowdown)
        return self.model.forward(x, y)

    def backward(self) -> None:
        self.model.backward()
        backward(self.backend, self.cost, self.socket)

    def logits(self, x: Array) -> Array:
        return self.model.logits(x)


def backward(backend: LinkBackend, cost: StepCost, socket: Socket) -> None:
    """Backward's compute on the socket's clock; each bucket ready in proportion to its
    bytes (split_by_bytes); then the lateness check."""
    start = socket.clock.now_ns
    total = cost.backward_s * socket.slowdown
    done = 0.0
    backend.ready.clear()
    for share in split_by_bytes(total, cost.bucket_bytes):
        done += share
        backend.ready.append(start + seconds_to_ns(done))
    socket.clock.advance(total)
    backend.step += 1
    backend.check_lateness()


@dataclass
class TrainContext:
    """What a user's training function gets on its rank (Ray Train's
    `train_loop_per_worker` receives its config the same way): the torch.distributed
    API bound to this rank's links, before init_process_group."""

    dist: Distributed
    rank: int
    world_size: int
    device: str
    checkpoint_dir: Path | None
    config: dict[str, Any]


class RankRunner:
    """One rank of one training job on `socket`."""

    def __init__(
        self,
        socket: Socket,
        job_id: str,
        w: TrainingWorkload,
        platform_name: str,
        group: list[str],
        models: dict[str, ModelSpec],
        checkpoint_dir: str = "",
        loop: bytes = b"",
    ) -> None:
        if socket.name not in group:
            raise InvalidRequest(f"{socket.name} is not a rank of {group}")
        self.socket = socket
        self.job_id = job_id
        self.w = w
        self.group = group
        self.rank = group.index(socket.name)
        self.platform: PlatformSpec = (
            socket.platform
            if platform_name in ("", socket.platform.name)
            else preset(platform_name)
        )
        # A job on another platform (a DGX) takes that platform's socket memory.
        self.memory = (
            socket.memory
            if self.platform is socket.platform
            else TieredMemory(socket.name, self.platform.socket)
        )
        self.cost = step_cost(w, self.platform, models)
        self.backend = LinkBackend(socket, job_id, group, self.rank)
        self.backend.set_timeout(w.timeout_s)
        self.checkpoint_dir = Path(checkpoint_dir) if checkpoint_dir else None
        self._loop = loop
        self._start_ns = socket.clock.now_ns
        self._compute_ns = 0
        self._steps: Generator[StepInfo, None, RankResult | None] | None = None
        self._step = StepInfo(0, 0, 0.0)
        self._result: dict[str, Any] | None = None
        self._loop_result = b""
        for part, nbytes in self.cost.memory.to_dict().items():
            if part != "total" and nbytes:
                self.memory.allocate(f"{job_id}/train/{part}", Tier.HBM, nbytes, what=part)

    def advance(self, steps: int, start_ns: int | None = None) -> RankReport:
        """Run up to `steps` more steps (0: to the end)."""
        if start_ns is not None:
            self.socket.clock.advance_to(start_ns)
            if self._steps is None:
                self._start_ns = self.socket.clock.now_ns
        losses: list[float] = []
        if self._result is None:
            if self._loop:
                self._run_user_loop()
            else:
                if self._steps is None:
                    self._steps = self._make_steps()
                done = 0
                while steps == 0 or done < steps:
                    try:
                        self._step = next(self._steps)
                    except StopIteration as end:
                        result = end.value
                        self._result = result.to_dict() if result is not None else {}
                        break
                    losses.append(self._step.loss)
                    done += 1
        b = self.backend
        return RankReport(
            socket_id=self.socket.name,
            rank=self.rank,
            step=self._step.step,
            total=self._step.total,
            finished=self._result is not None,
            losses=losses,
            start_ns=self._start_ns,
            end_ns=self.socket.clock.now_ns,
            steps_began_ns=b.steps_began_ns or self._start_ns,
            compute_ns=seconds_to_ns(self.cost.compute_s) * b.step,
            all_reduce_ns=b.all_reduce_ns,
            exposed_ns=b.exposed_ns,
            memory=self.cost.memory.to_dict(),
            hbm_peak_bytes=self.memory.peak_bytes(Tier.HBM),
            result=self._result or {},
            loop_result=self._loop_result,
        )

    def _make_steps(self) -> Generator[StepInfo, None, RankResult | None]:
        if self.w.functional:
            ctx = RankContext(
                self.backend,
                self.rank,
                self.socket.name,
                self.checkpoint_dir,
                wrap=lambda m: TimedModel(m, self.backend, self.cost, self.socket),
            )
            return self._functional(ctx)
        return self._timing()

    def _functional(self, ctx: RankContext) -> Generator[StepInfo, None, RankResult | None]:
        result = yield from train_steps(ctx, self.w.train_spec(resume=True))
        self.backend.settle()
        return result

    def _timing(self) -> Generator[StepInfo, None, RankResult | None]:
        """A preset model: DDP's traffic and compute as descriptors, no numbers."""
        b, cost, socket = self.backend, self.cost, self.socket
        itemsize = 2  # BF16 gradients and weights
        b.broadcast_bytes(cost.memory.gradients, itemsize)  # DDP: rank 0's parameters
        total = self.w.steps or 10
        for step in range(total):
            b.begin_step()
            socket.clock.advance(cost.forward_s * socket.slowdown)
            backward(b, cost, socket)
            for nbytes in cost.bucket_bytes:
                b.all_reduce_bytes(nbytes, itemsize)
            yield StepInfo(step + 1, total, float("nan"))
        b.settle()
        return None

    def _run_user_loop(self) -> None:
        # The job's own function, pickled by its client (docs: who may submit one).
        fn: Callable[[TrainContext], Any] = cloudpickle.loads(self._loop)
        ctx = TrainContext(
            Distributed(self.backend),
            self.rank,
            len(self.group),
            self.socket.name,
            self.checkpoint_dir,
            {},
        )
        value = fn(ctx)
        self.backend.settle()
        self._loop_result = bytes(cloudpickle.dumps(value))  # type: ignore[no-untyped-call]
        self._result = {"rank": self.rank, "device": self.socket.name}

    def close(self) -> None:
        for part in ("weights", "gradients", "optimizer", "activations"):
            name = f"{self.job_id}/train/{part}"
            if name in self.memory:
                self.memory.free(name)


def _flat(array: Array) -> Array:
    """A view of `array` as one dimension; collectives work in place on it."""
    if not array.flags.c_contiguous:
        raise InvalidRequest("a collective needs a contiguous array (np.ascontiguousarray)")
    return array.reshape(-1)
