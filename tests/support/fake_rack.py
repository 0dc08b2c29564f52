"""A rack in memory for the orchestrator's tests: the fake gateway, a clock the test
advances, job specs, and waits on the runs of an orchestrator (with deadlines, never a
bare sleep).

The tests step the orchestrator (`start(background=False)`): they run each scheduling
round (`schedule_once`) and health round (`supervise_once`) themselves; only the jobs'
runs execute on the orchestrator's workers, and the tests wait on those."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

from rdurack.errors import LinkFailure, SocketBusy
from rdurack.orchestrator.gateway import (
    KernelRun,
    NodeBeat,
    NodeView,
    PassesRun,
    SocketBeat,
    SocketView,
)
from rdurack.orchestrator.jobs import EndpointWorkload, JobSpec, JobState, KernelWorkload
from rdurack.orchestrator.orchestrator import Orchestrator
from rdurack.orchestrator.store import JobStore
from rdurack.rack.faults import Fault
from rdurack.rack.kernels import Phase
from rdurack.rack.models import builtin_models
from rdurack.rack.presets import platform
from rdurack.rack.spec import PlatformSpec
from rdurack.rack.topology import Topology
from rdurack.telemetry.served import PassesServed
from rdurack.workloads.coe.bundle import PredictedReplicas
from rdurack.workloads.coe.spec import CoeWorkload
from rdurack.workloads.program import Deploy, Op, ProgramRun
from rdurack.workloads.serving.stream.pricing import Pass
from rdurack.workloads.training.job import RankReport, TrainingWorkload

RACK = platform("sn40l-rack16")
MODELS = builtin_models()
STEP_NS = 1_000
STEP_FLOPS = 2_000_000  # a fake kernel step's FLOPs per socket


class FakeGateway:
    """Two healthy nodes; a kernel step takes STEP_NS; runs can be held or made to fail.
    Sockets can die (`dead`) and agents go silent (`silent`); a held run on an aborted
    job fails at once, as a real one does."""

    def __init__(self) -> None:
        self.held: dict[str, str] = {}  # socket -> job
        self.clock = dict.fromkeys((str(s) for s in Topology(RACK).sockets), 0)
        self.gate = threading.Event()
        self.gate.set()
        self.fail: Callable[[str], Exception | None] = lambda job: None
        self.lock = threading.Lock()
        self.max_running = 0
        self.programs: dict[tuple[str, tuple[str, ...]], PredictedReplicas] = {}
        self.dead: set[str] = set()  # sockets whose actor died
        self.silent: set[int] = set()  # nodes whose agent does not answer
        self.incarnation = {n: f"agent-{n}" for n in range(RACK.nodes)}
        self.aborted: dict[str, str] = {}  # job -> reason, until the job releases
        self.abort_log: list[tuple[str, str]] = []  # (job, reason) of every abort
        self.in_force: dict[int, dict[str, Fault]] = {n: {} for n in range(RACK.nodes)}
        # A call on a dead socket fails at once (as Ray's does); False: it waits, as a
        # survivor waiting for the dead one's messages does, until aborted.
        self.dead_fails_at_once = True
        self.fail_node: int | None = None  # this node's part of every run fails at once
        self.at_gate: dict[str, int] = {}  # job -> its calls held at the closed gate now
        self.kv_tokens: dict[str, int] = {}  # endpoint job -> the KV cache of its last passes

    def nodes(self) -> list[NodeView]:
        with self.lock:
            return [
                NodeView(n, f"fake:{n}", False, (), "unreachable")
                if n in self.silent
                else NodeView(
                    n,
                    f"fake:{n}",
                    not any(s.startswith(f"rdu-n{n}-") for s in self.dead),
                    tuple(
                        SocketView(s, n, s not in self.dead, self.held.get(s, ""), self.clock[s])
                        for s in self.clock
                        if s.startswith(f"rdu-n{n}-")
                    ),
                )
                for n in range(RACK.nodes)
            ]

    def heartbeat(self, node: int, timeout_s: float) -> NodeBeat:
        with self.lock:
            if node in self.silent:
                raise LinkFailure(f"node {node} (fake:{node}): heartbeat: connection refused")
            return NodeBeat(
                node,
                self.incarnation[node],
                tuple(
                    SocketBeat(s, "dead", error="killed")
                    if s in self.dead
                    else SocketBeat(s, "healthy", self.held.get(s, ""), clock_ns=self.clock[s])
                    for s in self.clock
                    if s.startswith(f"rdu-n{node}-")
                ),
            )

    def abort(self, node: int, job_id: str, sockets: Sequence[str], reason: str) -> None:
        with self.lock:
            self.aborted[job_id] = reason
            self.abort_log.append((job_id, reason))

    def inject_fault(self, node: int, fault: Fault) -> None:
        with self.lock:
            self.in_force[node][fault.id] = fault

    def clear_faults(self, node: int, fault_id: str) -> tuple[list[Fault], list[str]]:
        with self.lock:
            faults = self.in_force[node]
            ids = [fault_id] if fault_id in faults else [] if fault_id else list(faults)
            return [faults.pop(i) for i in ids], []

    def faults(self, node: int) -> list[Fault]:
        with self.lock:
            if node in self.silent:
                raise LinkFailure(f"node {node}: unreachable")
            return list(self.in_force[node].values())

    def reserve(self, node: int, job_id: str, sockets: Sequence[str]) -> None:
        with self.lock:
            for s in sockets:
                if self.held.get(s, job_id) != job_id:
                    raise SocketBusy(s, self.held[s], job_id)
            self.held.update(dict.fromkeys(sockets, job_id))

    def release(self, node: int, job_id: str, sockets: Sequence[str]) -> None:
        with self.lock:
            self.aborted.pop(job_id, None)  # as a socket's mailbox: over with the run
            for s in sockets:
                if self.held.get(s) == job_id:
                    del self.held[s]

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
        with self.lock:
            self.max_running = max(self.max_running, len(set(self.held.values())))
        if node == self.fail_node:
            raise LinkFailure(f"node {node}: link down")
        self._wait_gate(node, job_id, sockets)
        error = self.fail(job_id)
        if error is not None:
            raise error
        end = start_ns + steps * STEP_NS
        with self.lock:
            for s in sockets:
                self.clock[s] = end
        return [
            KernelRun(s, start_ns, end, 3 * steps, 1_000 * steps, STEP_FLOPS * steps)
            for s in sockets
        ]

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
        """Each pass takes STEP_NS; the clocks run from the later of theirs and start_ns."""
        if node == self.fail_node:
            raise LinkFailure(f"node {node}: link down")
        out = []
        with self.lock:
            self.kv_tokens[job_id] = kv_tokens
            for s in sockets:
                start = max(self.clock.get(s, 0), start_ns)
                self.clock[s] = start + STEP_NS * len(passes)
                out.append(PassesRun(s, start, self.clock[s], (STEP_NS,) * len(passes)))
        return out

    def _wait_gate(self, node: int, job_id: str, sockets: Sequence[str]) -> None:
        """Hold a run while the gate is closed; fail it once aborted, or at once on a
        dead socket (`dead_fails_at_once`) or a silent node. The deadline only ends a
        test that forgot to open the gate; a loaded machine can hold a run at the gate
        for several seconds of the test's own calls (a 10 s bound failed at load 20)."""
        deadline = time.monotonic() + 120
        with self.lock:
            self.at_gate[job_id] = self.at_gate.get(job_id, 0) + 1
        try:
            while True:
                with self.lock:
                    if job_id in self.aborted:
                        raise LinkFailure(f"aborted: {self.aborted[job_id]}")
                    dead = self.dead_fails_at_once and set(sockets) & self.dead
                    if dead or node in self.silent:
                        raise LinkFailure(f"node {node}: a socket actor of {job_id} is dead")
                if self.gate.wait(timeout=0.01):
                    return
                assert time.monotonic() < deadline, "the gate stayed closed"
        finally:
            with self.lock:
                self.at_gate[job_id] -= 1
                if not self.at_gate[job_id]:
                    del self.at_gate[job_id]

    def held_at_gate(self, job_id: str) -> bool:
        """Whether a call of the job waits at the closed gate now."""
        with self.lock:
            return job_id in self.at_gate

    def run_program(
        self, node: int, job_id: str, sockets: Sequence[str], ops: Sequence[Op], start_ns: int
    ) -> list[ProgramRun]:
        """Every socket of a TP group does the same: one predicted socket speaks for it.
        A program on a dead socket or a silent node fails, as on the rack."""
        self._wait_gate(node, job_id, sockets)
        replicas = self.programs.setdefault(
            (job_id, tuple(sockets)), PredictedReplicas(self.platform_of(ops), MODELS, len(sockets))
        )
        run = replicas.run(0, ops, start_ns)
        with self.lock:
            for s in sockets:
                self.clock[s] = run.end_ns
        return [replace(run, socket_id=s) for s in sockets]

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
        raise NotImplementedError(
            "training runs on real sockets: tests/integration, test_rank_start.py"
        )

    def platform_of(self, ops: Sequence[Op]) -> PlatformSpec:
        deploy = next((op for op in ops if isinstance(op, Deploy)), None)
        return platform(deploy.platform) if deploy else RACK


def spec(sockets: int = 8, steps: int = 20, model: str = "llama2-7b", **kw: object) -> JobSpec:
    workload = KernelWorkload(
        model=model, phase=Phase.DECODE, num_sockets=sockets, output_tokens=steps
    )
    return JobSpec.model_validate({"workload": workload, **kw})


class FakeClock:
    """Monotonic seconds that move only when the test says so (the orchestrator's and
    its health watcher's clock: backoffs and heartbeat deadlines)."""

    def __init__(self) -> None:
        # Not 0: like time.monotonic, never near it (the health watcher reads a last
        # answer at 0 as none).
        self.now_s = 1000.0

    def __call__(self) -> float:
        return self.now_s

    def advance(self, seconds: float) -> None:
        self.now_s += seconds


@contextmanager
def stepped(store: str | Path, gateway: FakeGateway, **options: Any) -> Iterator[Orchestrator]:
    """An orchestrator on the fake gateway (and `options`) and the job store at `store`
    (a SQLite path or a PostgreSQL URL), started without its scheduling and health
    threads: the test runs each round itself. On exit the gate opens (a run the test
    held must not hold up the workers) and it stops."""
    o = Orchestrator(JobStore(store), gateway, RACK, **options)
    o.start(background=False)
    try:
        yield o
    finally:
        gateway.gate.set()
        o.stop()
        o.store.close()


def until(condition: Callable[[], object], what: str, timeout_s: float = 10) -> None:
    """Return once `condition()` holds; fail naming `what` after `timeout_s` (wall)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not within {timeout_s:g} s"
        time.sleep(0.005)  # poll: the runs are on the orchestrator's worker threads


def over(orch: Orchestrator, job_id: str) -> bool:
    """Whether the job's run is over: no socket holds the job (its worker released
    them), so a next round sees its sockets free."""
    return all(s.job_id != job_id for n in orch.rack() for s in n.sockets)


def wait_for(orch: Orchestrator, job_id: str, timeout_s: float = 10) -> JobState:
    """The job's final state, once it is finished and its run is over."""
    until(
        lambda: orch.get(job_id).state.terminal and over(orch, job_id),
        f"{job_id} finished (still {orch.get(job_id).state})",
        timeout_s,
    )
    return orch.get(job_id).state


def wait_retried(orch: Orchestrator, job_id: str, attempts: int, timeout_s: float = 10) -> None:
    """Until the job is queued again after its `attempts`-th start, its run over."""
    until(
        lambda: (
            (j := orch.get(job_id)).state is JobState.PENDING
            and j.attempts == attempts
            and over(orch, job_id)
        ),
        f"{job_id} retried after attempt {attempts}",
        timeout_s,
    )


def coe(platform_name: str = "sn40l-rack16", **fields: object) -> JobSpec:
    return JobSpec(platform=platform_name, workload=CoeWorkload.model_validate(fields))
