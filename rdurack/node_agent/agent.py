"""A node agent: the 8 socket actors of one rack node, started on its own Ray node.

A plain class; api/node_agent_service.py serves it as rdurack.v1.NodeAgentService.
Every call to an actor has a deadline, so a dead or wedged socket shows up as a clear
error, never as a hang.

Calls that drive sockets (run_kernel, collective) open a span, child of the current
one (the RPC's server span), and give the actors its context as an explicit carrier.

Faults (docs/faults.md): the agent applies its node's part of each injected fault and
keeps them until they are cleared; a socket actor that died (killed, or on its own)
stays dead, reported by `heartbeat`, until `clear_faults` restarts it. A restarted
actor continues its predecessor's emulated clock and gets the faults still in force.
"""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import ray
from opentelemetry import trace
from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from rdurack.errors import InvalidRequest, LinkFailure, RdurackError, UnknownName
from rdurack.node_agent.actors import SocketActor, control
from rdurack.node_agent.socket import Run, SocketState
from rdurack.rack.faults import LINK_KINDS, Fault, FaultConflict, FaultKind
from rdurack.rack.kernels import FusionPlan, Phase
from rdurack.rack.models import ModelSpec
from rdurack.rack.spec import PlatformSpec
from rdurack.rack.topology import SocketId, Topology
from rdurack.security.tls import TlsConfig
from rdurack.telemetry import names
from rdurack.telemetry.propagation import inject
from rdurack.workloads.program import Op, ProgramRun
from rdurack.workloads.training.job import RankReport, TrainingWorkload

# Wall seconds a heartbeat waits for the actors' answers, and GetNode for their full
# state (tier usage) once they answered: a socket busy with a long call answers its
# heartbeat at once (its control thread) but its state only when the call returns.
HEARTBEAT_TIMEOUT_S = 1.0
STATE_TIMEOUT_S = 1.0
# Wall seconds an abort or a fault hook may take (control-thread calls: milliseconds).
CONTROL_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class SocketHealth:
    socket_id: str
    healthy: bool  # its actor answered
    state: SocketState | None  # None when the actor does not answer
    error: str = ""
    dead: bool = False  # its actor died (not merely slow to answer)
    incarnation: int = 0  # grows by one each time the agent restarts the actor


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
    ) -> None:
        """`tls`: the sockets' links are mutual TLS among rack members (the files must
        be readable where the actors run: this node)."""
        if not 0 <= node_index < platform.nodes:
            raise InvalidRequest(
                f"node index {node_index} is not a node of {platform.name} "
                f"(0..{platform.nodes - 1})"
            )
        self.node_index = node_index
        self.platform = platform
        self.time_scale = time_scale
        self.host = host
        self.call_timeout_s = call_timeout_s
        self.link_timeout_s = link_timeout_s
        self.tls = tls
        self.socket_ids = [str(SocketId(node_index, i)) for i in range(platform.node.sockets)]
        self.topology = Topology(platform)
        # A new value each time the agent starts: the orchestrator tells a restarted
        # agent (whose sockets lost their jobs) from one that was only slow to answer.
        self.incarnation = uuid.uuid4().hex[:12]
        # The actor map changes when a socket is restarted, while gRPC threads use it.
        self._lock = threading.RLock()
        self._actors: dict[str, Any] = {}
        self._addresses: dict[str, str] = {}
        self._incarnations = dict.fromkeys(self.socket_ids, 0)
        self._dead: dict[str, str] = {}  # socket -> why its actor is dead
        self._clocks: dict[str, int] = {}  # socket -> last emulated clock seen, ns
        self._faults: dict[str, Fault] = {}  # id -> faults with a part on this node
        # What the actors were last told: socket -> slowdown; (src, dst) -> (down, ns).
        self._slow: dict[str, float] = {}
        self._links: dict[tuple[str, str], tuple[bool, int]] = {}
        self._tracer = trace.get_tracer(names.TRACER_NODE_AGENT)

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Start the node's socket actors on this process's Ray node; return when all
        serve their links."""
        with self._lock:
            for sid in self.socket_ids:
                self._actors[sid] = self._spawn(sid)
            actors = list(self._actors.values())
        addresses = self._get([a.address.remote() for a in actors], "start")
        with self._lock:
            self._addresses = dict(zip(self.socket_ids, addresses, strict=True))
        self.connect(self.addresses())

    def _spawn(self, socket_id: str, clock_ns: int = 0) -> Any:
        here = ray.get_runtime_context().get_node_id()
        return SocketActor.options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=here, soft=False),
        ).remote(
            socket_id,
            self.platform,
            time_scale=self.time_scale,
            host=self.host,
            timeout_s=self.link_timeout_s,
            clock_ns=clock_ns,
            tls=self.tls,
        )

    def stop(self) -> None:
        """Kill the actors this agent started (only those), once they have exported
        their spans (best effort: a dead or wedged actor does not delay this long)."""
        with self._lock:
            actors = [a for s, a in self._actors.items() if s not in self._dead]
            dead = [a for s, a in self._actors.items() if s in self._dead]
            self._actors.clear()
        flushes = [a.flush_traces.remote() for a in actors]
        if flushes:
            ray.wait(flushes, num_returns=len(flushes), timeout=5.0)
        for actor in actors + dead:
            ray.kill(actor, no_restart=True)

    def addresses(self) -> dict[str, str]:
        with self._lock:
            return dict(self._addresses)

    def connect(self, peers: dict[str, str], socket_ids: Sequence[str] | None = None) -> None:
        """Tell local sockets (`socket_ids`, default all) the link addresses of `peers`
        (its own node included). A job tells only its own sockets: another may be dead.
        On the control thread: a socket busy with another job learns them at once."""
        with self._lock:
            targets = [self._actor(s) for s in socket_ids] if socket_ids else self._alive()
        self._get([control(a, "connect").remote(peers) for a in targets], "connect")

    def _alive(self) -> list[Any]:
        return [a for s, a in self._actors.items() if s not in self._dead]

    # ------------------------------------------------------------------ status

    def heartbeat(self, timeout_s: float = HEARTBEAT_TIMEOUT_S) -> list[SocketHealth]:
        """Every socket's liveness, from its control thread (a busy socket answers): its
        job, clock and slowdown, no tier usage. A dead actor is `dead`; one that does not
        answer within `timeout_s` is unhealthy but not known dead."""
        with self._lock:
            actors = dict(self._actors)
        refs = {sid: control(a, "heartbeat").remote() for sid, a in actors.items()}
        ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=timeout_s)
        done = set(ready)
        return [self._beat(sid, refs.get(sid), done, timeout_s) for sid in self.socket_ids]

    def _beat(self, sid: str, ref: Any, done: set[Any], timeout_s: float) -> SocketHealth:
        with self._lock:
            incarnation = self._incarnations[sid]
            dead = self._dead.get(sid)
        if ref is None:  # stopped
            return SocketHealth(sid, False, None, "not started", incarnation=incarnation)
        if ref not in done:
            return SocketHealth(
                sid, False, None, f"no answer within {timeout_s:g} s", incarnation=incarnation
            )
        try:
            state: SocketState = ray.get(ref)
        except RayActorError as e:
            why = dead or f"its actor died ({type(e).__name__})"
            with self._lock:
                self._dead.setdefault(sid, why)
            return SocketHealth(sid, False, None, why, dead=True, incarnation=incarnation)
        with self._lock:
            self._clocks[sid] = state.clock_ns
        return SocketHealth(sid, True, state, incarnation=incarnation)

    def health(self) -> list[SocketHealth]:
        """`heartbeat`, with each answering socket's full state (tier usage) where it
        comes within STATE_TIMEOUT_S (a socket busy with a long call shows none)."""
        with self._lock:
            actors = dict(self._actors)
        states = {sid: a.state.remote() for sid, a in actors.items()}
        beats = self.heartbeat()
        alive = [states[b.socket_id] for b in beats if b.healthy and b.socket_id in states]
        ready, _ = ray.wait(alive, num_returns=len(alive), timeout=STATE_TIMEOUT_S)
        done = set(ready)
        out = []
        for b in beats:
            ref = states.get(b.socket_id)
            if b.healthy and ref in done:
                with contextlib.suppress(RayActorError):  # died since: the beat stands
                    b = replace(b, state=ray.get(ref))
            out.append(b)
        return out

    def abort(self, job_id: str, socket_ids: Sequence[str], reason: str) -> list[str]:
        """End the waits of `job_id`'s calls in flight on `socket_ids` at once (their
        peer died): they fail with `reason`. Returns the sockets that held the job."""
        with self._lock:
            actors = {sid: self._actor(sid) for sid in socket_ids}
        refs = {sid: control(a, "abort").remote(job_id, reason) for sid, a in actors.items()}
        ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=CONTROL_TIMEOUT_S)
        aborted = []
        for sid, ref in refs.items():
            if ref in ready:
                with contextlib.suppress(RayActorError):  # a dead socket has no wait
                    if ray.get(ref):
                        aborted.append(sid)
        return aborted

    # ------------------------------------------------------------------ jobs

    def reserve(self, job_id: str, socket_ids: Sequence[str]) -> None:
        """All of `socket_ids` for `job_id`, or none (gang reservation)."""
        done: list[str] = []
        try:
            for sid in socket_ids:
                self._get([self._actor(sid).reserve.remote(job_id)], f"reserve {sid}")
                done.append(sid)
        except RdurackError:
            self.release(job_id, done)
            raise

    def release(self, job_id: str, socket_ids: Sequence[str]) -> list[str]:
        released = self._get(
            [self._actor(sid).release.remote(job_id) for sid in socket_ids], "release"
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
    ) -> list[Run]:
        with self._tracer.start_as_current_span(
            names.SPAN_NODE_KERNEL,
            attributes={
                names.ATTR_JOB_ID: job_id,
                names.ATTR_NODE: self.node_index,
                names.ATTR_SOCKETS: list(socket_ids),
                names.ATTR_JOB_MODEL: model.name,
                names.ATTR_JOB_PHASE: phase.value,
                names.ATTR_STEPS: steps,
            },
        ):
            carrier = inject()
            refs = [
                self._actor(sid).run_kernel.remote(
                    job_id, model, phase, plan, batch, seq, group_size, steps, start_ns, carrier
                )
                for sid in socket_ids
            ]
            return self._gather(refs, f"kernel of job {job_id}", job_id, socket_ids)

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
        local = [s for s in (socket_ids or group) if s in self._actors]
        if not local:
            raise InvalidRequest(f"none of {list(group)} is a socket of node {self.node_index}")
        with self._tracer.start_as_current_span(
            names.SPAN_NODE_COLLECTIVE,
            attributes={
                names.ATTR_JOB_ID: job_id,
                names.ATTR_NODE: self.node_index,
                names.ATTR_SOCKETS: local,
                names.ATTR_COLLECTIVE_OP: op,
                names.ATTR_COLLECTIVE_TAG: tag,
                names.ATTR_GROUP_SIZE: len(group),
            },
        ):
            carrier = inject()
            refs = [
                self._actor(sid).collective.remote(
                    job_id, op, tag, list(group), carrier=carrier, **kwargs
                )
                for sid in local
            ]
            return self._gather(refs, f"collective {tag!r}", job_id, local)

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
        with self._tracer.start_as_current_span(
            names.SPAN_NODE_PROGRAM,
            attributes={
                names.ATTR_JOB_ID: job_id,
                names.ATTR_NODE: self.node_index,
                names.ATTR_SOCKETS: group,
                names.ATTR_STEPS: len(ops),
            },
        ):
            carrier = inject()
            refs = [
                self._actor(sid).run_program.remote(job_id, list(ops), group, start_ns, carrier)
                for sid in group
            ]
            return self._gather(refs, f"program of job {job_id}", job_id, group)

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
    ) -> list[RankReport]:
        """Run up to `steps` more steps on this node's ranks of a DDP job; `group` is
        every rank, across nodes, in rank order."""
        local = [s for s in socket_ids if s in self._actors]
        if not local:
            raise InvalidRequest(
                f"none of {list(socket_ids)} is a socket of node {self.node_index}"
            )
        with self._tracer.start_as_current_span(
            names.SPAN_NODE_TRAIN,
            attributes={
                names.ATTR_JOB_ID: job_id,
                names.ATTR_NODE: self.node_index,
                names.ATTR_SOCKETS: local,
                names.ATTR_STEPS: steps,
            },
        ):
            carrier = inject()
            refs = [
                self._actor(sid).train.remote(
                    job_id,
                    workload,
                    list(group),
                    platform_name=platform_name,
                    steps=steps,
                    start_ns=start_ns,
                    checkpoint_dir=checkpoint_dir,
                    loop=workload.loop,
                    carrier=carrier,
                )
                for sid in local
            ]
            return self._gather(refs, f"training of job {job_id}", job_id, local)

    # ------------------------------------------------------------------ tensors (functional)

    def put_tensor(self, job_id: str, socket_id: str, name: str, array: np.ndarray) -> None:
        self._get([self._actor(socket_id).put_tensor.remote(job_id, name, array)], "put tensor")

    def get_tensor(self, job_id: str, socket_id: str, name: str) -> np.ndarray:
        result: np.ndarray = self._get(
            [self._actor(socket_id).get_tensor.remote(job_id, name)], "get tensor"
        )[0]
        return result

    # ------------------------------------------------------------------ fault hooks

    def kill_socket(self, socket_id: str, why: str = "killed") -> None:
        """Kill a socket's actor; it stays dead until `restart_socket` (or
        `clear_faults`). Its clock is kept for the actor that replaces it."""
        with self._lock:
            actor = self._actor(socket_id)
            if socket_id in self._dead:
                raise FaultConflict(f"{socket_id} is already dead: {self._dead[socket_id]}")
        with contextlib.suppress(RayActorError, GetTimeoutError):
            state = ray.get(control(actor, "heartbeat").remote(), timeout=CONTROL_TIMEOUT_S)
            with self._lock:
                self._clocks[socket_id] = state.clock_ns
        ray.kill(actor, no_restart=True)
        with self._lock:
            self._dead[socket_id] = why

    def restart_socket(self, socket_id: str) -> None:
        """Replace a socket's actor (dead or not) by a new one: same id, fresh memory, the
        old one's last known clock, the faults in force; its node's sockets learn its new
        link address (sockets of other nodes learn it with their next job's group)."""
        with self._lock:
            old = self._actor(socket_id)
            clock = self._clocks.get(socket_id, 0)
        ray.kill(old, no_restart=True)
        actor = self._spawn(socket_id, clock)
        address = self._get([actor.address.remote()], f"restart {socket_id}")[0]
        with self._lock:
            self._actors[socket_id] = actor
            self._addresses[socket_id] = address
            self._incarnations[socket_id] += 1
            self._dead.pop(socket_id, None)
            # The new actor runs at full speed with every link up: forget what the old
            # one was told, so `_apply` tells it the faults still in force.
            self._slow.pop(socket_id, None)
            self._links = {k: v for k, v in self._links.items() if k[0] != socket_id}
            peers = dict(self._addresses)
            others = [a for s, a in self._actors.items() if s != socket_id and s not in self._dead]
        self._get([control(actor, "connect").remote(peers)], f"connect {socket_id}")
        self._get(
            [control(a, "connect").remote({socket_id: address}) for a in others],
            f"tell peers of {socket_id}",
        )
        self._apply()

    def slow_socket(self, socket_id: str, factor: float) -> None:
        self._get([control(self._actor(socket_id), "slow").remote(factor)], "slow")

    def set_link_down(self, src: str, dst: str, down: bool = True) -> None:
        self._get([control(self._actor(src), "set_link_down").remote(dst, down)], "link fault")

    # ------------------------------------------------------------------ injected faults

    def inject_fault(self, fault: Fault) -> list[str]:
        """Apply this node's part of `fault` (not KILL_AGENT: ending the process is its
        server's job); one line per change. A fault overlapping one in force on the same
        target, or killing a dead socket, is a FaultConflict."""
        if fault.kind is FaultKind.KILL_AGENT:
            raise InvalidRequest("kill-agent: the agent's process ends itself, not NodeAgent")
        if self.node_index not in fault.nodes_touched(self.topology):
            raise InvalidRequest(f"{fault.describe()}: nothing of it is on node {self.node_index}")
        with self._lock:
            if fault.id in self._faults:
                raise FaultConflict(f"fault {fault.id} is already in force on this node")
            for other in self._faults.values():
                if other.kind is fault.kind and _same_target(other, fault):
                    raise FaultConflict(
                        f"{fault.describe()}: fault {other.id} ({other.describe()}) is already "
                        "in force on the same target; heal it first"
                    )
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
            if fault_id:
                cleared = [self._faults.pop(fault_id)] if fault_id in self._faults else []
                restart = [f.sockets[0] for f in cleared if f.kind is FaultKind.KILL_SOCKET]
            else:
                cleared = list(self._faults.values())
                self._faults.clear()
                restart = sorted(self._dead)
        for sid in restart:
            self.restart_socket(sid)
        self._apply()
        return cleared, restart

    def faults(self) -> list[Fault]:
        with self._lock:
            return list(self._faults.values())

    def _apply(self) -> list[str]:
        """Bring every live actor's slowdown and outbound links to what the faults in
        force ask (the most severe slowdown; down if any fault drops a link; the sum of
        the delays), telling each only what changed."""
        with self._lock:
            slow: dict[str, float] = {}
            links: dict[tuple[str, str], tuple[bool, int]] = {}
            for f in self._faults.values():
                if f.kind is FaultKind.SLOW_SOCKET:
                    s = f.sockets[0]
                    slow[s] = max(slow.get(s, 1.0), f.slow_factor)
                elif f.kind in LINK_KINDS:
                    for src, dst in f.directed_links(self.topology):
                        if src not in self._actors:
                            continue  # the other node's direction
                        down, delay = links.get((src, dst), (False, 0))
                        if f.kind is FaultKind.DELAY_LINK:
                            delay += f.extra_latency_ns
                        else:
                            down = True
                        links[(src, dst)] = (down, delay)
            calls: list[tuple[Any, str, Any]] = []  # (ref, description, record)
            for sid, actor in self._actors.items():
                if sid in self._dead:
                    continue  # told when it is restarted
                want = slow.get(sid, 1.0)
                if self._slow.get(sid, 1.0) != want:
                    ref = control(actor, "slow").remote(want)
                    calls.append((ref, f"{sid} slowdown {want:g}", ("slow", sid, want)))
            for key in sorted(set(links) | set(self._links)):
                src, dst = key
                if src in self._dead:
                    continue
                want_down, want_ns = links.get(key, (False, 0))
                have_down, have_ns = self._links.get(key, (False, 0))
                actor = self._actors[src]
                if want_down != have_down:
                    ref = control(actor, "set_link_down").remote(dst, want_down)
                    what = f"{src} -> {dst} {'down' if want_down else 'up'}"
                    calls.append((ref, what, ("down", key, want_down)))
                if want_ns != have_ns:
                    ref = control(actor, "set_link_delay").remote(dst, want_ns)
                    calls.append((ref, f"{src} -> {dst} +{want_ns:,} ns", ("delay", key, want_ns)))
        if not calls:
            return []
        self._get([c[0] for c in calls], "apply faults", CONTROL_TIMEOUT_S)
        with self._lock:
            for _, _, (kind, key, value) in calls:
                if kind == "slow":
                    self._slow[key] = value
                    continue
                down, ns = self._links.get(key, (False, 0))
                state = (value, ns) if kind == "down" else (down, value)
                if state == (False, 0):
                    self._links.pop(key, None)
                else:
                    self._links[key] = state
        return [c[1] for c in calls]

    # ------------------------------------------------------------------ helpers

    def _actor(self, socket_id: str) -> Any:
        with self._lock:
            if socket_id not in self._actors:
                raise UnknownName(f"socket of node {self.node_index}", socket_id, self.socket_ids)
            return self._actors[socket_id]

    def _gather(
        self, refs: list[Any], what: str, job_id: str, socket_ids: Sequence[str]
    ) -> list[Any]:
        """`_get` for the parts a job's sockets run together: the first to fail aborts
        the others' waits (they would wait for its messages until their timeout), then
        its error is raised once all have returned."""
        deadline = time.monotonic() + self.call_timeout_s
        pending = list(refs)
        first: Any = None  # the first call to fail: its error is the job's
        while pending:
            ready, pending = ray.wait(
                pending, num_returns=1, timeout=max(0.0, deadline - time.monotonic())
            )
            if not ready:
                break  # the deadline: _get below says so
            failed = [r for r in ready if _failed(r)]
            if failed and first is None:
                first = failed[0]
            if failed and pending:
                sockets = [sid for sid, r in zip(socket_ids, refs, strict=True) if r in pending]
                why = f"a socket of job {job_id} on node {self.node_index} failed ({what})"
                with self._lock:
                    actors = [self._actors[s] for s in sockets if s in self._actors]
                for actor in actors:
                    control(actor, "abort").remote(job_id, why)
        left = max(0.0, deadline - time.monotonic())
        if first is not None:  # raises it (the others' errors only echo it)
            self._get([first], what, left, [socket_ids[refs.index(first)]])
        return self._get(refs, what, left, socket_ids)

    def _get(
        self,
        refs: list[Any],
        what: str,
        timeout_s: float | None = None,
        socket_ids: Sequence[str] = (),
    ) -> list[Any]:
        """ray.get with a deadline; actor failures become RdurackErrors with their cause
        (naming the dead socket when `socket_ids`, one per ref, say which it is)."""
        limit = self.call_timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + limit
        try:
            return list(ray.get(refs, timeout=max(0.0, deadline - time.monotonic())))
        except GetTimeoutError:
            raise LinkFailure(
                f"node {self.node_index}: {what} did not finish within {limit:.0f} s"
            ) from None
        except RayTaskError as e:
            cause = e.cause if isinstance(e.cause, BaseException) else None
            if isinstance(cause, RdurackError):
                raise cause from None
            raise LinkFailure(f"node {self.node_index}: {what} failed: {e.cause!r}") from None
        except RayActorError as e:
            dead = [s for s, r in zip(socket_ids, refs, strict=False) if _died(r)]
            which = f"socket actor {', '.join(dead)} is" if dead else "a socket actor is"
            raise LinkFailure(
                f"node {self.node_index}: {what}: {which} dead ({type(e).__name__})"
            ) from None


def _died(ref: Any) -> bool:
    """A call whose actor died (it cannot answer)."""
    try:
        ray.get(ref, timeout=0)
    except RayActorError:
        return True
    except (RayTaskError, GetTimeoutError):
        return False
    return False


def _failed(ref: Any) -> bool:
    """A finished call that raised (or whose actor died)."""
    try:
        ray.get(ref, timeout=0)
    except (RayTaskError, RayActorError):
        return True
    return False


def _same_target(a: Fault, b: Fault) -> bool:
    """Two faults of one kind on the same socket, link (either way round) or nodes."""
    return set(a.sockets) == set(b.sockets) and set(a.nodes) == set(b.nodes)


def start_rack(platform: PlatformSpec, **options: Any) -> list[NodeAgent]:
    """Start an agent for every node of `platform` in this process (in parallel), and
    give every socket the link addresses of all the others. `options` go to NodeAgent.
    This is how tests and benchmarks build a whole rack on one machine."""
    agents = [NodeAgent(i, platform, **options) for i in range(platform.nodes)]
    errors: list[BaseException] = []

    def start(agent: NodeAgent) -> None:
        try:
            agent.start()
        except BaseException as e:  # re-raised below, after every thread ended
            errors.append(e)

    threads = [threading.Thread(target=start, args=(a,)) for a in agents]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        for a in agents:
            a.stop()
        raise errors[0]
    peers = {sid: addr for a in agents for sid, addr in a.addresses().items()}
    for a in agents:
        a.connect(peers)
    return agents
