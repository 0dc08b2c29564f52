"""One emulated RDU socket: tiered memory, an emulated clock, kernels and links.

A plain class (Ray wraps it in node_agent/actors.py, the one place that knows Ray), so
it is tested without Ray. A socket serves one job at a time, and holds what the job put
on its tiers (node_agent/job_memory.py) until the job releases it. Kernels advance its
clock by what the rack/ timing model says; a serve job's prefill and decode, and an
endpoint's passes, by what workloads/serving/ says of them, as `rdu predict serve`
(node_agent/serving.py); programs run as workloads/coe/bundle.py says, a functional
Generate op with real all-reduces (node_agent/generation.py); collectives run over its
gRPC links on its clock (node_agent/collective_engine.py); a training job runs as a
DDP rank on it (node_agent/training/, imported only when a job trains). With
`time_scale` > 0 its calls return when wall time has caught up with their emulated time
(timeline/pacing.py). Fault hooks slow its kernels, take a link down or delay it. Every
kernel, pass, program op, collective and training segment is a span on the emulated
timeline, child of the caller's carrier (timeline/hardware_trace.py, docs/tracing.md).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from opentelemetry import trace

from rdurack.errors import InvalidRequest, SocketBusy
from rdurack.node_agent.collective_engine import CollectiveEngine, check
from rdurack.node_agent.generation import TinyExperts
from rdurack.node_agent.job_memory import JobMemory, tier_named
from rdurack.node_agent.links.endpoint import LinkEndpoint
from rdurack.node_agent.runs import Run, SocketState
from rdurack.node_agent.serving import Serving
from rdurack.node_agent.timeline.hardware_trace import HardwareTrace, kernel_attributes
from rdurack.node_agent.timeline.pacing import Pacer
from rdurack.node_agent.timeline.step_collectives import draw_step
from rdurack.rack.clock import EmulatedClock
from rdurack.rack.kernels import FusionPlan, Phase
from rdurack.rack.memory import TieredMemory, TierUsage
from rdurack.rack.models import ModelSpec, builtin_models
from rdurack.rack.placement import place
from rdurack.rack.spec import PlatformSpec
from rdurack.rack.topology import SocketId, Topology
from rdurack.security.tls import TlsConfig
from rdurack.telemetry import names
from rdurack.telemetry.propagation import extract
from rdurack.workloads.coe.bundle import ProgramRunner
from rdurack.workloads.predictor import Predictor
from rdurack.workloads.program import Op, ProgramRun

if TYPE_CHECKING:
    # Imported where a job trains (Socket.train): most sockets never do, and the
    # training stack is about a third of what a socket actor imports at its start
    # (~50 of ~145 ms on this machine), paid by 16 actors in every bring-up.
    from rdurack.node_agent.training.runner import RankRunner
    from rdurack.node_agent.training.script_thread import ScriptThread
    from rdurack.workloads.training.job import RankReport, TrainingWorkload


class Socket(Serving):
    """One socket. Every public method is one actor call (its serving calls, `serve` and
    `run_passes`, are in node_agent/serving.py)."""

    def __init__(
        self,
        socket_id: str,
        platform: PlatformSpec,
        *,
        time_scale: float = 0.0,
        host: str = "127.0.0.1",
        port: int | range = 0,
        timeout_s: float = 30.0,
        tls: TlsConfig | None = None,
        clock_ns: int = 0,
        tracer_provider: trace.TracerProvider | None = None,
    ) -> None:
        """`port`: its link server's (0: any free one; a range: its first free one).
        `timeout_s`: how long a collective waits for a peer's message, wall seconds.
        `tls`: its links are mutual TLS among rack members (plaintext without).
        `clock_ns`: where the emulated clock starts (a socket restarted after a fault
        continues from its predecessor's clock, so time on a socket never runs back).
        `tracer_provider`: where hardware spans go (default: the process's global one,
        which telemetry.setup.configure installs in a socket actor)."""
        self.clock = EmulatedClock(clock_ns)
        self._pacer = Pacer(self.clock, time_scale)
        self.name = socket_id
        self.id = SocketId.parse(socket_id)
        self.platform = platform
        self.topology = Topology(platform)
        self.topology.check(self.id)
        self.memory = TieredMemory(socket_id, platform.socket)
        self.timeout_s = timeout_s
        self.slowdown = 1.0  # fault hook: kernels take this many times longer
        self.job: str | None = None
        self._held = JobMemory(self.memory)
        self._predictor = Predictor(platform)
        self._endpoint = LinkEndpoint(
            socket_id, host, port, clock_ns=lambda: self.clock.now_ns, tls=tls
        )
        self.engine = CollectiveEngine(self.id, self.topology, self._endpoint)
        self._trace = HardwareTrace(socket_id, tracer_provider)
        self._models = builtin_models()
        self._program: ProgramRunner | None = None  # the running job's program state
        self._trainer: RankRunner | None = None  # the running job's DDP rank
        # A stopped script's thread that had not ended when its job released the socket.
        self._lingering: ScriptThread | None = None
        self._drawn: str | None = None  # the job whose kernel step's collectives are drawn

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
        tiers = {t.value: u for t, u in memory.snapshot().tiers.items()}
        return self._state(tiers)

    def ping(self) -> int:
        return self.clock.now_ns

    def heartbeat(self) -> SocketState:
        """Liveness and the cheap part of `state` (no tier usage). Ray runs it on the
        actor's control thread (actors.py), so a socket busy with a long call answers;
        it only reads attributes, which the busy thread may change between two reads."""
        return self._state({})

    def _state(self, tiers: dict[str, TierUsage]) -> SocketState:
        return SocketState(
            socket_id=self.name,
            job_id=self.job,
            clock_ns=self.clock.now_ns,
            link_address=self._endpoint.address,
            slowdown=self.slowdown,
            tiers=tiers,
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
            self._pacer.restart()
            self._trace.restart()

    def release(self, job_id: str) -> bool:
        """Free the socket and everything the job allocated on it; False if not held."""
        if self.job != job_id:
            return False
        self._held.release(job_id)
        self.job = None
        self._program = None
        if self._trainer is not None:
            # A script still running (its job cancelled, or failed elsewhere) stops: its
            # next operator raises, and a wait for a peer in a collective ends now.
            self._trainer.request_stop()
            self._endpoint.mailbox.abort(f"job {job_id} ended")
            self._lingering = self._trainer.close()
            self._trainer = None
        self._endpoint.mailbox.reset()
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
        return self._held.allocate(job_id, name, tier, nbytes)

    def free(self, job_id: str, name: str) -> None:
        self._hold(job_id)
        self._held.free(job_id, name)

    def put_tensor(self, job_id: str, name: str, array: np.ndarray, tier: str = "hbm") -> None:
        """Hold a copy of a real array (functional mode), accounted in `tier`. The socket
        owns the copy, so collectives may work on it in place (arrays that arrive
        through Ray are read-only views of its object store)."""
        self._hold(job_id)
        copy = np.array(array, copy=True, order="C")
        self._held.store(job_id, name, copy, tier_named(tier))

    def get_tensor(self, job_id: str, name: str) -> np.ndarray:
        self._hold(job_id)
        return self._held.tensor(job_id, name)

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
        group: list[str] | None = None,
    ) -> Run:
        """`steps` repetitions of one step (a kernel-looped decode of `steps` tokens is
        one call): the socket's share of a TP group of `group_size` sockets. The model's
        weight share and KV cache are held in HBM for the job. `carrier`: the caller's
        trace context; the kernel's span is its child. `group`: the job's sockets in
        rank order; given, the job's first call draws the step's collectives under the
        kernel's span (node_agent/timeline/step_collectives.py)."""
        self._hold(job_id)
        if steps <= 0:
            raise InvalidRequest(f"steps must be positive, got {steps}")
        kv_tokens = batch * seq if phase is not Phase.TRAIN else 0
        placement = place(model, self.platform, group_size, kv_tokens)
        self._held.hold_model(job_id, model.name, placement, kv_tokens)
        timing = self._predictor.step(model, phase, plan, batch, seq, group_size)
        self._pacer.meet(start_ns)
        start = self.clock.now_ns
        self.clock.advance(timing.total_s * steps * self.slowdown)
        self._pacer.pace()
        run = Run(
            self.name,
            start,
            self.clock.now_ns,
            kernel_calls=timing.kernel_calls * steps,
            hbm_bytes=int(timing.hbm_bytes * steps),
            flops=int(timing.flops * steps),  # StepTiming.flops: per socket, per step
            launch_ns=round(timing.launch_s * steps * 1e9),
            collective_ns=round(timing.collective_s * steps * 1e9),
        )
        span = self._trace.span(
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
        if group is not None and self._drawn != job_id:
            self._drawn = job_id
            ops = self._predictor.decompose(model, phase, batch, seq, group_size)
            inside = trace.set_span_in_context(span)
            draw_step(self._trace, inside, job_id, self.topology, group, self.id, ops, run.start_ns)
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
            experts = TinyExperts(job_id, self.name, group, self.engine, self.clock)
            self._program = ProgramRunner(
                self.name,
                self.platform,
                self.memory,
                self.clock,
                len(group),
                self._models,
                prefix=f"{job_id}/",
                # The socket's timeout when the op runs.
                generate=lambda op, share: experts.generate(op, share, self.timeout_s),
            )
        elif self._program.group != len(group):
            raise InvalidRequest(
                f"{self.name}: job {job_id} runs with a TP group of {self._program.group}, "
                f"not {len(group)}"
            )
        observe = self._trace.program(extract(carrier), job_id)
        self._pacer.meet(start_ns)
        program = self._program.run(ops, start_ns, self.slowdown, observe)
        self._pacer.pace()
        return program

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
        prepare: bool = False,
        carrier: dict[str, str] | None = None,
    ) -> RankReport:
        """Run up to `steps` more steps (0: to the end) of this socket's DDP rank of
        `group` (socket ids in rank order, across nodes). The first call starts the
        rank; later calls continue it. A span covers each segment. Its collectives
        wait `workload.wall_timeout_s` for a peer, not the socket's timeout.
        `prepare`: start the rank and run no step (RankRunner.prepare)."""
        self._hold(job_id)
        if self._trainer is None or self._trainer.job_id != job_id:
            from rdurack.node_agent.training.runner import RankRunner  # see the imports

            if self._lingering is not None and not self._lingering.join(workload.wall_timeout_s):
                raise InvalidRequest(
                    f"{self.name}: {self._lingering.name} of an earlier job was stopped "
                    "and still runs (no torch operator to stop it at); this socket takes "
                    "a new training job once it ends"
                )
            self._lingering = None

            self._trainer = RankRunner(
                self, job_id, workload, platform_name, group, self._models, checkpoint_dir
            )
        if prepare:
            return self._trainer.prepare()
        self._pacer.meet(start_ns)
        report = self._trainer.advance(steps, self._trace, extract(carrier), start_ns)
        self._pacer.pace()
        return report

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
        check(op, reduce_op)
        data = self.get_tensor(job_id, tensor) if tensor else None
        itemsize = np.dtype(data.dtype if data is not None else dtype).itemsize
        plan = self.engine.plan(
            op, members, data, nbytes=nbytes, itemsize=itemsize, root=root,
            algorithm=algorithm, reduce_op=reduce_op,
        )  # fmt: skip
        self._pacer.meet(start_ns)
        start = self.clock.now_ns
        buffer, traffic = self.engine.run(tag, plan, self.clock, self.timeout_s, data)
        if op == "all_gather" and buffer is not None and data is not None and tensor:
            # The result is larger: a new array, rank by rank.
            self._held.store(job_id, tensor, buffer.reshape((len(members), *data.shape)))
        self._pacer.pace()
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
                names.ATTR_BYTES: plan.nbytes,
            },
            traffic,
        )
        return run

    # ------------------------------------------------------------------ faults

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
        self.engine.set_delay(peer, extra_latency_ns)

    def close(self) -> None:
        self._endpoint.close()
