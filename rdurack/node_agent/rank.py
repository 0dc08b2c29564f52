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

Memory: the built-in loop accounts what it holds, stage by stage, on the socket's tiers
(training/memory.py; a progressive stage change moves weights between HBM and DDR,
which takes the copy's emulated time); a preset or a client's loop holds its planned
memory for the whole job. Either way under the job's HBM cap.

Spans (node_agent/train_trace.py): each stage, each block the growing stage freezes,
each traced step with its gradient all-reduce, and each checkpoint written or loaded,
on the emulated timeline. A step ends when its gradients are all-reduced: the compute
stream waits for them there rather than at the next forward, which changes no emulated
time, as whatever runs next (a forward, a collective, a stage change) waits first.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Generator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
from opentelemetry.util.types import AttributeValue
from ray import cloudpickle

from rdurack.errors import InvalidRequest, RdurackError
from rdurack.node_agent.hardware_trace import Traffic, link_attributes
from rdurack.node_agent.train_trace import GradientWindow, RankSpans, TrainSpan, traced
from rdurack.rack.clock import EmulatedClock, seconds_to_ns
from rdurack.rack.memory import TieredMemory
from rdurack.rack.models import ModelSpec
from rdurack.rack.presets import platform as preset
from rdurack.rack.spec import PlatformSpec, Tier
from rdurack.telemetry import names
from rdurack.workloads.training.arrays import Array, Params
from rdurack.workloads.training.distributed import Distributed
from rdurack.workloads.training.job import (
    RankReport,
    StepCost,
    TrainingWorkload,
    model_cost,
    step_cost,
)
from rdurack.workloads.training.loop import (
    CheckpointEvent,
    RankContext,
    RankResult,
    StageEvent,
    StepInfo,
    train_steps,
)
from rdurack.workloads.training.memory import MemoryAccount
from rdurack.workloads.training.models import Model
from rdurack.workloads.training.overlap import split_by_bytes


class RankHost(Protocol):
    """What a rank needs of the socket it runs on (node_agent/socket.py is one)."""

    name: str
    platform: PlatformSpec
    memory: TieredMemory
    clock: EmulatedClock
    slowdown: float

    def exchange(
        self,
        tag: str,
        op: str,
        group: list[str],
        buffer: np.ndarray | None = None,
        *,
        nbytes: int = 0,
        itemsize: int = 4,
        root: str | None = None,
        clock: EmulatedClock | None = None,
        scratch_links: bool = False,
        traffic: list[Traffic] | None = None,
    ) -> np.ndarray | None: ...


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

    def __init__(self, socket: RankHost, job_id: str, group: list[str], rank: int) -> None:
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
        self.step_began_ns = self.socket.clock.now_ns
        if self.steps_began_ns is None:
            self.steps_began_ns = self.step_began_ns

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
        traffic: list[Traffic] = []
        self.socket.exchange(
            tag, "all_reduce", self.group, buffer, nbytes=nbytes, itemsize=itemsize,
            clock=stream, traffic=traffic,
        )  # fmt: skip
        self.all_reduce_ns += stream.now_ns - start
        self.comm_free_ns = stream.now_ns
        w = self.gradients
        if w is None:
            w = self.gradients = GradientWindow(start, stream.now_ns)
        w.end_ns = stream.now_ns
        w.nbytes += nbytes
        w.buckets += 1
        for t in traffic:
            w.bytes_sent += t.bytes_sent
            w.bytes_received += t.bytes_received
            w.links.update(t.links())

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

    def __init__(self, model: Model, backend: LinkBackend, cost: StepCost, socket: RankHost):
        self.model = model
        self.backend = backend
        self.cost = cost
        self.socket = socket
        # The model's own dicts: optimizers and DDP update them in place.
        self.params: Params = model.params
        self.grads: Params = model.grads
        self.dtype = model.dtype

    @property
    def frozen(self) -> Params:
        return self.model.frozen

    def forward(self, x: Array, y: Array) -> float:
        forward(self.backend, self.cost, self.socket)
        return self.model.forward(x, y)

    def backward(self) -> None:
        self.model.backward()
        backward(self.backend, self.cost, self.socket)

    def logits(self, x: Array) -> Array:
        return self.model.logits(x)

    def saved_bytes(self) -> int:
        return self.model.saved_bytes()


def forward(backend: LinkBackend, cost: StepCost, socket: RankHost) -> None:
    """A step's forward on the socket's clock, after the communication stream."""
    backend.begin_step()
    socket.clock.advance(cost.forward_s * socket.slowdown)
    backend.compute_s += cost.forward_s


def backward(backend: LinkBackend, cost: StepCost, socket: RankHost) -> None:
    """Backward's compute on the socket's clock; each bucket ready in proportion to its
    bytes (split_by_bytes); then the lateness check."""
    backend.compute_s += cost.backward_s
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
        socket: RankHost,
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
        self.account = MemoryAccount(self.memory, f"{job_id}/train/", w.hbm_cap_bytes)
        # The built-in loop accounts its own arrays; the others hold the plan.
        self._accounted = w.functional and not loop
        if not self._accounted:
            self.account.place(
                {
                    part: (Tier.HBM, nbytes)
                    for part, nbytes in self.cost.memory.to_dict().items()
                    if part != "total" and nbytes
                }
            )
            self.account.begin_stage()
            self.account.mark()
        self.spans: list[TrainSpan] = []  # stages and freezes not yet traced
        self._inside: list[TrainSpan] = []  # the segment's steps and checkpoints
        self._untraced = 0  # the segment's steps without a span (train_trace.traced)
        self._exposed_mark = 0  # backend.exposed_ns when the last step ended
        self._stage_ns: list[tuple[int, int]] = []  # each ended stage's emulated start, end
        self._stage_began = 0
        self._freezing: tuple[int, dict[str, AttributeValue]] | None = None  # start, attrs

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
                    self._end_step(self._step)
        b = self.backend
        if not self._accounted:
            self.account.end_stage()
        outcome = self._result or {}
        for stage, (began, ended) in zip(outcome.get("stages", []), self._stage_ns, strict=False):
            stage["emulated_s"] = (ended - began) * 1e-9
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
            compute_ns=seconds_to_ns(b.compute_s),
            all_reduce_ns=b.all_reduce_ns,
            exposed_ns=b.exposed_ns,
            memory=self.cost.memory.to_dict(),
            hbm_peak_bytes=self.account.peaks[Tier.HBM.value],
            result=outcome,
            loop_result=self._loop_result,
            peak_bytes=dict(self.account.peaks),
            stage=self._step.stage,
        )

    def _make_steps(self) -> Generator[StepInfo, None, RankResult | None]:
        if self.w.functional:
            ctx = RankContext(
                self.backend,
                self.rank,
                self.socket.name,
                self.checkpoint_dir,
                wrap=self._timed,
                memory=self.account,
                on_stage=self._on_stage,
                on_checkpoint=self._on_checkpoint,
            )
            return self._functional(ctx)
        return self._timing()

    def _timed(self, model: Model) -> Model:
        """`model` (a stage's) with passes that take the timing model's time."""
        cost = model_cost(model, self.w, self.platform, self.cost.memory)
        return TimedModel(model, self.backend, cost, self.socket)

    def _on_stage(self, event: StageEvent) -> None:
        """A stage began (its weights' moves between tiers take their copy time) or
        ended: the spans of stages and of the blocks the growing stage freezes."""
        self.backend.settle()
        clock = self.socket.clock
        if event.report is None:
            self.account.mark()  # the stage's first step counts from its own holdings
            clock.advance(event.copy_s)
            if self._freezing is not None:  # the frozen block's state gone, the next in
                start, frozen = self._freezing
                self.spans.append(TrainSpan(names.SPAN_TRAIN_FREEZE, start, clock.now_ns, frozen))
                self._freezing = None
            self._stage_began = clock.now_ns
            return
        r, end = event.report, clock.now_ns
        self._stage_ns.append((self._stage_began, end))
        attributes: dict[str, AttributeValue] = {
            names.ATTR_RANK: self.rank,
            names.ATTR_TRAIN_STAGE: event.stage.name,
            names.ATTR_TRAIN_PHASE: r.phase,
            names.ATTR_STEPS: r.steps,
            names.ATTR_STEP: r.start_step + r.steps,
            names.ATTR_TRAIN_CONVERGED: r.converged,
            **{names.ATTR_PEAK_BYTES.format(tier=t): n for t, n in r.peak_bytes.items()},
        }
        if r.block is not None:
            attributes[names.ATTR_TRAIN_BLOCK] = r.block
        if r.movement is not None:
            attributes[names.ATTR_TRAIN_MOVEMENT] = r.movement
        if r.test_accuracy is not None:
            attributes[names.ATTR_TRAIN_ACCURACY] = r.test_accuracy
        self.spans.append(TrainSpan(names.SPAN_TRAIN_STAGE, self._stage_began, end, attributes))
        if r.phase == "grow" and r.block is not None:
            freeze: dict[str, AttributeValue] = {
                names.ATTR_RANK: self.rank,
                names.ATTR_TRAIN_BLOCK: r.block,
                names.ATTR_STEP: r.start_step + r.steps,
                names.ATTR_TRAIN_CONVERGED: r.converged,
            }
            if r.movement is not None:
                freeze[names.ATTR_TRAIN_MOVEMENT] = r.movement
            if r.block == self.w.blocks - 1:  # the last: nothing follows it in
                self.spans.append(TrainSpan(names.SPAN_TRAIN_FREEZE, end, end, freeze))
            else:
                self._freezing = (end, freeze)

    def _end_step(self, info: StepInfo) -> None:
        """A step ended: its span, with its gradient all-reduce, if it is traced."""
        b = self.backend
        b.settle()  # the step lasts until its gradients are all-reduced
        end = self.socket.clock.now_ns
        window, b.gradients = b.gradients, None
        exposed, self._exposed_mark = b.exposed_ns - self._exposed_mark, b.exposed_ns
        peaks = self.account.window_peaks()
        self.account.mark()
        if not traced(info.step, info.total):
            self._untraced += 1
            return
        step: dict[str, AttributeValue] = {names.ATTR_RANK: self.rank, names.ATTR_STEP: info.step}
        attributes: dict[str, AttributeValue] = {
            **step,
            names.ATTR_TRAIN_STAGE: info.stage,
            **{names.ATTR_PEAK_BYTES.format(tier=t): n for t, n in peaks.items()},
        }
        if math.isfinite(info.loss):  # timing mode computes no loss
            attributes[names.ATTR_LOSS] = info.loss
        children: tuple[TrainSpan, ...] = ()
        if window is not None:
            reduce: dict[str, AttributeValue] = {
                **step,
                names.ATTR_COLLECTIVE_ALGORITHM: "ring",
                names.ATTR_BYTES: window.nbytes,
                names.ATTR_BUCKETS: window.buckets,
                names.ATTR_EXPOSED_NS: exposed,
                names.ATTR_BYTES_SENT: window.bytes_sent,
                names.ATTR_BYTES_RECEIVED: window.bytes_received,
                **link_attributes(window.links),
            }
            children = (
                TrainSpan(names.SPAN_TRAIN_ALLREDUCE, window.start_ns, window.end_ns, reduce),
            )
        self._inside.append(
            TrainSpan(names.SPAN_TRAIN_STEP, b.step_began_ns, end, attributes, children)
        )

    def _on_checkpoint(self, event: CheckpointEvent) -> None:
        """A checkpoint written or loaded: a span of no emulated time (the emulator
        prices no storage), after the step's all-reduce it holds the result of."""
        self.backend.settle()
        now = self.socket.clock.now_ns
        attributes: dict[str, AttributeValue] = {
            names.ATTR_RANK: self.rank,
            names.ATTR_STEP: event.step,
            names.ATTR_CHECKPOINT_ACTION: event.action,
            names.ATTR_CHECKPOINT_PATH: event.path,
            names.ATTR_BYTES: event.nbytes,
            names.ATTR_TIER: Tier.HBM.value,  # where the state is read from / loaded into
        }
        self._inside.append(TrainSpan(names.SPAN_CHECKPOINT, now, now, attributes))

    def take_spans(self) -> RankSpans:
        """The spans since the last call."""
        out = RankSpans(self.spans, self._inside, self._untraced)
        self.spans, self._inside, self._untraced = [], [], 0
        return out

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
            forward(b, cost, socket)
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
        self.account.close()


def _flat(array: Array) -> Array:
    """A view of `array` as one dimension; collectives work in place on it."""
    if not array.flags.c_contiguous:
        raise InvalidRequest("a collective needs a contiguous array (np.ascontiguousarray)")
    return array.reshape(-1)
