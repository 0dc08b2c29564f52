"""How the orchestrator reaches node agents: a protocol that services/ implements over
gRPC (and tests may implement in memory). The orchestrator core never imports gRPC."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

from rdurack.orchestrator.jobs import EndpointWorkload, KernelWorkload
from rdurack.rack.faults import Fault
from rdurack.telemetry.served import PassesServed
from rdurack.workloads.program import Op, ProgramRun
from rdurack.workloads.serving.stream.pricing import Pass
from rdurack.workloads.training.job import RankReport, TrainingWorkload


@dataclass(frozen=True)
class TierView:
    used_bytes: int
    peak_bytes: int
    capacity_bytes: int


@dataclass(frozen=True)
class SocketView:
    socket_id: str
    node: int
    healthy: bool
    job_id: str = ""
    clock_ns: int = 0
    link_address: str = ""
    tiers: dict[str, TierView] = field(default_factory=dict)  # "sram" | "hbm" | "ddr"
    slowdown: float = 1.0  # an injected SLOW_SOCKET fault: kernels take this many x longer
    incarnation: int = 0  # grows by one each time its agent restarts its actor
    reason: str = ""  # why it is not healthy
    dead: bool = False  # not healthy because its actor died (not merely silent)
    since_s: float | None = None  # wall clock its health last changed (the watcher's)


@dataclass(frozen=True)
class NodeView:
    index: int
    address: str
    healthy: bool
    sockets: tuple[SocketView, ...] = ()
    error: str = ""  # why the node is unhealthy (agent unreachable, ...)
    since_s: float | None = None  # wall clock its health last changed (the watcher's)


@dataclass(frozen=True)
class SocketBeat:
    """One socket in a heartbeat: "healthy" (its actor answered), "dead" (its actor is
    gone) or "unresponsive" (no answer in time: busy, wedged or dying)."""

    socket_id: str
    state: Literal["healthy", "dead", "unresponsive"]
    job_id: str = ""
    incarnation: int = 0
    clock_ns: int = 0
    slowdown: float = 1.0
    error: str = ""


@dataclass(frozen=True)
class NodeBeat:
    index: int
    incarnation: str  # a new value each time the agent process starts
    sockets: tuple[SocketBeat, ...] = ()


@dataclass(frozen=True)
class KernelRun:
    """One socket's share of a kernel job, in emulated ns."""

    socket_id: str
    start_ns: int
    end_ns: int
    kernel_calls: int
    hbm_bytes: int
    flops: int = 0  # the FLOPs its kernels executed
    launch_ns: int = 0  # of its duration: launching kernels
    collective_ns: int = 0  # of its duration: collectives inside kernels nothing hides


@dataclass(frozen=True)
class PassesRun:
    """One socket's share of an endpoint's passes: each pass's duration and the clock
    before and after them, emulated ns."""

    socket_id: str
    start_ns: int
    end_ns: int
    durations_ns: tuple[int, ...]


class NodeGateway(Protocol):
    def nodes(self) -> list[NodeView]:
        """Every node agent's view of its sockets; an unreachable agent is a NodeView
        with healthy False (never an exception)."""
        ...

    def reserve(self, node: int, job_id: str, sockets: Sequence[str]) -> None:
        """All of `sockets` (of one node) for `job_id`, or none; raises SocketBusy or
        LinkFailure."""
        ...

    def release(self, node: int, job_id: str, sockets: Sequence[str]) -> None: ...

    def run_kernel(
        self,
        node: int,
        job_id: str,
        sockets: Sequence[str],
        workload: KernelWorkload,
        steps: int,
        start_ns: int,
        first_step: int = 0,
        group: Sequence[str] = (),
    ) -> list[KernelRun]:
        """This node's share of a kernel job: `steps` steps on `sockets` (the TP group
        is the job's `workload.num_sockets` sockets), starting at `start_ns`. A serve
        job's steps are numbered (step 0 its prefill, step i its decode iteration
        i - 1): the call runs first_step .. first_step + steps - 1. `group`: the job's
        sockets in rank order, across nodes."""
        ...

    def run_passes(
        self,
        node: int,
        job_id: str,
        sockets: Sequence[str],
        workload: EndpointWorkload,
        passes: Sequence[Pass],
        kv_tokens: int,
        start_ns: int,
        served: PassesServed | None = None,
    ) -> list[PassesRun]:
        """An endpoint job's forward passes on this node's `sockets` of its TP group
        (`workload.num_sockets`), one after the other from `start_ns`; the engine's
        requests hold `kv_tokens` of KV cache meanwhile. `served`: the requests each
        pass served, which its spans link to."""
        ...

    def run_program(
        self, node: int, job_id: str, sockets: Sequence[str], ops: Sequence[Op], start_ns: int
    ) -> list[ProgramRun]:
        """Run a program on a TP group of one node (`sockets`, rank order) from
        `start_ns`; one ProgramRun per socket, in `sockets` order."""
        ...

    def train(
        self,
        node: int,
        job_id: str,
        sockets: Sequence[str],
        workload: TrainingWorkload,
        group: Sequence[tuple[str, str]],
        *,
        platform_name: str = "",
        steps: int = 0,
        start_ns: int = 0,
        checkpoint_dir: str = "",
        prepare: bool = False,
    ) -> list[RankReport]:
        """Run up to `steps` more steps (0: to the end) on this node's ranks (`sockets`)
        of a DDP job whose ranks, in order, are `group` (socket id, link address);
        `start_ns` (first call) is the job's emulated start. One report per socket.
        `prepare`: start the ranks and run no step (every node's, before any step)."""
        ...

    def heartbeat(self, node: int, timeout_s: float) -> NodeBeat:
        """The agent's cheap liveness answer within `timeout_s`; raises LinkFailure when
        the agent cannot be reached."""
        ...

    def abort(self, node: int, job_id: str, sockets: Sequence[str], reason: str) -> None:
        """Fail `job_id`'s calls in flight on `sockets` (of one node) at once, naming
        `reason`: a peer of theirs died, so they would only wait for their timeout."""
        ...

    def inject_fault(self, node: int, fault: Fault) -> None:
        """Apply node `node`'s part of `fault` (FaultConflict if it overlaps one)."""
        ...

    def clear_faults(self, node: int, fault_id: str) -> tuple[list[Fault], list[str]]:
        """End `fault_id` (empty: every fault) on `node`; the faults ended and the socket
        actors restarted."""
        ...

    def faults(self, node: int) -> list[Fault]:
        """The faults with a part on `node`."""
        ...
