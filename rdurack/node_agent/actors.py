"""Socket actors: the one place that turns the plain Socket class into a Ray actor,
and one node's set of them (NodeActors).

num_cpus=0: sixteen sockets share the host's cores; each actor is mostly waiting on its
links. One call runs at a time, so a socket's state needs no locks; its gRPC link
server runs on its own threads and only touches the thread-safe mailbox.

The exception is the CONTROL concurrency group, one more thread: the calls that must
answer while the socket is busy with a long call (a training segment). Its methods
(CONTROL_METHODS) only read attributes or touch lock-protected link state and the
mailbox: a heartbeat, aborting a job's waits, fault hooks, learning peer addresses.
Callers pick it per call: `actor.heartbeat.options(concurrency_group=CONTROL)`.

Each actor is its own process: it configures tracing on construction, with its socket
id as service.name (one Jaeger lane per socket).

NodeActors holds one node's actors for its agent: it starts them on the agent's own Ray
node, kills and replaces them, and knows what is known of each (dead or not and why,
incarnation, link address, last emulated clock seen, liveness from heartbeats).
`start_ray` joins (or starts) the Ray cluster.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import Any

import ray
from ray.exceptions import GetTimeoutError, RayActorError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from rdurack.errors import UnknownName
from rdurack.node_agent import heap, ray_calls
from rdurack.node_agent.health import SocketHealth
from rdurack.node_agent.ray_calls import CONTROL_TIMEOUT_S, HEARTBEAT_TIMEOUT_S, STATE_TIMEOUT_S
from rdurack.node_agent.runs import SocketState
from rdurack.node_agent.socket import Socket
from rdurack.rack.faults import FaultConflict
from rdurack.telemetry import setup


class TracedSocket(Socket):
    """A Socket in its own actor process, which it configures tracing for."""

    def __init__(self, socket_id: str, *args: Any, **kwargs: Any) -> None:
        heap.keep_freed_buffers()  # the process is this socket's: its links' buffers
        setup.configure(socket_id, env_name_wins=False)
        super().__init__(socket_id, *args, **kwargs)

    def flush_traces(self, timeout_ms: int = 5000) -> bool:
        """Export queued spans now (the agent calls it before killing the actor, which
        runs no exit handlers)."""
        return setup.flush(timeout_ms)


CONTROL = "control"
CONTROL_METHODS = frozenset(
    {"heartbeat", "abort", "slow", "set_link_down", "set_link_delay", "connect"}
)
# max_restarts=0: a dead actor stays dead until its agent restarts it (docs/faults.md).
# Ray's typing stubs do not list concurrency_groups, which ray.remote accepts.
_remote: Any = ray.remote
SocketActor: Any = _remote(num_cpus=0, max_restarts=0, concurrency_groups={CONTROL: 1})(
    TracedSocket
)


def control(actor: Any, method: str) -> Any:
    """`actor.method` on the CONTROL thread (it answers while the socket is busy)."""
    if method not in CONTROL_METHODS:
        raise ValueError(f"{method} is not a control method: {sorted(CONTROL_METHODS)}")
    return getattr(actor, method).options(concurrency_group=CONTROL)


# Addresses that name every interface, hence no one Ray node (`start_ray`'s `host`).
WILDCARD_HOSTS = frozenset({"", "0.0.0.0", "::", "[::]"})


def start_ray(address: str | None = None, host: str | None = None) -> None:
    """Join the Ray cluster at `address`, or start a local one. Its processes stay on
    loopback because importing rdurack set Ray's environment (rdurack/__init__.py),
    unless `host` says otherwise.

    `host`: the address this process serves on, hence of its host's Ray node. Joining,
    the process attaches to the node of that address. Without it Ray picks a raylet it
    finds in the process list, preferring the head's: on one machine with several
    network namespaces (one pid namespace) every host's raylet is listed, and an agent
    would put its socket actors on the head's host, where its address does not exist.
    Starting, the new cluster's node takes that address: on any other than loopback,
    Ray serves on every interface of the machine (it has no bind address of its own).
    A wildcard (WILDCARD_HOSTS) or None leaves the choice to Ray."""
    if ray.is_initialized():
        return
    node_ip = None if host is None or host in WILDCARD_HOSTS else host
    if address:
        ray.init(
            address=address,
            namespace="rdurack",
            logging_level=logging.WARNING,
            _node_ip_address=node_ip,
        )
    else:
        ray.init(
            # "local": always a new cluster. Without it Ray joins whatever cluster
            # /tmp/ray/ray_current_cluster names (a user's `ray start`, or a dead one).
            address="local",
            namespace="rdurack",
            include_dashboard=False,
            logging_level=logging.WARNING,
            log_to_driver=False,
            _node_ip_address=node_ip,
        )


class NodeActors:
    """The socket actors of one rack node; thread-safe (gRPC threads read it while a
    socket is being replaced)."""

    def __init__(
        self, node_index: int, socket_ids: Sequence[str], call_timeout_s: float, **options: Any
    ) -> None:
        """`options`: Socket's arguments for every actor but its id and clock."""
        self.node_index = node_index
        self.socket_ids = list(socket_ids)
        self.call_timeout_s = call_timeout_s
        self._options = options
        self._lock = threading.RLock()
        self._actors: dict[str, Any] = {}
        self._addresses: dict[str, str] = {}
        self._incarnations = dict.fromkeys(self.socket_ids, 0)
        self._dead: dict[str, str] = {}  # socket -> why its actor is dead
        self._clocks: dict[str, int] = {}  # socket -> last emulated clock seen, ns

    def get(
        self,
        refs: list[Any],
        what: str,
        timeout_s: float | None = None,
        socket_ids: Sequence[str] = (),
    ) -> list[Any]:
        """ray_calls.get within `timeout_s` (default call_timeout_s)."""
        limit = self.call_timeout_s if timeout_s is None else timeout_s
        return ray_calls.get(refs, what, self.node_index, limit, socket_ids)

    # ------------------------------------------------------------------ lookups

    def actor(self, socket_id: str) -> Any:
        with self._lock:
            if socket_id not in self._actors:
                raise UnknownName(f"socket of node {self.node_index}", socket_id, self.socket_ids)
            return self._actors[socket_id]

    def here(self, socket_ids: Iterable[str]) -> list[str]:
        """Those of `socket_ids` that are this node's started sockets, in order."""
        with self._lock:
            return [s for s in socket_ids if s in self._actors]

    def handles(self, socket_ids: Iterable[str]) -> list[Any]:
        """The actors of those of `socket_ids` that are here, dead or not."""
        with self._lock:
            return [self._actors[s] for s in socket_ids if s in self._actors]

    def alive(self) -> dict[str, Any]:
        """Socket id -> actor of every started socket not known dead, in order."""
        with self._lock:
            return {s: a for s, a in self._actors.items() if s not in self._dead}

    def dead(self) -> dict[str, str]:
        """Socket id -> why its actor is dead."""
        with self._lock:
            return dict(self._dead)

    def addresses(self) -> dict[str, str]:
        with self._lock:
            return dict(self._addresses)

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Start every socket's actor; return when all serve their links."""
        with self._lock:
            for sid in self.socket_ids:
                self._actors[sid] = self._spawn(sid)
            actors = list(self._actors.values())
        addresses = self.get([a.address.remote() for a in actors], "start")
        with self._lock:
            self._addresses = dict(zip(self.socket_ids, addresses, strict=True))

    def _spawn(self, socket_id: str, clock_ns: int = 0) -> Any:
        """A new actor on this process's Ray node (the agent's)."""
        here = ray.get_runtime_context().get_node_id()
        return SocketActor.options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=here, soft=False),
        ).remote(socket_id, clock_ns=clock_ns, **self._options)

    def stop(self) -> None:
        """Kill every actor (only these), once they have exported their spans (best
        effort: a dead or wedged actor does not delay this long)."""
        with self._lock:
            actors = [a for s, a in self._actors.items() if s not in self._dead]
            dead = [a for s, a in self._actors.items() if s in self._dead]
            self._actors.clear()
        flushes = [a.flush_traces.remote() for a in actors]
        if flushes:
            ray.wait(flushes, num_returns=len(flushes), timeout=5.0)
        for actor in actors + dead:
            ray.kill(actor, no_restart=True)

    def kill(self, socket_id: str, why: str) -> None:
        """Kill a socket's actor, keeping its clock for the one that replaces it; it is
        dead for `why` until `replace`. FaultConflict if it is dead already."""
        with self._lock:
            actor = self.actor(socket_id)
            if socket_id in self._dead:
                raise FaultConflict(f"{socket_id} is already dead: {self._dead[socket_id]}")
        with contextlib.suppress(RayActorError, GetTimeoutError):
            state = ray.get(control(actor, "heartbeat").remote(), timeout=CONTROL_TIMEOUT_S)
            with self._lock:
                self._clocks[socket_id] = state.clock_ns
        ray.kill(actor, no_restart=True)
        with self._lock:
            self._dead[socket_id] = why

    def replace(self, socket_id: str) -> tuple[Any, str, list[Any]]:
        """Kill a socket's actor (dead or not) and start a new one from its last known
        clock: the new actor, its link address and the node's other live actors."""
        with self._lock:
            old = self.actor(socket_id)
            clock = self._clocks.get(socket_id, 0)
        ray.kill(old, no_restart=True)
        actor = self._spawn(socket_id, clock)
        address = self.get([actor.address.remote()], f"restart {socket_id}")[0]
        with self._lock:
            self._actors[socket_id] = actor
            self._addresses[socket_id] = address
            self._incarnations[socket_id] += 1
            self._dead.pop(socket_id, None)
            others = [a for s, a in self._actors.items() if s != socket_id and s not in self._dead]
        return actor, address, others

    # ------------------------------------------------------------------ liveness

    def heartbeat(self, timeout_s: float = HEARTBEAT_TIMEOUT_S) -> list[SocketHealth]:
        """Every socket's liveness, from its control thread (a busy socket answers): its
        job, clock and slowdown, no tier usage. A dead actor is `dead`; one that does not
        answer within `timeout_s` is unhealthy but not known dead."""
        with self._lock:
            actors = dict(self._actors)
        refs = {sid: control(a, "heartbeat").remote() for sid, a in actors.items()}
        got = ray_calls.answers(refs, timeout_s)
        return [self._beat(sid, sid in refs, got.get(sid), timeout_s) for sid in self.socket_ids]

    def _beat(self, sid: str, started: bool, answer: Any, timeout_s: float) -> SocketHealth:
        """One socket's health from its heartbeat's `answer` (ray_calls.answers)."""
        with self._lock:
            incarnation = self._incarnations[sid]
            dead = self._dead.get(sid)
        if not started:  # stopped
            return SocketHealth(sid, False, None, "not started", incarnation=incarnation)
        if answer is None:
            return SocketHealth(
                sid, False, None, f"no answer within {timeout_s:g} s", incarnation=incarnation
            )
        if isinstance(answer, RayActorError):
            why = dead or f"its actor died ({type(answer).__name__})"
            with self._lock:
                self._dead.setdefault(sid, why)
            return SocketHealth(sid, False, None, why, dead=True, incarnation=incarnation)
        state: SocketState = answer
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
        alive = {
            b.socket_id: states[b.socket_id] for b in beats if b.healthy and b.socket_id in states
        }
        got = ray_calls.answers(alive, STATE_TIMEOUT_S)
        out = []
        for b in beats:
            state = got.get(b.socket_id)
            if state is not None and not isinstance(state, RayActorError):  # else: died since
                b = replace(b, state=state)  # (the beat stands)
            out.append(b)
        return out
