"""The orchestrator's health watcher: node agents and socket actors, by heartbeat.

A plain class with one thread. Every `interval_s` it asks each agent for a heartbeat
(NodeGateway.heartbeat, with a deadline of `timeout_s`) and decides:

- an agent that has not answered for `dead_after_s` is down, and so are its sockets;
- a socket whose actor is dead (Ray said so) is down at once; one that does not answer
  is down once it has not answered for `dead_after_s`, but only *suspect*: a socket
  busy on a loaded machine may be slow to answer too, so the jobs it runs are left to
  their own deadlines (`Change.lost` is False), and it only takes no new work;
- an agent or socket that answers again is up; a new incarnation (a restarted agent or
  socket actor) is up, and `restarted`: whatever ran on the old one is lost.

So a dead agent is noticed within dead_after_s + interval_s + timeout_s (2 + 0.5 + 2 s
by default: under the 5 s the rack promises; an agent that refuses connections, as a
dead process's port does, within dead_after_s + interval_s) and a dead socket actor
within interval_s + timeout_s. The agent waits at most 1 s for its actors
(node_agent/agent.py), less than `timeout_s`, so slow actors do not make a live agent
look silent. Every change is reported to `on_change`; the orchestrator fails the jobs
that a lost socket or agent ran, and the scheduler keeps down sockets out of
placements.

Times: `wall` (time.time, s) for the instants it reports, `monotonic` (s) for deadlines.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from rdurack.errors import RdurackError
from rdurack.orchestrator.gateway import NodeBeat, NodeGateway
from rdurack.rack.spec import PlatformSpec
from rdurack.rack.topology import SocketId, Topology

log = logging.getLogger(__name__)

INTERVAL_S = 0.5
TIMEOUT_S = 2.0
DEAD_AFTER_S = 2.0


@dataclass(frozen=True)
class Health:
    healthy: bool
    since_s: float  # wall clock of the last change, s
    reason: str = ""  # why it is down; or what last changed ("restarted")


@dataclass(frozen=True)
class Change:
    """A node (socket_id "") or a socket that went down, came back, or was restarted."""

    node: int
    socket_id: str
    healthy: bool
    restarted: bool
    reason: str
    suspect: bool = False  # down because it did not answer, not known dead

    @property
    def what(self) -> str:
        return self.socket_id or f"node {self.node}'s agent"

    @property
    def lost(self) -> bool:
        """What ran there is lost: it died, its agent is down, or it was restarted."""
        return self.restarted or (not self.healthy and not self.suspect)


@dataclass
class _Track:
    """What the watcher knows of one node or socket."""

    health: Health
    last_ok: float | None = None  # monotonic s of the last good answer
    incarnation: str | int | None = None
    trouble_at: float = float("-inf")  # monotonic s it last went down or restarted


@dataclass
class _State:
    nodes: dict[int, _Track] = field(default_factory=dict)
    sockets: dict[str, _Track] = field(default_factory=dict)


class HealthWatcher:
    def __init__(
        self,
        gateway: NodeGateway,
        platform: PlatformSpec,
        *,
        interval_s: float = INTERVAL_S,
        timeout_s: float = TIMEOUT_S,
        dead_after_s: float = DEAD_AFTER_S,
        on_change: Callable[[list[Change]], None] | None = None,
        wall: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.gateway = gateway
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.dead_after_s = dead_after_s
        self.on_change = on_change
        self._wall = wall
        self._mono = monotonic
        self._topology = Topology(platform)
        self._node_sockets: dict[int, list[str]] = {}
        for s in self._topology.sockets:
            self._node_sockets.setdefault(s.node, []).append(str(s))
        # Until the first answer, everything counts as up (since the watcher started):
        # the scheduler is not held back by a watcher that has not looked yet.
        now_wall, now = wall(), monotonic()
        up = Health(True, now_wall, "not heard from yet")
        self._state = _State(
            {n: _Track(up, now) for n in self._node_sockets},
            {s: _Track(up, now) for ids in self._node_sockets.values() for s in ids},
        )
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._pool = ThreadPoolExecutor(
            max_workers=max(1, len(self._node_sockets)), thread_name_prefix="heartbeat"
        )

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="health", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _loop(self) -> None:
        while not self._stop.is_set():
            began = self._mono()
            try:
                self.poll_once()
            except Exception:  # the watcher must survive anything; the next round retries
                log.exception("health round failed")
            self._stop.wait(max(0.0, self.interval_s - (self._mono() - began)))

    # ------------------------------------------------------------------ one round

    def poll_once(self) -> list[Change]:
        """Ask every agent at once; apply what they say; report the changes (also to
        `on_change`)."""
        futures = {n: self._pool.submit(self._ask, n) for n in sorted(self._node_sockets)}
        answers = {n: f.result() for n, f in futures.items()}
        changes: list[Change] = []
        with self._lock:
            for node, answer in answers.items():
                if isinstance(answer, NodeBeat):
                    changes += self._answered(node, answer)
                else:
                    changes += self._silent(node, answer)
        if changes:
            for c in changes:
                state = "restarted" if c.restarted else "up" if c.healthy else "down"
                log.warning("health: %s %s: %s", c.what, state, c.reason)
            if self.on_change is not None:
                self.on_change(changes)
        return changes

    def _ask(self, node: int) -> NodeBeat | str:
        try:
            return self.gateway.heartbeat(node, self.timeout_s)
        except RdurackError as e:
            return str(e)

    def _answered(self, node: int, beat: NodeBeat) -> list[Change]:
        now = self._mono()
        track = self._state.nodes[node]
        changes: list[Change] = []
        restarted = track.incarnation is not None and track.incarnation != beat.incarnation
        if restarted:
            why = "agent restarted: its sockets are new, the jobs they ran are lost"
            changes.append(self._set(track, node, "", True, why, now, restarted=True))
        elif not track.health.healthy:
            changes.append(self._set(track, node, "", True, "agent answers again", now))
        track.incarnation = beat.incarnation
        track.last_ok = now
        for s in beat.sockets:
            st = self._state.sockets.get(s.socket_id)
            if st is None:
                continue  # not a socket of this rack: the agent's problem, not ours
            if restarted:
                st.incarnation = None  # a new agent: its sockets start a new history
            if s.state == "healthy":
                renewed = st.incarnation is not None and st.incarnation != s.incarnation
                if renewed and not restarted:
                    why = "socket actor restarted: the job it ran is lost"
                    changes.append(self._set(st, node, s.socket_id, True, why, now, True))
                elif not st.health.healthy:
                    changes.append(self._set(st, node, s.socket_id, True, "answers again", now))
                st.incarnation = s.incarnation
                st.last_ok = now
            elif s.state == "dead":
                if st.health.healthy:
                    why = f"socket actor dead: {s.error or 'its actor is gone'}"
                    changes.append(self._set(st, node, s.socket_id, False, why, now))
                st.incarnation = s.incarnation
            elif st.health.healthy and now - (st.last_ok or now) > self.dead_after_s:
                why = (
                    f"no heartbeat for {self.dead_after_s:g} s ({s.error or 'no answer'}): "
                    "busy or wedged; it takes no new work until it answers"
                )
                changes.append(self._set(st, node, s.socket_id, False, why, now, suspect=True))
        return changes

    def _silent(self, node: int, error: str) -> list[Change]:
        now = self._mono()
        track = self._state.nodes[node]
        if not track.health.healthy or now - (track.last_ok or now) <= self.dead_after_s:
            return []
        why = f"agent unreachable for {self.dead_after_s:g} s: {error}"
        return [self._set(track, node, "", False, why, now)]

    def _set(
        self,
        track: _Track,
        node: int,
        socket_id: str,
        healthy: bool,
        reason: str,
        now: float,
        restarted: bool = False,
        suspect: bool = False,
    ) -> Change:
        track.health = Health(healthy, self._wall(), reason)
        change = Change(node, socket_id, healthy, restarted, reason, suspect)
        if change.lost:
            track.trouble_at = now
        return change

    # ------------------------------------------------------------------ what it knows

    def node(self, index: int) -> Health:
        with self._lock:
            return self._state.nodes[index].health

    def socket(self, socket_id: str) -> Health:
        """A socket's own health, or its node's when the node is down."""
        with self._lock:
            node = self._state.nodes[SocketId.parse(socket_id).node].health
            own = self._state.sockets[socket_id].health
        return own if node.healthy else Health(False, node.since_s, node.reason)

    def unhealthy(self) -> set[str]:
        """Sockets the scheduler must not place: down, or on a node that is down."""
        with self._lock:
            down = {s for s, t in self._state.sockets.items() if not t.health.healthy}
            for n, t in self._state.nodes.items():
                if not t.health.healthy:
                    down |= set(self._node_sockets[n])
        return down

    def trouble_since(self, sockets: Collection[str], since: float) -> str | None:
        """Why, if any of `sockets` (or their nodes) was lost (died or was restarted) at
        or after monotonic time `since` (a job that started then lost its run); else
        None."""
        with self._lock:
            for sid in sorted(sockets):
                node = SocketId.parse(sid).node
                for t, what in (
                    (self._state.nodes[node], f"node {node}'s agent"),
                    (self._state.sockets[sid], sid),
                ):
                    if t.trouble_at >= since:
                        return f"{what}: {t.health.reason}"
        return None

    def monotonic(self) -> float:
        return self._mono()
