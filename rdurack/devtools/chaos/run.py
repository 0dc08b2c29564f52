"""A chaos run on a running rack (`ChaosRun`): a submitter sends the plan's jobs while
the plan's faults are injected through AdminService at their instants and healed after
their while; then everything is healed, the jobs get time to finish, and the job store
is audited (report.py).

A fault that cannot be injected then (its target is already down) is recorded as
skipped. A killed node agent is started again as its supervisor would
(`local_rack.restart_agent`); a killed socket or agent is timed until GetRack shows it
down (the health watcher's detection time).
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import grpc

from rdurack.api.retry import IDEMPOTENT, SUBMIT_JOB
from rdurack.api.server import channel
from rdurack.client.admin import AdminClient, wait_healthy
from rdurack.devtools.chaos.plan import ChaosConfig, PlannedFault, job_specs, plan
from rdurack.devtools.chaos.report import ChaosReport, FaultRecord, audit
from rdurack.errors import RdurackError
from rdurack.processes import local_rack
from rdurack.rack.faults import FaultKind
from rdurack.v1 import common_pb2, job_pb2, job_pb2_grpc, rack_pb2, rack_pb2_grpc

RPC_TIMEOUT_S = 30.0
# A submission whose deadline passed is sent again (its request id makes it count once),
# this many times in all: gRPC's own retries (UNAVAILABLE) end at the call's deadline.
SUBMIT_ATTEMPTS = 5
DETECT_WAIT_S = 15.0  # how long the run looks for a killed target to show down
AGENT_BACK_S = 60.0  # how long a restarted agent may take to show healthy
HEAL_RESERVE_S = 15.0  # kept after the fault window to heal everything


@dataclass(frozen=True)
class Rack:
    """A running local rack: where its orchestrator serves, its bearer token (an admin
    tenant's; "" on the open local default), its state dir (job store, rack.json)."""

    address: str
    token: str
    state_dir: Path


class ChaosRun:
    """One chaos run on `rack` (the module docstring); `run` does it all, `close` ends
    its channel."""

    def __init__(self, rack: Rack, config: ChaosConfig, say: Callable[[str], None] = print) -> None:
        self.rack = rack
        self.config = config
        self.say = say
        # Every submission carries a client request id: SubmitJob may be sent again too.
        self._channel = channel(
            rack.address, token=rack.token or None, retried={*IDEMPOTENT, SUBMIT_JOB}
        )
        self._jobs = job_pb2_grpc.JobServiceStub(self._channel)
        self._racks = rack_pb2_grpc.RackServiceStub(self._channel)
        self._admin = AdminClient(self._channel)
        self._ids: list[str] = []
        self._refused: list[str] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()

    def close(self) -> None:
        self._channel.close()

    def run(self, deadline: float) -> ChaosReport:
        """The workload and the faults until the window ends, then heal, settle and
        audit; everything ends by `deadline` (monotonic s)."""
        began = time.monotonic()
        window = max(5.0, deadline - began - self.config.settle_s - HEAL_RESERVE_S)
        count = self.config.faults if self.config.faults is not None else max(1, int(window / 8))
        faults = plan(
            self.config.seed, self.config.nodes, self.config.sockets_per_node, window, count
        )
        report = ChaosReport(self.config.seed, window)
        self.say(f"chaos: seed {self.config.seed}; {len(faults)} faults in {window:.0f} s:")
        for f in faults:
            self.say(f"  +{f.at_s:5.1f} s for {f.lasts_s:4.1f} s: {f.describe()}")
        submitter = threading.Thread(target=self._submit, args=(began + window,), daemon=True)
        submitter.start()
        try:
            report.faults = self._inject(faults, began, deadline)
        finally:
            self._stop.set()
            submitter.join(timeout=RPC_TIMEOUT_S * 2)
        try:
            self._heal_all(deadline)
        except (grpc.RpcError, RdurackError) as e:  # the jobs still tell what happened
            why = e.details() if isinstance(e, grpc.Call) else str(e)
            self.say(f"the rack could not be healed before the deadline: {why}")
        report.submitted = len(self._ids)
        report.refused = list(self._refused)
        self._settle(deadline)
        with self._lock:
            ids = list(self._ids)
        audit(report, self.rack.state_dir / "jobs.sqlite", ids)
        report.wall_s = time.monotonic() - began
        return report

    # ------------------------------------------------------------------ the workload

    def _submit(self, until: float) -> None:
        specs = job_specs(self.config.seed, self.config.sockets_per_node)
        run = uuid.uuid4().hex[:8]
        i = 0
        while not self._stop.is_set() and time.monotonic() < until:
            spec = specs(i)
            spec.client_request_id = f"chaos-{run}-{i}"
            job_id = self._send(spec)
            with self._lock:
                if job_id:
                    self._ids.append(job_id)
            i += 1
            self._stop.wait(self.config.submit_every_s)

    def _send(self, spec: job_pb2.JobSpec) -> str:
        """Submit; the job's id, or "" with the reason in `_refused`. Every submission
        carries a client request id, so the channel's retry policy may send it again
        after UNAVAILABLE, and this loop after a missed deadline: it counts once."""
        for _ in range(SUBMIT_ATTEMPTS):
            try:
                reply = self._jobs.SubmitJob(
                    job_pb2.SubmitJobRequest(spec=spec), timeout=RPC_TIMEOUT_S
                )
                return str(reply.job.id)
            except grpc.RpcError as e:
                code = e.code() if isinstance(e, grpc.Call) else None
                if code != grpc.StatusCode.DEADLINE_EXCEEDED:
                    details = e.details() if isinstance(e, grpc.Call) else str(e)
                    with self._lock:
                        self._refused.append(f"{spec.name}: {code}: {details}")
                    return ""
        with self._lock:
            self._refused.append(f"{spec.name}: the orchestrator did not answer")
        return ""

    # ------------------------------------------------------------------ the faults

    def _inject(
        self, faults: list[PlannedFault], began: float, deadline: float
    ) -> list[FaultRecord]:
        """Inject and heal the plan's faults at their instants, one at a time."""
        events = sorted(
            [(f.at_s, 0, i) for i, f in enumerate(faults)]
            + [(f.at_s + f.lasts_s, 1, i) for i, f in enumerate(faults)]
        )
        records = [FaultRecord(f.at_s, f.describe()) for f in faults]
        for at, heal, i in events:
            self._sleep_until(began + at)
            if heal:
                records[i].healed = self._heal(faults[i], records[i], deadline)
            else:
                self._one(faults[i], records[i], began)
        return records

    def _one(self, f: PlannedFault, record: FaultRecord, began: float) -> None:
        a = self._admin
        record.at_s = time.monotonic() - began
        try:
            if f.kind is FaultKind.KILL_SOCKET:
                injected = a.kill_socket(f.sockets[0])
            elif f.kind is FaultKind.KILL_AGENT:
                injected = a.kill_agent(f.nodes[0])
            elif f.kind is FaultKind.SLOW_SOCKET:
                injected = a.slow(f.sockets[0], f.slow_factor)
            elif f.kind is FaultKind.DROP_LINK:
                injected = a.drop_link(*f.sockets)
            elif f.kind is FaultKind.DELAY_LINK:
                injected = a.delay_link(f.sockets[0], f.sockets[1], f.extra_latency_ns)
            else:
                injected = a.partition(*f.nodes)
        except grpc.RpcError as e:
            record.skipped = e.details() if isinstance(e, grpc.Call) else str(e)
            self.say(f"  {f.describe()}: skipped: {record.skipped}")
            return
        record.id = injected.id
        self.say(f"  +{record.at_s:5.1f} s  injected {injected.id}: {injected.description}")
        if f.kind in (FaultKind.KILL_SOCKET, FaultKind.KILL_AGENT):
            record.detected_s = self._detect(f, time.monotonic())

    def _detect(self, f: PlannedFault, since: float) -> float | None:
        """Wall seconds until GetRack shows the killed socket or node down."""
        while time.monotonic() - since < DETECT_WAIT_S:
            rack = self._racks.GetRack(rack_pb2.GetRackRequest(), timeout=RPC_TIMEOUT_S).rack
            if f.kind is FaultKind.KILL_AGENT:
                down = any(not n.healthy for n in rack.nodes if n.index == f.nodes[0])
            else:
                down = any(
                    s.ref.id == f.sockets[0] and s.health != rack_pb2.SOCKET_HEALTH_HEALTHY
                    for n in rack.nodes
                    for s in n.sockets
                )
            if down:
                return time.monotonic() - since
            time.sleep(0.1)
        return None

    def _heal(self, f: PlannedFault, record: FaultRecord, deadline: float) -> str:
        if not record.id:
            return ""
        try:
            if f.kind is FaultKind.KILL_AGENT:
                left = _left(deadline)
                local_rack.restart_agent(self.rack.state_dir, f.nodes[0], left)
                wait_healthy(self._channel, [f.nodes[0]], _left(deadline))
                return "agent restarted"
            reply = self._admin.heal(record.id)
            restarted = f", restarted {', '.join(reply.restarted_socket_ids)}"
            return "healed" + (restarted if reply.restarted_socket_ids else "")
        except (grpc.RpcError, RdurackError) as e:
            why = e.details() if isinstance(e, grpc.Call) else str(e)
            return f"heal failed: {why}"

    def _heal_all(self, deadline: float) -> None:
        """Restart dead agents, end every fault, wait for a healthy rack."""
        restarted = local_rack.restart_dead_agents(self.rack.state_dir, _left(deadline))
        nodes = [int(n.rsplit("-", 1)[1]) for n in restarted]
        wait_healthy(self._channel, nodes, _left(deadline))
        reply = self._admin.heal()
        wait_healthy(self._channel, list(range(self.config.nodes)), _left(deadline))
        left = self._admin.faults()
        self.say(
            f"healed: {len(reply.healed)} fault(s) still in force ended, "
            f"{len(reply.restarted_socket_ids)} socket actor(s) restarted; "
            f"{len(left)} fault(s) left"
        )

    # ------------------------------------------------------------------ the end

    def _settle(self, deadline: float) -> None:
        """Until every job submitted is finished, or the deadline."""
        ids = set(self._ids)
        while time.monotonic() < deadline:
            jobs = self._jobs.ListJobs(
                job_pb2.ListJobsRequest(
                    states=[
                        common_pb2.JOB_STATE_PENDING,
                        common_pb2.JOB_STATE_SCHEDULED,
                        common_pb2.JOB_STATE_RUNNING,
                    ]
                ),
                timeout=RPC_TIMEOUT_S,
            ).jobs
            if not [j for j in jobs if j.id in ids]:
                return
            time.sleep(0.5)

    def _sleep_until(self, t: float) -> None:
        while (left := t - time.monotonic()) > 0:
            time.sleep(min(left, 0.2))


def _left(deadline: float) -> float:
    """Wall seconds to `deadline` (monotonic), at most AGENT_BACK_S, at least 1."""
    return max(1.0, min(AGENT_BACK_S, deadline - time.monotonic()))
