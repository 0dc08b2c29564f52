"""One emulated RDU socket: tiered memory, an emulated clock, kernels and links.

A plain class (Ray wraps it in node_agent/actors.py, the one place that knows Ray), so
it is tested without Ray. A socket serves one job at a time. Kernels advance its clock
by what the rack/ timing model says; collectives execute the schedules of
rack/collectives.py over the socket's gRPC links, sending real bytes (functional mode)
or sized descriptors (timing mode) and pricing every transfer with the link rule, so the
emulated time equals the predictor's.

Every kernel, program op, collective (with its sends) and training segment (with its
steps and checkpoints) is a span on the emulated timeline, child of the caller's
carrier (node_agent/hardware_trace.py, docs/tracing.md).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
from opentelemetry import trace

from rdurack.errors import InvalidRequest, LinkFailure, SocketBusy, UnknownName
from rdurack.node_agent.hardware_trace import (
    HardwareTrace,
    Sent,
    Traffic,
    kernel_attributes,
    op_span,
)
from rdurack.node_agent.links.endpoint import LinkEndpoint
from rdurack.node_agent.links.mailbox import Message
from rdurack.node_agent.links.sending import OutgoingTransfer, Sends
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
from rdurack.rack.kernels import FusionPlan, Phase
from rdurack.rack.memory import TieredMemory, TierUsage
from rdurack.rack.models import ModelSpec, builtin_models
from rdurack.rack.spec import PlatformSpec, Tier
from rdurack.rack.topology import SocketId, Topology, link_name
from rdurack.security.tls import TlsConfig
from rdurack.telemetry import names
from rdurack.telemetry.propagation import extract
from rdurack.workloads.bundle import BundleShare, ProgramRunner
from rdurack.workloads.predictor import Predictor
from rdurack.workloads.program import Generate, Op, OpRun, ProgramRun
from rdurack.workloads.tiny_lm import TinyLM, TinyLMConfig, TinyLMShard, generate

if TYPE_CHECKING:
    # Imported where a job trains (Socket.train): most sockets never do, and the
    # training stack is about a third of what a socket actor imports at its start
    # (~50 of ~145 ms on this machine), paid by 16 actors in every bring-up.
    from rdurack.node_agent.rank import RankRunner
    from rdurack.workloads.training.job import RankReport, TrainingWorkload

COLLECTIVE_OPS = ("all_reduce", "broadcast", "all_gather", "barrier", "send")


@dataclass(frozen=True)
class Run:
    """What one kernel or collective call did on this socket, in emulated ns."""

    socket_id: str
    start_ns: int
    end_ns: int
    kernel_calls: int = 0
    hbm_bytes: int = 0
    flops: int = 0  # FLOPs of its kernels on this socket
    bytes_sent: int = 0
    bytes_received: int = 0

    @property
    def duration_ns(self) -> int:
        return self.end_ns - self.start_ns


@dataclass(frozen=True)
class SocketState:
    socket_id: str
    job_id: str | None
    clock_ns: int
    link_address: str
    slowdown: float
    tiers: dict[str, TierUsage] = field(default_factory=dict)


class Socket:
    """One socket. Every public method is one actor call."""

    def __init__(
        self,
        socket_id: str,
        platform: PlatformSpec,
        *,
        time_scale: float = 0.0,
        host: str = "127.0.0.1",
        port: int = 0,
        timeout_s: float = 30.0,
        tls: TlsConfig | None = None,
        clock_ns: int = 0,
        tracer_provider: trace.TracerProvider | None = None,
    ) -> None:
        """`tls`: its links are mutual TLS among rack members (plaintext without).
        `clock_ns`: where the emulated clock starts (a socket restarted after a fault
        continues from its predecessor's clock, so time on a socket never runs back).
        `tracer_provider`: where hardware spans go (default: the process's global one,
        which telemetry.setup.configure installs in a socket actor)."""
        if time_scale < 0:
            raise InvalidRequest(f"time_scale must be >= 0, got {time_scale}")
        self.name = socket_id
        self.id = SocketId.parse(socket_id)
        self.platform = platform
        self.topology = Topology(platform)
        self.topology.check(self.id)
        self.memory = TieredMemory(socket_id, platform.socket)
        self.clock = EmulatedClock(clock_ns)
        self.timeout_s = timeout_s
        self.time_scale = time_scale  # wall seconds per emulated second; 0: no pacing
        self.slowdown = 1.0  # fault hook: kernels take this many times longer
        self._delay_ns: dict[str, int] = {}  # fault hook: extra latency per peer, ns
        self.job: str | None = None
        self.tensors: dict[str, np.ndarray] = {}
        self._predictor = Predictor(platform)
        self._links = Links(self.topology)  # this socket's own sends only
        self._endpoint = LinkEndpoint(
            socket_id, host, port, clock_ns=lambda: self.clock.now_ns, tls=tls
        )
        self._pace_anchor = (time.monotonic(), 0)
        self._trace = HardwareTrace(socket_id, tracer_provider)
        self._models = builtin_models()
        # The running job's program state: its bundle share, and in functional mode the
        # shards of the tiny experts it generated with.
        self._program: ProgramRunner | None = None
        self._shards: dict[str, TinyLMShard] = {}
        self._collectives = 0  # functional generate: all-reduces so far (their tags)
        self._trainer: RankRunner | None = None  # the running job's DDP rank

    # ------------------------------------------------------------------ identity, links

    def address(self) -> str:
        return self._endpoint.address

    def connect(self, peers: dict[str, str]) -> None:
        """Learn the link addresses of peer sockets (socket id -> host:port)."""
        for peer in peers:
            self.topology.check(SocketId.parse(peer))
        self._endpoint.connect({p: a for p, a in peers.items() if p != self.name})

    def state(self) -> SocketState:
        # A job that loaded another platform's spec (a DGX) shows that memory.
        memory = self.memory
        if self._program is not None:
            memory = self._program.memory
        elif self._trainer is not None:
            memory = self._trainer.memory
        snap = memory.snapshot()
        return SocketState(
            socket_id=self.name,
            job_id=self.job,
            clock_ns=self.clock.now_ns,
            link_address=self.address(),
            slowdown=self.slowdown,
            tiers={t.value: u for t, u in snap.tiers.items()},
        )

    def ping(self) -> int:
        return self.clock.now_ns

    def heartbeat(self) -> SocketState:
        """Liveness and the cheap part of `state` (no tier usage). Ray runs it on the
        actor's control thread (actors.py), so a socket busy with a long call answers;
        it only reads attributes, which the busy thread may change between two reads."""
        return SocketState(
            socket_id=self.name,
            job_id=self.job,
            clock_ns=self.clock.now_ns,
            link_address=self._endpoint.address,
            slowdown=self.slowdown,
        )

    def abort(self, job_id: str, reason: str) -> bool:
        """End the waits of `job_id`'s call in flight at once (control thread): a peer
        died, so its messages will never come. False if the socket is not the job's."""
        if self.job != job_id:
            return False
        self._endpoint.mailbox.abort(reason)
        return True

    # ------------------------------------------------------------------ jobs

    def reserve(self, job_id: str) -> None:
        """Hold the socket for `job_id`; another job is refused until release."""
        if self.job is not None and self.job != job_id:
            raise SocketBusy(self.name, self.job, job_id)
        if self.job is None:
            self.job = job_id
            self._endpoint.mailbox.reset()  # an abort of the previous job is over
            self._pace_anchor = (time.monotonic(), self.clock.now_ns)
            self._trace.restart()

    def release(self, job_id: str) -> bool:
        """Free the socket and everything the job allocated on it; False if not held."""
        if self.job != job_id:
            return False
        prefix = f"{job_id}/"
        for alloc in self.memory.allocations():
            if alloc.name.startswith(prefix):
                self.memory.free(alloc.name)
        self.tensors = {k: v for k, v in self.tensors.items() if not k.startswith(prefix)}
        self.job = None
        self._endpoint.mailbox.reset()
        self._program = None
        self._shards = {}
        self._collectives = 0
        if self._trainer is not None:
            self._trainer.close()
            self._trainer = None
        return True

    def _hold(self, job_id: str) -> None:
        if self.job is None:
            raise InvalidRequest(
                f"{self.name} is not reserved for job {job_id!r}; reserve it first"
            )
        if self.job != job_id:
            raise SocketBusy(self.name, self.job, job_id)

    # ------------------------------------------------------------------ memory

    def allocate(self, job_id: str, name: str, tier: str, nbytes: int) -> TierUsage:
        self._hold(job_id)
        t = _tier(tier)
        self.memory.allocate(f"{job_id}/{name}", t, nbytes, what=name)
        return self.memory.snapshot().tiers[t]

    def free(self, job_id: str, name: str) -> None:
        self._hold(job_id)
        self.memory.free(f"{job_id}/{name}")
        self.tensors.pop(f"{job_id}/{name}", None)

    def put_tensor(self, job_id: str, name: str, array: np.ndarray, tier: str = "hbm") -> None:
        """Hold a copy of a real array (functional mode), accounted in `tier`. The socket
        owns the copy, so collectives may work on it in place (arrays that arrive
        through Ray are read-only views of its object store)."""
        self._hold(job_id)
        self._store(job_id, name, np.array(array, copy=True, order="C"), _tier(tier))

    def _store(self, job_id: str, name: str, array: np.ndarray, tier: Tier = Tier.HBM) -> None:
        key = f"{job_id}/{name}"
        if key in self.memory:
            self.memory.free(key)
        self.memory.allocate(key, tier, int(array.nbytes), what=name)
        self.tensors[key] = array

    def get_tensor(self, job_id: str, name: str) -> np.ndarray:
        self._hold(job_id)
        key = f"{job_id}/{name}"
        if key not in self.tensors:
            names = sorted(k.split("/", 1)[1] for k in self.tensors if k.startswith(f"{job_id}/"))
            raise UnknownName("tensor", name, names)
        return self.tensors[key]

    # ------------------------------------------------------------------ kernels

    def run_kernel(
        self,
        job_id: str,
        model: ModelSpec,
        phase: Phase,
        plan: FusionPlan,
        batch: int,
        seq: int,
        group_size: int,
        steps: int = 1,
        start_ns: int | None = None,
        carrier: dict[str, str] | None = None,
    ) -> Run:
        """`steps` repetitions of one step (a kernel-looped decode of `steps` tokens is
        one call): the socket's share of a TP group of `group_size` sockets. The model's
        weight share and KV cache are held in HBM for the job. `carrier`: the caller's
        trace context; the kernel's span is its child."""
        self._hold(job_id)
        if steps <= 0:
            raise InvalidRequest(f"steps must be positive, got {steps}")
        self._hold_weights(
            job_id, model, group_size, batch * seq if phase is not Phase.TRAIN else 0
        )
        timing = self._predictor.step(model, phase, plan, batch, seq, group_size)
        self._meet(start_ns)
        start = self.clock.now_ns
        self.clock.advance(timing.total_s * steps * self.slowdown)
        self._pace()
        run = Run(
            self.name,
            start,
            self.clock.now_ns,
            kernel_calls=timing.kernel_calls * steps,
            hbm_bytes=int(timing.hbm_bytes * steps),
            flops=int(timing.flops * steps),  # StepTiming.flops: per socket, per step
        )
        self._trace.span(
            names.SPAN_KERNEL,
            extract(carrier),
            job_id,
            run.start_ns,
            run.end_ns,
            {
                **kernel_attributes(model.name, phase, plan.value, steps, batch, seq),
                names.ATTR_KERNEL_CALLS: run.kernel_calls,
                names.ATTR_HBM_BYTES: run.hbm_bytes,
                names.ATTR_FLOPS: run.flops,
            },
        )
        return run

    # ------------------------------------------------------------------ programs

    def run_program(
        self,
        job_id: str,
        ops: list[Op],
        group: list[str],
        start_ns: int | None = None,
        carrier: dict[str, str] | None = None,
    ) -> ProgramRun:
        """Run a program (workloads/program.py) as this socket's rank of the TP `group`
        (socket ids, rank order, all on this node): deploy a bundle, switch experts,
        run kernels, generate tokens. Each op is a span on the emulated timeline."""
        self._hold(job_id)
        if self.name not in group:
            raise InvalidRequest(f"{self.name} is not in the group {group}")
        if self._program is None:
            self._program = ProgramRunner(
                self.name,
                self.platform,
                self.memory,
                self.clock,
                len(group),
                self._models,
                prefix=f"{job_id}/",
                generate=lambda op, share: self._generate(job_id, group, op, share),
            )
        elif self._program.group != len(group):
            raise InvalidRequest(
                f"{self.name}: job {job_id} runs with a TP group of {self._program.group}, "
                f"not {len(group)}"
            )

        parent = extract(carrier)

        def observe(op: Op, run: OpRun) -> None:
            name, attributes = op_span(op, run)
            self._trace.span(name, parent, job_id, run.start_ns, run.end_ns, attributes)

        self._meet(start_ns)
        program = self._program.run(ops, start_ns, self.slowdown, observe)
        self._pace()
        return program

    def _generate(
        self, job_id: str, group: list[str], op: Generate, share: BundleShare
    ) -> tuple[int, ...]:
        """Greedy generation by a tiny expert, this socket's TP shard, with real ring
        all-reduces over the links. Their transfers run on a scratch clock and links:
        the Kernel ops beside this one carry the emulated time (as in timing mode)."""
        if op.expert not in self._shards:
            experts = share.op.experts
            if op.expert not in experts or len(share.op.expert_seeds) != len(experts):
                raise InvalidRequest(
                    f"generate: expert {op.expert!r} has no functional weights in this bundle"
                )
            seed = share.op.expert_seeds[experts.index(op.expert)]
            model = TinyLM(TinyLMConfig(), seed)
            self._shards[op.expert] = model.shard(group.index(self.name), len(group))
        scratch = EmulatedClock(self.clock.now_ns)

        def all_reduce(partial: np.ndarray) -> np.ndarray:
            # Ring: every rank gets bitwise the same sum, so their argmaxes agree.
            buffer = np.array(partial, dtype=np.float64, copy=True).reshape(-1)
            self._collectives += 1
            tag = f"{job_id}/generate/{self._collectives}"
            self.exchange(tag, "all_reduce", group, buffer, clock=scratch, scratch_links=True)
            return buffer.reshape(partial.shape)

        tokens = generate(self._shards[op.expert], op.prompt, op.max_new_tokens, all_reduce)
        return tuple(tokens)

    # ------------------------------------------------------------------ training

    def train(
        self,
        job_id: str,
        workload: TrainingWorkload,
        group: list[str],
        *,
        platform_name: str = "",
        steps: int = 0,
        start_ns: int | None = None,
        checkpoint_dir: str = "",
        loop: bytes = b"",
        carrier: dict[str, str] | None = None,
    ) -> RankReport:
        """Run up to `steps` more steps (0: to the end) of this socket's DDP rank of
        `group` (socket ids in rank order, across nodes). The first call starts the
        rank; later calls continue it. A span covers each segment."""
        self._hold(job_id)
        if self._trainer is None or self._trainer.job_id != job_id:
            from rdurack.node_agent.rank import RankRunner  # see the imports at the top

            self._trainer = RankRunner(
                self, job_id, workload, platform_name, group, self._models, checkpoint_dir, loop
            )
        began = max(self.clock.now_ns, start_ns or 0)
        saved, self.timeout_s = self.timeout_s, workload.wall_timeout_s  # a dead peer
        try:
            self._meet(start_ns)
            report = self._trainer.advance(steps, start_ns)
        finally:
            self.timeout_s = saved
        # The segment's span first: the job's first span on a socket anchors the others.
        parent = extract(carrier)
        spans = self._trainer.take_spans()
        segment = self._trace.span(
            names.SPAN_TRAIN,
            parent,
            job_id,
            began,
            report.end_ns,
            {
                names.ATTR_RANK: report.rank,
                names.ATTR_STEPS: len(report.losses),
                names.ATTR_STEPS_UNTRACED: spans.untraced_steps,
                names.ATTR_STEP: report.step,
                names.ATTR_JOB_MODEL: workload.model,
                names.ATTR_ALLREDUCE_NS: report.all_reduce_ns,
                names.ATTR_EXPOSED_NS: report.exposed_ns,
                names.ATTR_HBM_BYTES: report.hbm_peak_bytes,
            },
        )
        self._trace.tree(spans.inside, trace.set_span_in_context(segment), job_id, {})
        self._trace.tree(spans.beside, parent, job_id, {names.ATTR_JOB_MODEL: workload.model})
        self._pace()
        return report

    def _hold_weights(self, job_id: str, model: ModelSpec, group_size: int, kv_tokens: int) -> None:
        weights = f"{job_id}/weights/{model.name}"
        if weights not in self.memory:
            self.memory.allocate(
                weights,
                Tier.HBM,
                -(-model.weight_bytes // group_size),
                what=f"{model.name} weights (1/{group_size})",
            )
        kv = f"{job_id}/kv/{model.name}/{kv_tokens}"
        if kv_tokens and kv not in self.memory:
            self.memory.allocate(
                kv,
                Tier.HBM,
                -(-kv_tokens * model.kv_bytes_per_token() // group_size),
                what=f"KV cache of {kv_tokens} tokens",
            )

    # ------------------------------------------------------------------ collectives

    def collective(
        self,
        job_id: str,
        op: str,
        tag: str,
        group: list[str],
        *,
        nbytes: int = 0,
        dtype: str = "float32",
        tensor: str | None = None,
        root: str | None = None,
        algorithm: str = "auto",
        reduce_op: str = "sum",
        start_ns: int | None = None,
        carrier: dict[str, str] | None = None,
    ) -> Run:
        """This socket's part of a collective over `group` (socket ids in rank order).
        Functional: `tensor` names the array each member holds; the result replaces it.
        Timing: `nbytes` of `dtype` describe the buffer; only descriptors travel.
        `carrier`: the caller's trace context; the collective's span is its child."""
        self._hold(job_id)
        members = [SocketId.parse(g) for g in group]
        if self.id not in members:
            raise InvalidRequest(f"{self.name} is not in the group {group}")
        if op not in COLLECTIVE_OPS:
            raise InvalidRequest(
                f"unknown collective {op!r}; accepted: {', '.join(COLLECTIVE_OPS)}"
            )
        if reduce_op not in ("sum", "mean"):
            raise InvalidRequest(f"unknown reduce op {reduce_op!r}; accepted: sum, mean")
        data = self.get_tensor(job_id, tensor) if tensor else None
        if data is not None and reduce_op == "mean" and data.dtype.kind not in "fc":
            raise InvalidRequest(f"a mean all-reduce needs floating point data, not {data.dtype}")
        itemsize = np.dtype(data.dtype if data is not None else dtype).itemsize
        elements = data.size if data is not None else nbytes // itemsize
        schedule = self._schedule(op, members, elements, itemsize, root, algorithm)
        self._meet(start_ns)
        start = self.clock.now_ns
        buffer = None
        if data is not None:
            # In place on the socket's own array, but for all-gather, whose result is larger.
            buffer = data.reshape(-1) if op != "all_gather" else self._gather_buffer(data, members)
        try:
            traffic = self._execute(tag, schedule, buffer, members, op)
        except LinkFailure:
            self._endpoint.mailbox.discard(tag)
            raise
        if buffer is not None and data is not None and tensor is not None:
            if op == "all_reduce" and reduce_op == "mean":
                buffer /= np.asarray(len(members), dtype=buffer.dtype)
            if op == "all_gather":
                self._store(job_id, tensor, buffer.reshape((len(members), *data.shape)))
        self._pace()
        run = Run(
            self.name,
            start,
            self.clock.now_ns,
            bytes_sent=traffic.bytes_sent,
            bytes_received=traffic.bytes_received,
        )
        self._trace.collective(
            extract(carrier),
            job_id,
            run.start_ns,
            run.end_ns,
            {
                names.ATTR_COLLECTIVE_OP: op,
                names.ATTR_COLLECTIVE_ALGORITHM: algorithm if op == "all_reduce" else op,
                names.ATTR_COLLECTIVE_TAG: tag,
                names.ATTR_GROUP_SIZE: len(members),
                names.ATTR_BYTES: elements * itemsize,
            },
            traffic,
        )
        return run

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
    ) -> np.ndarray | None:
        """A ring collective on a raw buffer, in place (timing mode: `nbytes` of
        `itemsize`, no buffer), for code running inside this socket (a training rank).
        `clock`: the stream it runs on (default: the socket's clock); `scratch_links`:
        link busy times it leaves no trace of (bookkeeping exchanges that the emulated
        hardware does not make); `traffic`: gets what it sent and received appended.
        Returns the result buffer (all-gather's is new)."""
        members = [SocketId.parse(g) for g in group]
        elements = buffer.size if buffer is not None else nbytes // itemsize
        size = buffer.itemsize if buffer is not None else itemsize
        schedule = self._schedule(op, members, elements, size, root, "ring")
        if buffer is not None:
            buffer = self._gather_buffer(buffer, members) if op == "all_gather" else buffer
        saved = self.clock, self._links
        if clock is not None:
            self.clock = clock
        if scratch_links:
            self._links = Links(self.topology)
        try:
            done = self._execute(tag, schedule, buffer, members, op)
        except LinkFailure:
            self._endpoint.mailbox.discard(tag)
            raise
        finally:
            self.clock, self._links = saved
        if traffic is not None:
            traffic.append(done)
        return buffer

    def _schedule(
        self,
        op: str,
        members: list[SocketId],
        elements: int,
        itemsize: int,
        root: str | None,
        algorithm: str,
    ) -> Schedule:
        """The schedule every member derives identically from the same arguments."""
        topo = self.topology
        if op == "all_reduce":
            try:
                alg = Algorithm(algorithm)
            except ValueError:
                accepted = ", ".join(a.value for a in Algorithm)
                raise InvalidRequest(
                    f"unknown algorithm {algorithm!r}; accepted: {accepted}"
                ) from None
            return all_reduce_schedule(topo, members, elements, itemsize, alg)
        if op == "broadcast":
            src = SocketId.parse(root) if root else members[0]
            return broadcast_schedule(topo, members, src, elements, itemsize)
        if op == "all_gather":
            return all_gather_schedule(topo, members, elements, itemsize)
        if op == "barrier":
            return barrier_schedule(topo, members)
        # send: root sends to the other member of a two-member group
        if len(members) != 2:
            raise InvalidRequest(f"send needs a group of two sockets, got {len(members)}")
        src = SocketId.parse(root) if root else members[0]
        dst = members[1] if src == members[0] else members[0]
        return ((ScheduledSend(src, dst, elements * itemsize, WHOLE, False),),)

    def _gather_buffer(self, data: np.ndarray, members: list[SocketId]) -> np.ndarray:
        """All-gather's output: block b travels as the block of ring position b."""
        flat = data.reshape(-1)
        out = np.zeros(len(members) * flat.size, dtype=flat.dtype)
        pos = self.topology.ring(members).index(self.id)
        out[pos * flat.size : (pos + 1) * flat.size] = flat
        return out

    def _execute(
        self,
        tag: str,
        schedule: Schedule,
        buffer: np.ndarray | None,
        members: list[SocketId],
        op: str,
    ) -> Traffic:
        me = self.id
        traffic = Traffic()
        # Sends go on the wire and the socket takes its incoming messages at once: each
        # step waits for its input, not for its own acknowledgements too. They are all
        # collected at the end; one that failed ends the wait for a reply at once.
        pending: list[Sends] = []

        def failed() -> LinkFailure | None:
            return next((e for p in pending if (e := p.failure()) is not None), None)

        try:
            for index, step in enumerate(schedule):
                outgoing = []
                for s in (s for s in step if s.src == me):
                    _, arrival = self._links.state(me, s.dst).transmit(self.clock.now_ns, s.nbytes)
                    arrival += self._delay_ns.get(str(s.dst), 0)  # a delayed link (fault)
                    outgoing.append(
                        OutgoingTransfer(
                            dst=str(s.dst),
                            tag=tag,
                            step=index,
                            send_ns=self.clock.now_ns,
                            arrival_ns=arrival,
                            nbytes=s.nbytes,
                            # A view, no copy: start_all copies it into its message, or
                            # (streamed) is waited for below before the buffer changes.
                            payload=None if buffer is None else _chunk(buffer, s).data,
                            dtype=str(buffer.dtype) if buffer is not None else "",
                        )
                    )
                    traffic.bytes_sent += s.nbytes
                    traffic.sends.append(
                        Sent(
                            link_name(me, s.dst),
                            self.topology.kind(me, s.dst).value,
                            self.clock.now_ns,
                            arrival,
                            s.nbytes,
                        )
                    )
                if outgoing:
                    sends = self._endpoint.start_all(outgoing, timeout_s=self.timeout_s)
                    pending.append(sends)
                    if sends.reads_payload:
                        sends.wait()
                for s in (s for s in step if s.dst == me):
                    msg = self._endpoint.receive(
                        tag, index, str(s.src), self.timeout_s, give_up=failed
                    )
                    self.clock.advance_to(msg.arrival_ns)
                    traffic.bytes_received += s.nbytes
                    if buffer is not None and msg.parts is not None:
                        _apply(_chunk(buffer, s), msg, s.reduce)
            for sends in pending:
                sends.wait()
        except LinkFailure:
            for sends in pending:
                sends.cancel()
            raise
        if op == "all_gather" and buffer is not None:
            # Reorder blocks from ring positions to rank order.
            ring = self.topology.ring(members)
            block = buffer.size // len(members)
            ordered = np.concatenate(
                [buffer[ring.index(m) * block : (ring.index(m) + 1) * block] for m in members]
            )
            buffer[...] = ordered
        return traffic

    # ------------------------------------------------------------------ pacing, faults

    def _meet(self, start_ns: int | None) -> None:
        """Move the clock to a job's start (the clocks of its sockets meet there). The
        jump is idle time, not work: pacing does not make it up in wall time."""
        if start_ns is None:
            return
        before = self.clock.now_ns
        self.clock.advance_to(start_ns)
        wall0, emu0 = self._pace_anchor
        self._pace_anchor = (wall0, emu0 + self.clock.now_ns - before)

    def _pace(self) -> None:
        """With time_scale > 0, wait until wall time has caught up with emulated time."""
        if self.time_scale <= 0:
            return
        wall0, emu0 = self._pace_anchor
        target = wall0 + (self.clock.now_ns - emu0) * 1e-9 * self.time_scale
        delay = target - time.monotonic()
        if delay > 0:
            time.sleep(delay)

    def slow(self, factor: float) -> None:
        """Fault hook: this socket's kernels take `factor` times longer (1 = healthy)."""
        if not factor >= 1.0:
            raise InvalidRequest(f"a slowdown factor must be >= 1, got {factor}")
        self.slowdown = factor

    def set_link_down(self, peer: str, down: bool = True) -> None:
        """Fault hook: the link from this socket to `peer` drops every transfer."""
        self.topology.check(SocketId.parse(peer))
        self._endpoint.set_link_down(peer, down)

    def set_link_delay(self, peer: str, extra_latency_ns: int) -> None:
        """Fault hook: transfers from this socket to `peer` arrive `extra_latency_ns`
        later in emulated time (0: no delay)."""
        self.topology.check(SocketId.parse(peer))
        if extra_latency_ns < 0:
            raise InvalidRequest(f"extra latency must be >= 0 ns, got {extra_latency_ns}")
        if extra_latency_ns:
            self._delay_ns[peer] = extra_latency_ns
        else:
            self._delay_ns.pop(peer, None)

    def close(self) -> None:
        self._endpoint.close()


def _tier(name: str) -> Tier:
    try:
        return Tier(name.lower())
    except ValueError:
        raise InvalidRequest(f"unknown tier {name!r}; accepted: sram, hbm, ddr") from None


def _chunk(buffer: np.ndarray, send: ScheduledSend) -> np.ndarray:
    """The part of `buffer` a send carries: chunk `send.chunk` of `send.parts`, split by
    the same rule the schedule used for its byte counts."""
    if send.chunk == WHOLE:
        return buffer
    sizes = split(buffer.size, send.parts)
    lo = sum(sizes[: send.chunk])
    return buffer[lo : lo + sizes[send.chunk]]


def _apply(target: np.ndarray, msg: Message, reduce: bool) -> None:
    """Add (`reduce`) or copy a received message's data into `target`, part by part as
    it arrived: no copy of the whole message first."""
    parts = msg.parts or ()
    if any(len(p) % target.itemsize for p in parts[:-1]):
        parts = (msg.payload or b"",)  # parts not on element boundaries: join them
    offset = 0
    for part in parts:
        incoming = np.frombuffer(part, dtype=target.dtype)
        piece = target[offset : offset + incoming.size]
        if reduce:
            piece += incoming
        else:
            piece[...] = incoming
        offset += incoming.size
