"""A node agent: the 8 socket actors of one rack node, started on its own Ray node.

A plain class; api/node_agent_service.py serves it as rdurack.v1.NodeAgentService.
Every call to an actor has a deadline (ray_calls.py), so a dead or wedged socket shows
up as a clear error, never as a hang. The actors, and what is known of each, are a
NodeActors (actors.py). Calls that drive sockets for a job open a span, child of the
RPC's server span, and give the actors its context as an explicit carrier; the first
socket to fail ends the others' waits.

Faults (docs/faults.md): the agent applies its node's part of each injected fault and
keeps them until cleared; a socket actor that died stays dead, reported by `heartbeat`,
until `clear_faults` restarts it, continuing its predecessor's emulated clock under the
faults still in force. What each socket must be told is decided by fault_plan.py
(pure); this class makes the calls. `in_process.start_rack` starts every node's agent in one
process, for tests and benchmarks.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from opentelemetry import trace
from opentelemetry.util.types import AttributeValue
from ray.exceptions import RayActorError

from rdurack.errors import InvalidRequest, RdurackError
from rdurack.node_agent import fault_plan, ray_calls
from rdurack.node_agent.actors import NodeActors, control
from rdurack.node_agent.fault_plan import FaultState
from rdurack.node_agent.health import SocketHealth
from rdurack.node_agent.ray_calls import CONTROL_TIMEOUT_S, HEARTBEAT_TIMEOUT_S
from rdurack.node_agent.runs import PassesRun, Run
from rdurack.rack.faults import Fault, FaultKind
from rdurack.rack.kernels import FusionPlan, Phase
from rdurack.rack.models import ModelSpec
from rdurack.rack.spec import PlatformSpec
from rdurack.rack.topology import SocketId, Topology
from rdurack.security.tls import TlsConfig
from rdurack.telemetry import names
from rdurack.telemetry.propagation import inject
from rdurack.telemetry.served import PassesServed
from rdurack.workloads.program import Op, ProgramRun
from rdurack.workloads.serving.batch import SERVE, ServeRequest
from rdurack.workloads.serving.stream.bundle import BundleLayout
from rdurack.workloads.serving.stream.pricing import Pass
from rdurack.workloads.training.job import RankReport, TrainingWorkload


class NodeAgent:
    """Starts, watches and drives the socket actors of rack node `node_index`."""

    def __init__(
        self,
        node_index: int,
        platform: PlatformSpec,
        *,
        time_scale: float = 0.0,
        host: str = "127.0.0.1",
        call_timeout_s: float = 60.0,
        link_timeout_s: float = 30.0,
        tls: TlsConfig | None = None,
        link_ports: range | None = None,
    ) -> None:
        """`tls`: the sockets' links are mutual TLS among rack members (the files must
        be readable where the actors run: this node). `link_ports`: where the sockets'
        link servers bind, each the first free port of the range (None: any free one)."""
        if not 0 <= node_index < platform.nodes_total:
            raise InvalidRequest(
                f"node index {node_index} is not a node of {platform.name} "
                f"(0..{platform.nodes_total - 1})"
            )
        self.node_index = node_index
        self.platform = platform
        self.time_scale = time_scale
        self.host = host
        self.call_timeout_s = call_timeout_s
        self.link_timeout_s = link_timeout_s
        self.tls = tls
        rack = node_index // platform.nodes  # nodes count across racks (SocketId)
        self.socket_ids = [str(SocketId(node_index, i, rack)) for i in range(platform.node.sockets)]
        self.topology = Topology(platform)
        # A new value each time the agent starts: the orchestrator tells a restarted
        # agent (whose sockets lost their jobs) from one that was only slow to answer.
        self.incarnation = uuid.uuid4().hex[:12]
        self._sockets = NodeActors(
            node_index,
            self.socket_ids,
            call_timeout_s,
            platform=platform,
            time_scale=time_scale,
            host=host,
            timeout_s=link_timeout_s,
            tls=tls,
            port=link_ports or 0,
        )
        # The faults change while gRPC threads apply them (inject, clear, restart).
        self._lock = threading.RLock()
        self._faults: dict[str, Fault] = {}  # id -> faults with a part on this node
        self._told = FaultState()  # what the live actors were last told of the faults
        self._tracer = trace.get_tracer(names.TRACER_NODE_AGENT)

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Start the node's socket actors on this process's Ray node; return when all
        serve their links and know each other's addresses."""
        self._sockets.start()
        self.connect(self.addresses())

    def stop(self) -> None:
        """Kill the actors this agent started (only those), once they have exported
        their spans (best effort: a dead or wedged actor does not delay this long)."""
        self._sockets.stop()

    def addresses(self) -> dict[str, str]:
        return self._sockets.addresses()

    def connect(self, peers: dict[str, str], socket_ids: Sequence[str] | None = None) -> None:
        """Tell local sockets (`socket_ids`, default all) the link addresses of `peers`
        (its own node included). A job tells only its own sockets: another may be dead.
        On the control thread: a socket busy with another job learns them at once."""
        if socket_ids:
            targets = [self._sockets.actor(s) for s in socket_ids]
        else:
            targets = list(self._sockets.alive().values())
        self._get([control(a, "connect").remote(peers) for a in targets], "connect")

    # ------------------------------------------------------------------ status

    def heartbeat(self, timeout_s: float = HEARTBEAT_TIMEOUT_S) -> list[SocketHealth]:
        """Every socket's liveness, without tier usage (NodeActors.heartbeat)."""
        return self._sockets.heartbeat(timeout_s)

    def health(self) -> list[SocketHealth]:
        """`heartbeat` with each answering socket's full state (NodeActors.health)."""
        return self._sockets.health()

    def abort(self, job_id: str, socket_ids: Sequence[str], reason: str) -> list[str]:
        """End the waits of `job_id`'s calls in flight on `socket_ids` at once (their
        peer died): they fail with `reason`. Returns the sockets that held the job."""
        actors = {sid: self._sockets.actor(sid) for sid in socket_ids}
        refs = {sid: control(a, "abort").remote(job_id, reason) for sid, a in actors.items()}
        got = ray_calls.answers(refs, CONTROL_TIMEOUT_S)
        # A dead socket (its answer a RayActorError) had no wait to end.
        return [sid for sid, a in got.items() if a and not isinstance(a, RayActorError)]

    # ------------------------------------------------------------------ jobs

    def reserve(self, job_id: str, socket_ids: Sequence[str]) -> None:
        """All of `socket_ids` for `job_id`, or none (gang reservation)."""
        done: list[str] = []
        try:
            for sid in socket_ids:
                self._get([self._sockets.actor(sid).reserve.remote(job_id)], f"reserve {sid}")
                done.append(sid)
        except RdurackError:
            self.release(job_id, done)
            raise

    def release(self, job_id: str, socket_ids: Sequence[str]) -> list[str]:
        released = self._get(
            [self._sockets.actor(sid).release.remote(job_id) for sid in socket_ids], "release"
        )
        return [sid for sid, ok in zip(socket_ids, released, strict=True) if ok]

    def run_kernel(
        self,
        job_id: str,
        socket_ids: Sequence[str],
        model: ModelSpec,
        phase: Phase,
        plan: FusionPlan,
        batch: int,
        seq: int,
        group_size: int,
        steps: int = 1,
        start_ns: int | None = None,
        group: Sequence[str] | None = None,
    ) -> list[Run]:
        """`group`: the job's sockets in rank order, across nodes (Socket.run_kernel
        draws the step's collectives over it)."""
        return self._drive(
            names.SPAN_NODE_KERNEL,
            {
                names.ATTR_JOB_MODEL: model.name,
                names.ATTR_JOB_PHASE: phase.value,
                names.ATTR_STEPS: steps,
            },
            job_id,
            socket_ids,
            f"kernel of job {job_id}",
            "run_kernel",
            (job_id, model, phase, plan, batch, seq, group_size, steps, start_ns),
            {"group": None if group is None else list(group)},
        )

    def serve(
        self,
        job_id: str,
        socket_ids: Sequence[str],
        request: ServeRequest,
        first_step: int,
        steps: int,
        start_ns: int | None = None,
    ) -> list[Run]:
        """Steps first_step .. first_step + steps - 1 of a serve job on the sockets
        (Socket.serve); the TP group is `request.sockets`, across nodes."""
        return self._drive(
            names.SPAN_NODE_KERNEL,
            {
                names.ATTR_JOB_MODEL: request.model,
                names.ATTR_JOB_PHASE: SERVE,
                names.ATTR_STEPS: steps,
            },
            job_id,
            socket_ids,
            f"serve job {job_id}",
            "serve",
            (job_id, request, first_step, steps, start_ns),
        )

    def run_passes(
        self,
        job_id: str,
        socket_ids: Sequence[str],
        model: ModelSpec,
        group_size: int,
        passes: Sequence[Pass],
        kv_tokens: int,
        start_ns: int | None = None,
        served: PassesServed | None = None,
        bundle: BundleLayout | None = None,
    ) -> list[PassesRun]:
        """An endpoint's passes on the sockets (Socket.run_passes); the TP group is
        `group_size` sockets, across nodes. `served`: the requests each pass served;
        `bundle`: what a CoE bundle's sockets hold."""
        return self._drive(
            names.SPAN_NODE_KERNEL,
            {names.ATTR_JOB_MODEL: model.name, names.ATTR_STEPS: len(passes)},
            job_id,
            socket_ids,
            f"passes of endpoint job {job_id}",
            "run_passes",
            (job_id, model, group_size, list(passes), kv_tokens, start_ns),
            {"served": served, "bundle": bundle},
        )

    def collective(
        self,
        job_id: str,
        op: str,
        tag: str,
        group: Sequence[str],
        socket_ids: Sequence[str] | None = None,
        **kwargs: Any,
    ) -> list[Run]:
        """Run the local members' part of a collective over `group` (which may span both
        nodes: the other node's agent runs its members' part at the same time)."""
        return self._drive(
            names.SPAN_NODE_COLLECTIVE,
            {
                names.ATTR_COLLECTIVE_OP: op,
                names.ATTR_COLLECTIVE_TAG: tag,
                names.ATTR_GROUP_SIZE: len(group),
            },
            job_id,
            self._local(socket_ids or group, group),
            f"collective {tag!r}",
            "collective",
            (job_id, op, tag, list(group)),
            kwargs,
        )

    def run_program(
        self,
        job_id: str,
        socket_ids: Sequence[str],
        ops: Sequence[Op],
        start_ns: int | None = None,
    ) -> list[ProgramRun]:
        """Run a program on a TP group of this node's sockets (`socket_ids`, rank order),
        all at once: in functional mode they meet at all-reduces over their links."""
        if not socket_ids:
            raise InvalidRequest("socket_ids: a program needs at least one socket")
        group = list(socket_ids)
        return self._drive(
            names.SPAN_NODE_PROGRAM,
            {names.ATTR_STEPS: len(ops)},
            job_id,
            group,
            f"program of job {job_id}",
            "run_program",
            (job_id, list(ops), group, start_ns),
        )

    def train(
        self,
        job_id: str,
        socket_ids: Sequence[str],
        workload: TrainingWorkload,
        group: Sequence[str],
        *,
        platform_name: str = "",
        steps: int = 0,
        start_ns: int | None = None,
        checkpoint_dir: str = "",
        prepare: bool = False,
    ) -> list[RankReport]:
        """Run up to `steps` more steps on this node's ranks of a DDP job; `group` is
        every rank, across nodes, in rank order. `prepare`: start the ranks and run no
        step, within START_TIMEOUT_S (TrainingWorkload.call_timeout_s)."""
        return self._drive(
            names.SPAN_NODE_TRAIN,
            {names.ATTR_STEPS: steps, names.ATTR_TRAIN_PREPARE: prepare},
            job_id,
            self._local(socket_ids, socket_ids),
            f"starting the ranks of job {job_id}" if prepare else f"training of job {job_id}",
            "train",
            (job_id, workload, list(group)),
            {
                "platform_name": platform_name,
                "steps": steps,
                "start_ns": start_ns,
                "checkpoint_dir": checkpoint_dir,
                "prepare": prepare,
            },
            timeout_s=workload.call_timeout_s(self.call_timeout_s, prepare),
        )

    def _local(self, socket_ids: Sequence[str], named: Sequence[str]) -> list[str]:
        """The sockets of `socket_ids` on this node; InvalidRequest naming `named` when
        there is none."""
        local = self._sockets.here(socket_ids)
        if not local:
            raise InvalidRequest(f"none of {list(named)} is a socket of node {self.node_index}")
        return local

    def _drive(
        self,
        span: str,
        attributes: Mapping[str, AttributeValue],
        job_id: str,
        socket_ids: Sequence[str],
        what: str,
        method: str,
        args: tuple[Any, ...],
        kwargs: Mapping[str, Any] | None = None,
        timeout_s: float | None = None,
    ) -> list[Any]:
        """Call `method(*args, **kwargs, carrier=...)` on the actors of `socket_ids` at
        once, under a span `span` (child of the current one: the RPC's server span) that
        the actors continue from the carrier, and gather their results within
        `timeout_s` (default call_timeout_s)."""
        with self._tracer.start_as_current_span(
            span,
            attributes={
                names.ATTR_JOB_ID: job_id,
                names.ATTR_NODE: self.node_index,
                names.ATTR_SOCKETS: list(socket_ids),
                **attributes,
            },
        ):
            carrier = inject()
            refs = [
                getattr(self._sockets.actor(sid), method).remote(
                    *args, **(kwargs or {}), carrier=carrier
                )
                for sid in socket_ids
            ]
            return self._gather(refs, what, job_id, socket_ids, timeout_s)

    # ------------------------------------------------------------------ tensors (functional)

    def put_tensor(self, job_id: str, socket_id: str, name: str, array: np.ndarray) -> None:
        self._get(
            [self._sockets.actor(socket_id).put_tensor.remote(job_id, name, array)], "put tensor"
        )

    def get_tensor(self, job_id: str, socket_id: str, name: str) -> np.ndarray:
        result: np.ndarray = self._get(
            [self._sockets.actor(socket_id).get_tensor.remote(job_id, name)], "get tensor"
        )[0]
        return result

    # ------------------------------------------------------------------ fault hooks

    def kill_socket(self, socket_id: str, why: str = "killed") -> None:
        """Kill a socket's actor; it stays dead until `restart_socket` (or
        `clear_faults`). Its clock is kept for the actor that replaces it."""
        self._sockets.kill(socket_id, why)

    def restart_socket(self, socket_id: str) -> None:
        """Replace a socket's actor (dead or not) by a new one: same id, fresh memory, the
        old one's last known clock, the faults in force; its node's sockets learn its new
        link address (sockets of other nodes learn it with their next job's group)."""
        actor, address, others = self._sockets.replace(socket_id)
        with self._lock:
            # The new actor runs at full speed with every link up: forget what the old
            # one was told, so `_apply` tells it the faults still in force.
            self._told = self._told.without(socket_id)
        peers = self._sockets.addresses()
        self._get([control(actor, "connect").remote(peers)], f"connect {socket_id}")
        self._get(
            [control(a, "connect").remote({socket_id: address}) for a in others],
            f"tell peers of {socket_id}",
        )
        self._apply()

    def slow_socket(self, socket_id: str, factor: float) -> None:
        self._get([control(self._sockets.actor(socket_id), "slow").remote(factor)], "slow")

    def set_link_down(self, src: str, dst: str, down: bool = True) -> None:
        actor = self._sockets.actor(src)
        self._get([control(actor, "set_link_down").remote(dst, down)], "link fault")

    # ------------------------------------------------------------------ injected faults

    def inject_fault(self, fault: Fault) -> list[str]:
        """Apply this node's part of `fault` (not KILL_AGENT: ending the process is its
        server's job); one line per change. A fault overlapping one in force on the same
        target, or killing a dead socket, is a FaultConflict (fault_plan.admit)."""
        with self._lock:
            fault_plan.admit(fault, self._faults, self.node_index, self.topology)
            self._faults[fault.id] = fault
        try:
            if fault.kind is FaultKind.KILL_SOCKET:
                self.kill_socket(fault.sockets[0], f"killed by fault {fault.id}")
                return [f"{fault.sockets[0]} killed"]
            return self._apply()
        except RdurackError:
            with self._lock:
                self._faults.pop(fault.id, None)
            self._apply()
            raise

    def clear_faults(self, fault_id: str = "") -> tuple[list[Fault], list[str]]:
        """End fault `fault_id` on this node (empty: every fault, and restart every dead
        socket actor, whatever killed it). Returns the faults ended and the sockets
        restarted; an id with no part here ends nothing."""
        with self._lock:
            dead = self._sockets.dead()
            cleared, restart = fault_plan.clearing(fault_id, self._faults, dead)
            for f in cleared:
                del self._faults[f.id]
        for sid in restart:
            self.restart_socket(sid)
        self._apply()
        return cleared, restart

    def faults(self) -> list[Fault]:
        with self._lock:
            return list(self._faults.values())

    def _apply(self) -> list[str]:
        """Tell every live actor what fault_plan says changed for it (its slowdown, its
        outbound links); one line per change."""
        with self._lock:
            want = fault_plan.wanted(self._faults.values(), self.topology, self.socket_ids)
            alive = self._sockets.alive()
            changes = fault_plan.changes(want, self._told, list(alive))
            refs = [control(alive[c.socket], c.kind.value).remote(*c.args) for c in changes]
        if not changes:
            return []
        self._get(refs, "apply faults", CONTROL_TIMEOUT_S)
        with self._lock:
            self._told = self._told.after(changes)
        return [c.describe() for c in changes]

    # ------------------------------------------------------------------ helpers

    def _gather(
        self,
        refs: list[Any],
        what: str,
        job_id: str,
        socket_ids: Sequence[str],
        timeout_s: float | None = None,
    ) -> list[Any]:
        """ray_calls.gather within `timeout_s` (default call_timeout_s): a socket's
        failure ends the waits of the job's other sockets here."""

        def abort(sockets: list[str]) -> None:
            why = f"a socket of job {job_id} on node {self.node_index} failed ({what})"
            for actor in self._sockets.handles(sockets):
                control(actor, "abort").remote(job_id, why)

        limit = self.call_timeout_s if timeout_s is None else timeout_s
        return ray_calls.gather(refs, what, self.node_index, limit, socket_ids, abort)

    def _get(self, refs: list[Any], what: str, timeout_s: float | None = None) -> list[Any]:
        return self._sockets.get(refs, what, timeout_s)
