"""Fault injection on the rack, as rdurack.v1.AdminService asks it: validate a fault,
forward each node's part through the NodeGateway, heal, list.

The node agents hold the faults in force (a restarted agent starts without any); this
class holds only the agents it killed, until they come back (answer a heartbeat with a
new incarnation). docs/faults.md tells what each fault does to the jobs it hits.
"""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from collections.abc import Callable

from rdurack.errors import LinkFailure, RdurackError, UnknownName
from rdurack.orchestrator.gateway import NodeGateway
from rdurack.rack.faults import Fault, FaultConflict, FaultKind, make_fault
from rdurack.rack.spec import PlatformSpec
from rdurack.rack.topology import Topology

# Wall seconds to wait for an agent's heartbeat when checking it is up (or back).
PROBE_TIMEOUT_S = 2.0


def new_fault_id() -> str:
    return f"f-{uuid.uuid4().hex[:8]}"


class FaultInjector:
    def __init__(
        self,
        gateway: NodeGateway,
        platform: PlatformSpec,
        *,
        wall: Callable[[], float] = time.time,
        new_id: Callable[[], str] = new_fault_id,
    ) -> None:
        self.gateway = gateway
        self.platform = platform
        self.topology = Topology(platform)
        self._wall = wall
        self._new_id = new_id
        self._lock = threading.Lock()
        # node -> (its kill-agent fault, the agent incarnation that was killed)
        self._killed: dict[int, tuple[Fault, str]] = {}

    def inject(
        self,
        kind: FaultKind,
        *,
        sockets: tuple[str, ...] = (),
        nodes: tuple[int, ...] = (),
        slow_factor: float = 1.0,
        extra_latency_ns: int = 0,
    ) -> Fault:
        """Validate the fault and apply it on every node it touches, all or none."""
        fault = make_fault(
            kind,
            self.topology,
            fault_id=self._new_id(),
            sockets=sockets,
            nodes=nodes,
            slow_factor=slow_factor,
            extra_latency_ns=extra_latency_ns,
            injected_s=self._wall(),
        )
        if kind is FaultKind.KILL_AGENT:
            return self._kill_agent(fault)
        done: list[int] = []
        try:
            for node in fault.nodes_touched(self.topology):
                self.gateway.inject_fault(node, fault)
                done.append(node)
        except RdurackError:
            for node in done:
                with contextlib.suppress(RdurackError):
                    self.gateway.clear_faults(node, fault.id)
            raise
        return fault

    def _kill_agent(self, fault: Fault) -> Fault:
        node = fault.nodes[0]
        self._forget_returned()
        with self._lock:
            if node in self._killed:
                earlier = self._killed[node][0]
                raise FaultConflict(
                    f"node {node}'s agent was killed by fault {earlier.id} and is not back yet"
                )
        beat = self.gateway.heartbeat(node, PROBE_TIMEOUT_S)  # LinkFailure: already down
        self.gateway.inject_fault(node, fault)
        with self._lock:
            self._killed[node] = (fault, beat.incarnation)
        return fault

    def heal(self, fault_id: str = "") -> tuple[list[Fault], list[str]]:
        """End `fault_id`, or (empty) every fault on every agent that answers, restarting
        dead socket actors. Returns the faults ended and the sockets restarted. A killed
        agent's fault ends when the agent is back; healing it before is a FaultConflict."""
        self._forget_returned()
        with self._lock:
            killed = {f.id: f for f, _ in self._killed.values()}
        if fault_id in killed:
            raise FaultConflict(
                f"{fault_id} ({killed[fault_id].describe()}): a killed agent comes back when "
                "its supervisor restarts it (Kubernetes restarts the pod; on a local rack "
                "`rdu fault heal` restarts it); its fault ends then"
            )
        if fault_id:
            known = {f.id: f for f in self.list()}
            if fault_id not in known:
                raise UnknownName("fault", fault_id, sorted(known))
            nodes = known[fault_id].nodes_touched(self.topology)
        else:
            nodes = list(range(self.platform.nodes_total))
        healed: dict[str, Fault] = {}
        restarted: list[str] = []
        silent: list[str] = []
        for node in nodes:
            try:
                cleared, again = self.gateway.clear_faults(node, fault_id)
            except LinkFailure as e:
                silent.append(str(e))
                continue
            for f in cleared:
                healed.setdefault(f.id, f)
            restarted += again
        if silent and fault_id:
            # Its part on an agent that does not answer stays (if the agent comes back
            # without restarting): say so rather than claim it healed.
            raise LinkFailure(
                f"{fault_id} ended where agents answer; not on: {'; '.join(silent)}; "
                "heal it again once they are back"
            )
        return sorted(healed.values(), key=lambda f: f.injected_s), restarted

    def list(self) -> list[Fault]:
        """The faults in force: those the agents that answer hold (a fault on two nodes
        once), and the killed agents not back yet."""
        self._forget_returned()
        merged: dict[str, Fault] = {}
        for node in range(self.platform.nodes_total):
            try:
                faults = self.gateway.faults(node)
            except RdurackError:
                continue  # a node that does not answer: its kill, if ours, is listed below
            for f in faults:
                merged.setdefault(f.id, f)
        with self._lock:
            merged.update({f.id: f for f, _ in self._killed.values()})
        return sorted(merged.values(), key=lambda f: f.injected_s)

    def _forget_returned(self) -> None:
        """Drop the kill-agent faults of agents that answer again as a new incarnation."""
        with self._lock:
            killed = dict(self._killed)
        for node, (_, incarnation) in killed.items():
            try:
                beat = self.gateway.heartbeat(node, PROBE_TIMEOUT_S)
            except RdurackError:
                continue
            if beat.incarnation != incarnation:
                with self._lock:
                    self._killed.pop(node, None)
