"""A node agent: the 8 socket actors of one rack node, started on its own Ray node.

A plain class; services/node_agent_service.py serves it as rdurack.v1.NodeAgentService.
Every call to an actor has a deadline, so a dead or wedged socket shows up as a clear
error, never as a hang.

Calls that drive sockets (run_kernel, collective) open a span, child of the current
one (the RPC's server span), and give the actors its context as an explicit carrier.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import ray
from opentelemetry import trace
from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from rdurack.node_agent.actors import SocketActor
from rdurack.node_agent.socket import Run, SocketState
from rdurack.rack.errors import InvalidRequest, LinkFailure, RdurackError, UnknownName
from rdurack.rack.kernels import FusionPlan, Phase
from rdurack.rack.models import ModelSpec
from rdurack.rack.spec import PlatformSpec
from rdurack.rack.topology import SocketId
from rdurack.security.tls import TlsConfig
from rdurack.telemetry import names
from rdurack.telemetry.propagation import inject
from rdurack.workloads.program import Op, ProgramRun
from rdurack.workloads.training.job import RankReport, TrainingWorkload


@dataclass(frozen=True)
class SocketHealth:
    socket_id: str
    healthy: bool
    state: SocketState | None  # None when the actor does not answer
    error: str = ""


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
        self._actors: dict[str, Any] = {}
        self._addresses: dict[str, str] = {}
        self._tracer = trace.get_tracer(names.TRACER_NODE_AGENT)

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Start the node's socket actors on this process's Ray node; return when all
        serve their links."""
        here = ray.get_runtime_context().get_node_id()
        for sid in self.socket_ids:
            self._actors[sid] = SocketActor.options(
                scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=here, soft=False),
            ).remote(
                sid,
                self.platform,
                time_scale=self.time_scale,
                host=self.host,
                timeout_s=self.link_timeout_s,
                tls=self.tls,
            )
        addresses = self._get([a.address.remote() for a in self._actors.values()], "start")
        self._addresses = dict(zip(self.socket_ids, addresses, strict=True))
        self.connect(self._addresses)

    def stop(self) -> None:
        """Kill the actors this agent started (only those), once they have exported
        their spans (best effort: a dead or wedged actor does not delay this long)."""
        flushes = [a.flush_traces.remote() for a in self._actors.values()]
        if flushes:
            ray.wait(flushes, num_returns=len(flushes), timeout=5.0)
        for actor in self._actors.values():
            ray.kill(actor, no_restart=True)
        self._actors.clear()

    def addresses(self) -> dict[str, str]:
        return dict(self._addresses)

    def connect(self, peers: dict[str, str], socket_ids: Sequence[str] | None = None) -> None:
        """Tell local sockets (`socket_ids`, default all) the link addresses of `peers`
        (its own node included). A job tells only its own sockets: another may be dead."""
        targets = [self._actor(s) for s in socket_ids] if socket_ids else self._actors.values()
        self._get([a.connect.remote(peers) for a in targets], "connect")

    # ------------------------------------------------------------------ status

    def health(self) -> list[SocketHealth]:
        refs = {sid: a.state.remote() for sid, a in self._actors.items()}
        ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=5.0)
        done = set(ready)
        out = []
        for sid in self.socket_ids:
            ref = refs.get(sid)
            if ref is None or ref not in done:
                out.append(SocketHealth(sid, False, None, "no answer within 5 s"))
                continue
            try:
                out.append(SocketHealth(sid, True, ray.get(ref)))
            except RayActorError as e:
                out.append(SocketHealth(sid, False, None, f"actor died: {type(e).__name__}"))
        return out

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
            return self._get(refs, f"kernel of job {job_id}")

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
            return self._get(refs, f"collective {tag!r}")

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
            return self._get(refs, f"program of job {job_id}")

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
            return self._get(refs, f"training of job {job_id}")

    # ------------------------------------------------------------------ tensors (functional)

    def put_tensor(self, job_id: str, socket_id: str, name: str, array: np.ndarray) -> None:
        self._get([self._actor(socket_id).put_tensor.remote(job_id, name, array)], "put tensor")

    def get_tensor(self, job_id: str, socket_id: str, name: str) -> np.ndarray:
        result: np.ndarray = self._get(
            [self._actor(socket_id).get_tensor.remote(job_id, name)], "get tensor"
        )[0]
        return result

    # ------------------------------------------------------------------ fault hooks

    def kill_socket(self, socket_id: str) -> None:
        ray.kill(self._actor(socket_id), no_restart=True)

    def slow_socket(self, socket_id: str, factor: float) -> None:
        self._get([self._actor(socket_id).slow.remote(factor)], "slow")

    def set_link_down(self, src: str, dst: str, down: bool = True) -> None:
        self._get([self._actor(src).set_link_down.remote(dst, down)], "link fault")

    # ------------------------------------------------------------------ helpers

    def _actor(self, socket_id: str) -> Any:
        if socket_id not in self._actors:
            raise UnknownName(f"socket of node {self.node_index}", socket_id, self.socket_ids)
        return self._actors[socket_id]

    def _get(self, refs: list[Any], what: str) -> list[Any]:
        """ray.get with a deadline; actor failures become RdurackErrors with their cause."""
        deadline = time.monotonic() + self.call_timeout_s
        try:
            return list(ray.get(refs, timeout=max(0.0, deadline - time.monotonic())))
        except GetTimeoutError:
            raise LinkFailure(
                f"node {self.node_index}: {what} did not finish within {self.call_timeout_s:.0f} s"
            ) from None
        except RayTaskError as e:
            cause = e.cause if isinstance(e.cause, BaseException) else None
            if isinstance(cause, RdurackError):
                raise cause from None
            raise LinkFailure(f"node {self.node_index}: {what} failed: {e.cause!r}") from None
        except RayActorError as e:
            raise LinkFailure(
                f"node {self.node_index}: {what}: a socket actor is dead ({type(e).__name__})"
            ) from None


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
