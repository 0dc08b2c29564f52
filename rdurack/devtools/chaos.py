"""`make chaos`: random faults under a steady mixed workload, bounded in time, then an
audit of the job store: no job lost, none left hanging.

    python -m rdurack.devtools.chaos [--duration-s 170] [--seed S] [--nodes 2]
        [--sockets-per-node 4] [--state-dir build/chaos] [--json]

1. It brings a local rack up as `rdu up` does (or uses one: `run(..., rack=...)`).
2. A submitter sends a job every `submit_every_s`: kernel, CoE and small training jobs
   in turn, each with a client request id (a submission that fails in transit is sent
   again, never twice).
3. A seeded plan (printed) injects faults through AdminService at random instants, of
   random kinds and targets, each healed after a random while: kill a socket (noticed
   by the health watcher: the run prints in how long), kill a node agent (restarted as
   its supervisor would, `local_rack.restart_agent`), slow a socket, drop or delay a
   link, partition the nodes. A fault that cannot be injected then (its target is
   already down) is reported as skipped.
4. After the fault window everything is healed and every job must reach a terminal
   state before the deadline.
5. It reads the job store itself and prints jobs submitted, succeeded, retried,
   re-routed (CoE), failed with their reasons, and `lost: N, hanging: M`: lost, an
   acknowledged submission missing from the store; hanging, a job not finished at the
   deadline. The exit code is 1 if either is not 0.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import grpc
from pydantic import Field

from rdurack.api.server import channel
from rdurack.client.admin import AdminClient, wait_healthy
from rdurack.config import Config
from rdurack.errors import RdurackError
from rdurack.orchestrator.jobs import JobState
from rdurack.orchestrator.results import CoeResult
from rdurack.orchestrator.store import JobStore
from rdurack.processes import local_rack
from rdurack.rack.faults import FaultKind
from rdurack.v1 import common_pb2, job_pb2, job_pb2_grpc, rack_pb2, rack_pb2_grpc

RPC_TIMEOUT_S = 30.0
KINDS = (
    FaultKind.KILL_SOCKET,
    FaultKind.KILL_AGENT,
    FaultKind.SLOW_SOCKET,
    FaultKind.DROP_LINK,
    FaultKind.DELAY_LINK,
    FaultKind.PARTITION,
)
# Wall seconds a fault lasts before it is healed: long enough for the jobs it hits to
# fail over, short enough that several fit in a run.
LASTS_S = (3.0, 10.0)
DETECT_WAIT_S = 15.0  # how long the run looks for a killed target to show down
AGENT_BACK_S = 60.0  # how long a restarted agent may take to show healthy
HEAL_RESERVE_S = 15.0  # kept after the fault window to heal everything
STOP_RESERVE_S = 20.0  # kept at the end to stop the rack's processes
STOP_WAIT_S = 8.0  # per process, after SIGTERM, before SIGKILL


class ChaosConfig(Config):
    duration_s: float = Field(default=170.0, gt=0)  # the whole run, bring-up included
    seed: int = Field(default_factory=lambda: random.SystemRandom().randrange(1 << 31), ge=0)
    nodes: int = Field(default=2, ge=2, le=8)
    sockets_per_node: int = Field(default=4, ge=2, le=8)
    faults: int | None = Field(default=None, ge=0)  # None: one per 8 s of the window
    submit_every_s: float = Field(default=1.5, gt=0)
    settle_s: float = Field(default=45.0, gt=0)  # kept for jobs to finish after healing
    # Pacing of the sockets (wall s per emulated s): kernel and CoE jobs then take
    # seconds of wall time, so faults hit them while they run.
    time_scale: float = Field(default=10.0, ge=0)


@dataclass(frozen=True)
class PlannedFault:
    at_s: float  # after the fault window opens, wall s
    lasts_s: float
    kind: FaultKind
    sockets: tuple[str, ...] = ()
    nodes: tuple[int, ...] = ()
    slow_factor: float = 1.0
    extra_latency_ns: int = 0

    def describe(self) -> str:
        what = " ".join([*self.sockets, *(f"node {n}" for n in self.nodes)])
        extra = {
            FaultKind.SLOW_SOCKET: f" x{self.slow_factor:g}",
            FaultKind.DELAY_LINK: f" +{self.extra_latency_ns:,} ns",
        }.get(self.kind, "")
        return f"{self.kind.value} {what}{extra}"


def plan(
    seed: int, nodes: int, sockets_per_node: int, window_s: float, count: int
) -> list[PlannedFault]:
    """`count` faults at seeded random instants of the window, in time order; each ends
    before the window does."""
    rng = random.Random(seed)

    def socket() -> str:
        return f"rdu-n{rng.randrange(nodes)}-s{rng.randrange(sockets_per_node)}"

    out = []
    for _ in range(count):
        lasts = rng.uniform(*LASTS_S)
        at = rng.uniform(0.0, max(0.0, window_s - lasts))
        kind = rng.choice(KINDS)
        if kind is FaultKind.KILL_SOCKET:
            fault = PlannedFault(at, lasts, kind, sockets=(socket(),))
        elif kind is FaultKind.SLOW_SOCKET:
            fault = PlannedFault(at, lasts, kind, (socket(),), slow_factor=rng.choice((2, 4)))
        elif kind in (FaultKind.DROP_LINK, FaultKind.DELAY_LINK):
            a, b = rng.sample(range(nodes), 2)
            index = rng.randrange(sockets_per_node)  # a rail: the link between nodes
            ends = (f"rdu-n{a}-s{index}", f"rdu-n{b}-s{index}")
            delay = rng.choice((10_000, 1_000_000)) if kind is FaultKind.DELAY_LINK else 0
            fault = PlannedFault(at, lasts, kind, ends, extra_latency_ns=delay)
        elif kind is FaultKind.KILL_AGENT:
            fault = PlannedFault(at, lasts, kind, nodes=(rng.randrange(nodes),))
        else:
            fault = PlannedFault(at, lasts, kind, nodes=tuple(sorted(rng.sample(range(nodes), 2))))
        out.append(fault)
    return sorted(out, key=lambda f: f.at_s)


def job_specs(seed: int, sockets_per_node: int) -> Callable[[int], job_pb2.JobSpec]:
    """The i-th job of the workload: kernel, CoE and training jobs in turn, small."""
    rng = random.Random(seed + 1)
    half = max(1, sockets_per_node // 2)

    def spec(i: int) -> job_pb2.JobSpec:
        kind = i % 3
        if kind == 0:
            phase = rng.choice((common_pb2.PHASE_PREFILL, common_pb2.PHASE_DECODE))
            kernel = job_pb2.KernelJob(
                model="llama2-7b",
                phase=phase,
                sequence_length=2048 if phase == common_pb2.PHASE_PREFILL else 512,
                batch_size=1,
                num_sockets=rng.choice((1, 2, sockets_per_node)),
                output_tokens=48 if phase == common_pb2.PHASE_DECODE else 0,
            )
            return job_pb2.JobSpec(name=f"chaos-{i}-kernel", kernel=kernel)
        if kind == 1:
            coe = job_pb2.CoeInferenceJob(
                num_experts=8,
                batch_size=4,
                output_tokens=8,
                num_sockets=sockets_per_node,
                tensor_parallel=half,  # two replicas: one can take the other's requests
                poisson=job_pb2.PoissonLoad(requests=12, rate_per_s=200.0, seed=i),
            )
            return job_pb2.JobSpec(name=f"chaos-{i}-coe", coe_inference=coe)
        training = job_pb2.TrainingJob(
            model="mlp",
            world_size=rng.choice((2, half)),
            steps=60,
            global_batch=32,
            checkpoint_every=10,
            wall_timeout_s=20.0,
        )
        return job_pb2.JobSpec(
            name=f"chaos-{i}-train",
            training=training,
            payload_mode=common_pb2.PAYLOAD_MODE_FUNCTIONAL,
        )

    return spec


@dataclass
class FaultRecord:
    at_s: float  # since the window opened, wall s
    fault: str
    id: str = ""
    skipped: str = ""  # why it could not be injected
    detected_s: float | None = None  # kill faults: until GetRack showed the target down
    healed: str = ""


@dataclass
class ChaosReport:
    seed: int
    window_s: float
    faults: list[FaultRecord] = field(default_factory=list)
    submitted: int = 0
    refused: list[str] = field(default_factory=list)  # submissions never acknowledged
    states: dict[str, int] = field(default_factory=dict)
    retried: int = 0
    rerouted: int = 0  # CoE jobs that re-routed requests
    failed: dict[str, str] = field(default_factory=dict)  # job -> error
    lost: list[str] = field(default_factory=list)
    hanging: dict[str, str] = field(default_factory=dict)  # job -> state
    audited: str = ""  # the job store read
    wall_s: float = 0.0

    @property
    def ok(self) -> bool:
        return bool(self.audited) and not self.lost and not self.hanging

    def lines(self) -> list[str]:
        out = [
            f"chaos: seed {self.seed}, {self.window_s:.0f} s of faults, {self.wall_s:.0f} s in all"
        ]
        for f in self.faults:
            line = f"  +{f.at_s:5.1f} s  {f.fault}"
            line += f" ({f.id})" if f.id else f": skipped: {f.skipped}"
            if f.detected_s is not None:
                line += f"; down in GetRack after {f.detected_s:.2f} s"
            if f.healed:
                line += f"; {f.healed}"
            out.append(line)
        s = self.states
        out.append(
            f"jobs: submitted {self.submitted}, succeeded {s.get('SUCCEEDED', 0)}, "
            f"retried {self.retried}, re-routed {self.rerouted}, failed {s.get('FAILED', 0)}, "
            f"cancelled {s.get('CANCELLED', 0)}"
        )
        for reason, n in Counter(_short(e) for e in self.failed.values()).most_common():
            out.append(f"  failed x{n}: {reason}")
        for r in self.refused:
            out.append(f"  refused: {r}")
        if not self.audited:
            out.append("lost and hanging: unknown (the job store was not read)")
        else:
            out.append(
                f"lost: {len(self.lost)}, hanging: {len(self.hanging)} "
                f"(checked against the job store {self.audited})"
            )
        for job_id in self.lost:
            out.append(f"  lost: {job_id}")
        for job_id, state in self.hanging.items():
            out.append(f"  hanging: {job_id} {state}")
        return out


@dataclass(frozen=True)
class Rack:
    """A running local rack: where its orchestrator serves, its bearer token (an admin
    tenant's; "" on the open local default), its state dir (job store, rack.json)."""

    address: str
    token: str
    state_dir: Path


class ChaosRun:
    def __init__(self, rack: Rack, config: ChaosConfig, say: Callable[[str], None] = print) -> None:
        self.rack = rack
        self.config = config
        self.say = say
        self._channel = channel(rack.address, token=rack.token or None)
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
        self._audit(report)
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
        """Submit, again after a transport failure (the request id makes it once)."""
        for attempt in range(5):
            try:
                reply = self._jobs.SubmitJob(
                    job_pb2.SubmitJobRequest(spec=spec), timeout=RPC_TIMEOUT_S
                )
                return str(reply.job.id)
            except grpc.RpcError as e:
                code = e.code() if isinstance(e, grpc.Call) else None
                if code not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                    details = e.details() if isinstance(e, grpc.Call) else str(e)
                    with self._lock:
                        self._refused.append(f"{spec.name}: {code}: {details}")
                    return ""
                time.sleep(0.5 * (attempt + 1))
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

    def _audit(self, report: ChaosReport) -> None:
        """Read the job store itself: every acknowledged job is there, and finished."""
        path = self.rack.state_dir / "jobs.sqlite"
        with JobStore(path) as store:
            jobs = {j.id: j for j in store.list()}
            for job_id in self._ids:
                job = jobs.get(job_id)
                if job is None:
                    report.lost.append(job_id)
                    continue
                report.states[job.state.value] = report.states.get(job.state.value, 0) + 1
                if not job.state.terminal:
                    report.hanging[job_id] = job.state.value
                if job.state is JobState.FAILED:
                    report.failed[job_id] = job.error
                retries = [
                    e
                    for e in store.events(job_id)
                    if e.kind == "state"
                    and e.payload.get("state") == JobState.PENDING.value
                    and str(e.payload.get("reason", "")).startswith("retrying")
                ]
                report.retried += bool(retries)
                coe = job.result if isinstance(job.result, CoeResult) else None
                report.rerouted += bool(coe and coe.rerouted_requests)
        report.audited = str(path)

    def _sleep_until(self, t: float) -> None:
        while (left := t - time.monotonic()) > 0:
            time.sleep(min(left, 0.2))


def _left(deadline: float) -> float:
    """Wall seconds to `deadline` (monotonic), at most AGENT_BACK_S, at least 1."""
    return max(1.0, min(AGENT_BACK_S, deadline - time.monotonic()))


def _short(error: str) -> str:
    return " ".join(error.split())[:200] or "(no reason recorded)"


def run(config: ChaosConfig, state_dir: Path, say: Callable[[str], None] = print) -> ChaosReport:
    """Bring a local rack up in `state_dir`, run the chaos, take the rack down."""
    began = time.monotonic()
    deadline = began + config.duration_s  # the whole run, bring-up and stop included
    say(f"rdu up: {config.nodes} nodes x {config.sockets_per_node} sockets in {state_dir}")
    for old in state_dir.glob("jobs.sqlite*"):  # the audit counts this run's jobs only
        old.unlink()
    procs = local_rack.up(
        state_dir,
        config.nodes,
        config.sockets_per_node,
        port=0,
        timeout_s=config.duration_s,
        time_scale=config.time_scale,
    )
    say(f"rack up in {time.monotonic() - began:.0f} s")
    try:
        rack = Rack(procs.orchestrator, "", state_dir)  # the open local default
        chaos = ChaosRun(rack, config, say)
        try:
            report = chaos.run(deadline - STOP_RESERVE_S)
        finally:
            chaos.close()
    finally:
        for line in local_rack.down(state_dir, wait_s=STOP_WAIT_S):
            say(f"  {line}")
    report.wall_s = time.monotonic() - began  # bring-up and stop included
    return report


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--duration-s", type=float, default=170.0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--nodes", type=int, default=2)
    p.add_argument("--sockets-per-node", type=int, default=4)
    p.add_argument("--faults", type=int, default=None)
    p.add_argument("--time-scale", type=float, default=10.0)
    p.add_argument("--state-dir", type=Path, default=Path("build/chaos"))
    p.add_argument("--json", action="store_true", help="print the report as one JSON object")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    try:
        fields: dict[str, Any] = {
            "duration_s": args.duration_s,
            "nodes": args.nodes,
            "sockets_per_node": args.sockets_per_node,
            "faults": args.faults,
            "time_scale": args.time_scale,
        }
        if args.seed is not None:
            fields["seed"] = args.seed
        config = ChaosConfig.model_validate(fields)
    except ValueError as e:
        print(f"chaos: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    if (args.state_dir / local_rack.RACK_FILE).exists():
        with contextlib.suppress(RdurackError):
            for line in local_rack.down(args.state_dir):  # a rack a killed run left
                print(f"  {line}")
    try:
        report = run(config, args.state_dir, say=(lambda _: None) if args.json else print)
    except RdurackError as e:
        print(f"chaos: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({**asdict(report), "ok": report.ok}))
    else:
        print("\n".join(report.lines()))
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
