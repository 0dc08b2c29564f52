"""The orchestrator: accepts jobs, schedules them on the rack, runs them, records all.

A plain class. api/job_service.py serves it over gRPC; it reaches node agents only
through a NodeGateway. Every state change goes through the job store (written before it
is acknowledged) and its transition table, so a cancelled or finished job is never
overwritten by a late worker.

One scheduling thread places queued jobs; a pool of workers runs them. A job starts at
the latest emulated clock of its sockets (DESIGN: clocks meet at a job's start).

Tenants (plain data; who a caller is, is the gRPC edge's business): every job belongs to
the tenant that submitted it ("" on an open rack). A read, watch or cancel given a
tenant sees only that tenant's jobs; any other job id, existing or not, is
PermissionDenied with the same message, so a tenant learns nothing about other
tenants' jobs. `quotas` bounds the sockets a tenant's SCHEDULED and RUNNING jobs hold
together: a job wider than its tenant's quota is refused at submission (QuotaExceeded),
and the scheduler starts a job only while its tenant stays within the quota.

Tracing (OpenTelemetry API only; the process configures the SDK): a span per scheduling
round that placed jobs, and a span per job run, inside which the gateway calls are
made, so the job's trace reaches the node agents.

Faults (docs/faults.md): a HealthWatcher polls the agents' heartbeats. When a socket or
an agent a job runs on dies (or is restarted), the job's run is stopped at once: its
calls in flight on the survivors are aborted, and the job is retried elsewhere by
policy (`max_attempts`, after a backoff). A CoE job with several replicas loses only
the replica that died: its requests are re-routed to the others. When one node's part
of a job fails, its other nodes' calls are aborted too, rather than left waiting for
messages that will never come.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import math
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal, TypeVar

from opentelemetry import trace

from rdurack.errors import (
    InvalidRequest,
    LinkFailure,
    PermissionDenied,
    QuotaExceeded,
    RdurackError,
    SocketBusy,
    UnknownName,
)
from rdurack.orchestrator.coe_job import GatewayReplicas, replica_groups, validate_coe
from rdurack.orchestrator.gateway import KernelRun, NodeGateway, NodeView, SocketView
from rdurack.orchestrator.health import DEAD_AFTER_S, INTERVAL_S, Change, HealthWatcher
from rdurack.orchestrator.jobs import IllegalTransition, Job, JobSpec, JobState, KernelWorkload
from rdurack.orchestrator.platforms import job_platform
from rdurack.orchestrator.scheduler import Scheduler
from rdurack.orchestrator.signals import JobSignals
from rdurack.orchestrator.store import Event, JobStore
from rdurack.orchestrator.training_job import training_result, validate_training
from rdurack.rack.kernels import Phase, step
from rdurack.rack.models import builtin_models
from rdurack.rack.spec import PlatformSpec
from rdurack.rack.topology import SocketId, Topology
from rdurack.telemetry import names
from rdurack.workloads.coe import CoeEngine
from rdurack.workloads.coe_report import CoeOutOfMemory
from rdurack.workloads.coe_spec import CoeWorkload, build_requests
from rdurack.workloads.predictor import Predictor
from rdurack.workloads.router import Router
from rdurack.workloads.training.job import RankReport, TrainingWorkload, ranks_of

log = logging.getLogger(__name__)
ACTIVE = (JobState.SCHEDULED, JobState.RUNNING)
OTHER_TENANT = "(another tenant's job)"  # what a tenant sees of a socket it does not hold
T = TypeVar("T")


@dataclass
class _Run:
    """A job placed by this orchestrator and not yet finished: what the health watcher
    may stop. `abort` says why the run must stop; a CoE job's `replicas` may be lost one
    at a time (their requests re-routed) before the whole run is."""

    job_id: str
    sockets: tuple[str, ...]
    started: float  # monotonic s when it was placed
    abort: str | None = None
    replicas: list[tuple[int, list[str]]] | None = None
    lost: dict[int, str] = field(default_factory=dict)  # replica -> why


class Orchestrator:
    def __init__(
        self,
        store: JobStore,
        gateway: NodeGateway,
        platform: PlatformSpec,
        *,
        recovery: Literal["retry", "fail"] = "retry",
        max_attempts: int = 3,
        progress_chunks: int = 10,
        poll_s: float = 0.5,
        checkpoint_dir: Path | None = None,
        quotas: Mapping[str, int] | None = None,
        heartbeat_s: float | None = INTERVAL_S,
        dead_after_s: float = DEAD_AFTER_S,
        retry_backoff_s: float = 1.0,
        tracer_provider: trace.TracerProvider | None = None,
    ) -> None:
        """`checkpoint_dir`: where training jobs checkpoint (a directory per job), on a
        filesystem every node agent sees; None: training jobs do not checkpoint.
        `quotas`: tenant -> the sockets its active jobs may hold (module docstring).
        `heartbeat_s`: how often the health watcher polls the agents (None: no watcher);
        `dead_after_s`: how long an agent may be silent before it counts as down.
        `retry_backoff_s`: a retried job waits this long before it is placed again,
        doubled with each attempt it has made (so a fault that lasts a while does not
        use up its attempts at once).
        `tracer_provider`: where its spans go (default: the process's global one)."""
        self.store = store
        self.gateway = gateway
        self.platform = platform
        self.recovery = recovery
        self.max_attempts = max_attempts
        self.progress_chunks = progress_chunks
        self.poll_s = poll_s
        self.checkpoint_dir = checkpoint_dir
        self.quotas = dict(quotas or {})
        self.retry_backoff_s = retry_backoff_s
        self.health = (
            HealthWatcher(
                gateway,
                platform,
                interval_s=heartbeat_s,
                dead_after_s=dead_after_s,
                on_change=self._on_health,
            )
            if heartbeat_s
            else None
        )
        self._runs: dict[str, _Run] = {}
        self._runs_lock = threading.Lock()
        self._not_before: dict[str, float] = {}  # job -> monotonic s it may be placed again
        self.scheduler = Scheduler(platform.nodes, platform.node.sockets)
        self.predictor = Predictor(platform)
        self.models = builtin_models()
        self._topology = Topology(platform)
        self._wake = threading.Condition()
        self._signals = JobSignals()  # wakes a job's watchers on its new events
        self._stop = threading.Event()
        self._cancelled: set[str] = set()
        self._workers = ThreadPoolExecutor(max_workers=platform.sockets, thread_name_prefix="job")
        self._thread: threading.Thread | None = None
        self._tracer = trace.get_tracer(names.TRACER_ORCHESTRATOR, tracer_provider=tracer_provider)

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> list[Job]:
        """Recover what a previous run left scheduled or running, then start scheduling."""
        recovered = self.store.recover(self.recovery, self.max_attempts)
        if self.health is not None:
            self.health.poll_once()
            self.health.start()
        self._release_orphans()
        self._thread = threading.Thread(target=self._loop, name="scheduler", daemon=True)
        self._thread.start()
        return recovered

    def stop(self) -> None:
        self._stop.set()
        if self.health is not None:
            self.health.stop()
        self._kick()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._workers.shutdown(wait=True, cancel_futures=False)
        self._signals.stop()

    # ------------------------------------------------------------------ the API

    def validate(self, spec: JobSpec) -> None:
        """Refuse, before storing, what could never run: the wrong platform, an unknown
        model, an impossible socket count, a model that does not fit its sockets."""
        w = spec.workload
        if isinstance(w, CoeWorkload):
            validate_coe(
                w, self.platform, spec.platform, spec.payload_mode == "functional", self.models
            )
            self.scheduler.check(spec)
            return
        if isinstance(w, TrainingWorkload):
            platform = job_platform(self.platform, spec.platform)
            validate_training(w, platform, spec.payload_mode == "functional", self.models)
            self.scheduler.check(spec)
            return
        if spec.platform != self.platform.name:
            raise InvalidRequest(
                f"spec.platform: this rack is {self.platform.name!r}, not {spec.platform!r}"
            )
        if spec.payload_mode == "functional":
            raise InvalidRequest(
                "spec.payload_mode: FUNCTIONAL kernel jobs need models with real weights; "
                "the presets have none: use TIMING"
            )
        if w.model not in self.models:
            accepted = ", ".join(sorted(self.models))
            raise InvalidRequest(
                f"spec.kernel.model: unknown model {w.model!r}; accepted: {accepted}"
            )
        self.scheduler.check(spec)
        model = self.models[w.model]
        step(model, w.phase, w.batch_size, w.sequence_length, w.num_sockets)  # TP divides
        kv_tokens = (
            0 if w.phase is Phase.TRAIN else w.batch_size * (w.sequence_length + w.output_tokens)
        )
        self.predictor.check_fits_hbm(model, w.num_sockets, kv_tokens)

    def submit(
        self, spec: JobSpec, client_request_id: str | None = None, tenant: str = ""
    ) -> tuple[Job, bool]:
        """Store a job of `tenant` once it passes `validate` and the tenant's quota."""
        self.validate(spec)
        quota = self.quotas.get(tenant)
        if quota is not None and spec.sockets > quota:
            raise QuotaExceeded(tenant, spec.sockets, quota, self._in_use(tenant))
        job, created = self.store.submit(
            uuid.uuid4().hex[:12], spec, client_request_id or None, tenant
        )
        if created:
            self._notify(job.id)
            self._kick()
        return job, created

    def get(self, job_id: str, tenant: str | None = None) -> Job:
        """The job; with `tenant`, only if it is that tenant's (module docstring)."""
        try:
            job = self.store.get(job_id)
        except UnknownName:
            if tenant is None:
                raise
            job = None
        if tenant is not None and (job is None or job.tenant != tenant):
            raise PermissionDenied(f"job {job_id!r}: no job of tenant {tenant!r} has this id")
        assert job is not None
        return job

    def jobs(
        self, states: Sequence[JobState] | None = None, tenant: str | None = None
    ) -> list[Job]:
        """Jobs in submission order (in `states`; of `tenant` when given)."""
        return self.store.list(states or None, tenant)

    def cancel(self, job_id: str, reason: str = "", tenant: str | None = None) -> Job:
        """Cancel a job that has not finished. A running job's sockets are released as
        soon as its current kernel call returns."""
        if tenant is not None:
            self.get(job_id, tenant)
        self._cancelled.add(job_id)
        why = reason or "cancelled by the client"
        job = self.store.transition(job_id, JobState.CANCELLED, reason=why, error=why)
        self._notify(job_id)
        self._kick()
        return job

    def events(self, job_id: str, after: int = 0) -> list[Event]:
        return self.store.events(job_id, after)

    def watch(
        self,
        job_id: str,
        after: int = 0,
        still_wanted: Callable[[], bool] = lambda: True,
        tenant: str | None = None,
    ) -> Iterator[Event]:
        """Every event of a job after `after`, as they happen, until the job is finished
        (or the watcher goes away, or the orchestrator stops)."""
        self.get(job_id, tenant)  # unknown (or not its) ids fail now, not after a wait
        with self._signals.watching(job_id) as signal:
            while True:
                seen = signal.version()  # before reading: a change after it wakes us
                events = self.store.events(job_id, after)
                yield from events
                if events:
                    after = events[-1].seq
                if self.store.get(job_id).state.terminal and not self.store.events(job_id, after):
                    return
                if not still_wanted() or self._stop.is_set():
                    return
                # Woken by the job's next event; the timeout only bounds how late a
                # watcher notices that its client went away.
                signal.wait(seen, timeout_s=self.poll_s)

    def rack(self, tenant: str | None = None) -> list[NodeView]:
        """Every node and socket as its agent reports it, with the health watcher's
        verdict, since when, and why (a node that does not answer lists its sockets as
        down). With `tenant`, a socket held by another tenant's job shows OTHER_TENANT
        instead of that job's id: busy, but whose is not said."""
        nodes = self.gateway.nodes()
        if self.health is not None:
            nodes = [self._with_health(v) for v in nodes]
        if tenant is None:
            return nodes
        mine = {j.id for j in self.store.list(list(ACTIVE), tenant)}
        return [
            replace(
                n,
                sockets=tuple(
                    replace(s, job_id=OTHER_TENANT) if s.job_id and s.job_id not in mine else s
                    for s in n.sockets
                ),
            )
            for n in nodes
        ]

    def _with_health(self, view: NodeView) -> NodeView:
        assert self.health is not None
        node = self.health.node(view.index)
        sockets = view.sockets or tuple(
            SocketView(str(s), view.index, False, reason=view.error)
            for s in self._topology.sockets
            if s.node == view.index
        )
        merged = []
        for s in sockets:
            h = self.health.socket(s.socket_id)
            merged.append(
                replace(
                    s,
                    healthy=s.healthy and h.healthy,
                    reason=""
                    if s.healthy and h.healthy
                    else (h.reason if not h.healthy else s.reason),
                    since_s=h.since_s,
                )
            )
        why = view.error or ("" if node.healthy else node.reason)
        return replace(
            view,
            healthy=view.healthy and node.healthy,
            error=why,
            since_s=node.since_s,
            sockets=tuple(merged),
        )

    # ------------------------------------------------------------------ scheduling

    def _kick(self) -> None:
        with self._wake:
            self._wake.notify_all()

    def _notify(self, job_id: str) -> None:
        """`job_id` has a new event: wake its watchers."""
        self._signals.notify(job_id)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.schedule_once()
            except Exception:  # the loop must survive anything; the next round retries
                log.exception("scheduling round failed")
            with self._wake:
                self._wake.wait(timeout=self.poll_s)

    def schedule_once(self) -> int:
        """One scheduling round; returns how many jobs it started."""
        began = time.time_ns()
        if not self.store.any_queued():
            return 0
        # The cheap questions first: while every socket is taken, a round can place
        # nothing, so it neither asks the agents nor reads the queue. (Such a round
        # counts against no job's starvation guard either: nothing overtakes anyone.)
        active = self.store.list(list(ACTIVE))
        busy = {s for j in active for s in j.sockets}
        if len(busy) >= self.platform.sockets:
            return 0
        nodes = self.gateway.nodes()
        # A socket an agent reports held is busy, whatever the store says.
        busy |= {s.socket_id for n in nodes for s in n.sockets if s.job_id}
        unhealthy = self._unhealthy(nodes)
        if len(busy | unhealthy) >= self.platform.sockets:
            return 0
        allowance = {t: q - self._in_use(t, active) for t, q in self.quotas.items()}
        now = time.monotonic()
        # The queue is read a page at a time, as far as the round gets (all 1-socket jobs
        # and 3 free sockets: one page, however long the queue). A job backing off after
        # a failed attempt is skipped until its time comes.
        walked: dict[str, Job] = {}

        def queued() -> Iterator[Job]:
            for job in self.store.queued_lazily():
                if self._not_before.get(job.id, 0.0) > now:
                    continue
                walked[job.id] = job
                yield job

        placements = self.scheduler.schedule(
            queued(), busy, unhealthy, allowance, still_queued=self.store.queued_ids()
        )
        if not placements:
            return 0
        started = 0
        by_id = walked
        with self._tracer.start_as_current_span(names.SPAN_SCHEDULE, start_time=began) as span:
            for p in placements:
                if self._place(by_id[p.job_id], p.sockets):
                    started += 1
            span.set_attribute(names.ATTR_JOBS_PLACED, started)
        return started

    def _in_use(self, tenant: str, active: Sequence[Job] | None = None) -> int:
        """Sockets the tenant's SCHEDULED and RUNNING jobs hold."""
        jobs = self.store.list(list(ACTIVE), tenant) if active is None else active
        return sum(j.spec.sockets for j in jobs if j.tenant == tenant)

    def _release_orphans(self) -> None:
        """Release sockets the agents still hold for jobs that are no longer scheduled or
        running (a crash left them reserved; recovery cleared only the store)."""
        active = {j.id for j in self.store.list(list(ACTIVE))}
        for node in self.gateway.nodes():
            orphans: dict[str, list[str]] = {}
            for s in node.sockets:
                if s.job_id and s.job_id not in active:
                    orphans.setdefault(s.job_id, []).append(s.socket_id)
            for job_id, sockets in orphans.items():
                self._release(node.index, job_id, sockets)

    def _unhealthy(self, nodes: list[NodeView]) -> set[str]:
        bad: set[str] = set()
        for node in nodes:
            if not node.healthy and not node.sockets:
                bad |= {str(s) for s in self._topology.sockets if s.node == node.index}
            bad |= {s.socket_id for s in node.sockets if not s.healthy}
        if self.health is not None:
            bad |= self.health.unhealthy()
        return bad

    def _by_node(self, sockets: Sequence[str]) -> dict[int, list[str]]:
        nodes: dict[int, list[str]] = {}
        for sid in sockets:
            nodes.setdefault(SocketId.parse(sid).node, []).append(sid)
        return nodes

    def _place(self, job: Job, sockets: Sequence[str]) -> bool:
        """Reserve a placement on every node (all or none), then mark the job SCHEDULED
        and hand it to a worker."""
        held: list[tuple[int, list[str]]] = []
        try:
            for node, ids in self._by_node(sockets).items():
                self.gateway.reserve(node, job.id, ids)
                held.append((node, ids))
            self.store.transition(job.id, JobState.SCHEDULED, sockets=tuple(sockets))
            with self._runs_lock:
                self._runs[job.id] = _Run(job.id, tuple(sockets), time.monotonic())
            self._not_before.pop(job.id, None)
        except (SocketBusy, LinkFailure, IllegalTransition) as e:
            for node, ids in held:
                self._release(node, job.id, ids)
            if not isinstance(e, IllegalTransition):
                self.store.add_event(job.id, "placement", {"error": str(e)})
                self._notify(job.id)
            return False
        self._notify(job.id)
        # The job's span links to the round that placed it.
        self._workers.submit(self._run, job.id, trace.get_current_span().get_span_context())
        return True

    def _release(self, node: int, job_id: str, sockets: Sequence[str]) -> None:
        try:
            self.gateway.release(node, job_id, sockets)
        except RdurackError as e:  # a dead agent frees its sockets anyway
            log.warning("release of %s on node %d failed: %s", job_id, node, e)

    # ------------------------------------------------------------------ running

    def _run(self, job_id: str, placed_by: trace.SpanContext | None = None) -> None:
        job = self.store.get(job_id)
        nodes = self._by_node(job.sockets)
        w = job.spec.workload
        links = [trace.Link(placed_by)] if placed_by is not None and placed_by.is_valid else []
        what: dict[str, str] = {names.ATTR_PLATFORM: job.spec.platform}
        if isinstance(w, CoeWorkload):
            what[names.ATTR_JOB_MODEL] = w.expert_model
        else:
            what[names.ATTR_JOB_MODEL] = w.model
        if isinstance(w, KernelWorkload):
            what[names.ATTR_JOB_PHASE] = w.phase.value
        span = self._tracer.start_span(
            names.SPAN_JOB,
            links=links,
            attributes={
                names.ATTR_JOB_ID: job_id,
                names.ATTR_JOB_SOCKETS: list(job.sockets),
                names.ATTR_JOB_ATTEMPT: job.attempts + 1,
                **what,
            },
        )
        with trace.use_span(span, end_on_exit=True):
            self._run_job(job, nodes)

    def _run_job(self, job: Job, nodes: dict[int, list[str]]) -> None:
        job_id = job.id
        with self._runs_lock:
            run = self._runs.get(job_id) or _Run(job_id, job.sockets, time.monotonic())
        try:
            if job.state is not JobState.SCHEDULED or job_id in self._cancelled:
                return
            self._check(run)
            self._execute(job, nodes, run)
        except IllegalTransition:
            pass  # cancelled while running: the store already says so
        except Exception as e:
            lost = self._lost(run)
            if lost is not None:  # a socket or agent of the job died: not the job's fault
                self._failed(job_id, lost, retry=True)
            elif isinstance(e, LinkFailure | SocketBusy):
                self._failed(job_id, str(e), retry=True)
            elif isinstance(e, RdurackError):
                self._failed(job_id, str(e), retry=False)
            else:  # never leave a job hanging in RUNNING
                log.exception("job %s failed", job_id)
                self._failed(job_id, f"internal error: {type(e).__name__}: {e}", retry=False)
        finally:
            with self._runs_lock:
                self._runs.pop(job_id, None)
            for node, ids in nodes.items():
                self._release(node, job_id, ids)
            self._notify(job_id)
            self._kick()

    def _lost(self, run: _Run) -> str | None:
        """Why the run was lost to a fault (a socket or agent of the job died or was
        restarted since it was placed), or None."""
        if run.abort is not None:
            return run.abort
        if self.health is None:
            return None
        return self.health.trouble_since(run.sockets, run.started)

    def _check(self, run: _Run) -> None:
        """Between a job's steps: stop a run the health watcher aborted."""
        if run.abort is not None:
            raise _Aborted(run.abort)

    # ------------------------------------------------------------------ faults

    def _on_health(self, changes: list[Change]) -> None:
        """The health watcher's report: stop the runs a lost socket or agent (dead,
        restarted) was part of; schedule again (sockets may be back in the pool)."""
        down: dict[str, str] = {}  # socket -> why
        for c in changes:
            if not c.lost:
                continue
            ids = [c.socket_id] if c.socket_id else self._node_sockets(c.node)
            for sid in ids:
                down.setdefault(sid, f"{c.what}: {c.reason}")
        with self._runs_lock:
            runs = list(self._runs.values())
        for run in runs:
            hit = [s for s in run.sockets if s in down]
            if hit:
                self._stop_run(run, hit, down[hit[0]])
        self._kick()

    def _node_sockets(self, node: int) -> list[str]:
        return [str(s) for s in self._topology.sockets if s.node == node]

    def _stop_run(self, run: _Run, hit: list[str], reason: str) -> None:
        """Stop a run `hit` sockets of which are down; a CoE run with replicas left
        loses only the replicas hit (the engine re-routes their requests)."""
        if run.replicas is not None:
            lost = {i for i, (_, ids) in enumerate(run.replicas) if set(ids) & set(hit)}
            if len(set(run.lost) | lost) < len(run.replicas):
                for i in sorted(lost - set(run.lost)):
                    run.lost[i] = reason
                    node, ids = run.replicas[i]
                    log.warning("job %s: replica %d lost: %s", run.job_id, i, reason)
                    self._abort_calls(run.job_id, {node: ids}, reason)
                return
        if run.abort is None:
            run.abort = reason
            log.warning("job %s: stopped: %s", run.job_id, reason)
            self._abort_calls(run.job_id, self._by_node(run.sockets), reason)

    def _abort_calls(self, job_id: str, nodes: dict[int, list[str]], reason: str) -> None:
        """Abort a job's calls in flight on the sockets of nodes that are up (in the
        background: an agent's answer must not hold up the caller)."""

        def abort() -> None:
            for node, ids in nodes.items():
                if self.health is not None and not self.health.node(node).healthy:
                    continue  # its calls fail on their own: the agent is gone
                try:
                    self.gateway.abort(node, job_id, ids, reason)
                except RdurackError as e:
                    log.warning("abort of %s on node %d failed: %s", job_id, node, e)

        threading.Thread(target=abort, name=f"abort-{job_id}", daemon=True).start()

    def _on_nodes(
        self,
        job_id: str,
        nodes: dict[int, list[str]],
        call: Callable[[int, list[str]], list[T]],
    ) -> list[T]:
        """`call(node, sockets)` on every node of a job at once, each in a copy of this
        context (the job's span is its parent); their results in node order. The first
        failure aborts the calls still running on the other nodes (they would wait for
        its messages until their timeout) and is raised."""
        with ThreadPoolExecutor(max_workers=len(nodes)) as pool:
            futures = {
                node: pool.submit(contextvars.copy_context().run, call, node, ids)
                for node, ids in nodes.items()
            }
            done, _ = wait(futures.values(), return_when=FIRST_EXCEPTION)
            failed = next((f.exception() for f in done if f.exception() is not None), None)
            if failed is not None:
                why = f"another node of the job failed: {failed}"
                for node, f in futures.items():
                    if not f.done():
                        with contextlib.suppress(RdurackError):
                            self.gateway.abort(node, job_id, nodes[node], why)
                wait(futures.values())
                raise failed
            return [r for f in futures.values() for r in f.result()]

    def _start(self, job: Job) -> tuple[Job, int]:
        """Move the job to RUNNING at the latest clock of its sockets (clocks meet)."""
        clocks = {s.socket_id: s.clock_ns for n in self.gateway.nodes() for s in n.sockets}
        start = max(clocks.get(s, 0) for s in job.sockets)
        job = self.store.transition(
            job.id, JobState.RUNNING, attempts=job.attempts + 1, emulated_start_ns=start
        )
        self._notify(job.id)
        return job, start

    def _execute(self, job: Job, nodes: dict[int, list[str]], run: _Run) -> None:
        if isinstance(job.spec.workload, CoeWorkload):
            self._execute_coe(job, job.spec.workload, run)
            return
        if isinstance(job.spec.workload, TrainingWorkload):
            self._execute_training(job, job.spec.workload, run)
            return
        job, start = self._start(job)
        w = job.spec.workload
        assert isinstance(w, KernelWorkload)
        total = w.output_tokens if w.phase is Phase.DECODE else 1
        chunks = _split(total, min(self.progress_chunks, total))
        now, done, calls, hbm_bytes, flops = start, 0, 0, 0, 0
        for steps in chunks:
            if job.id in self._cancelled:
                return
            self._check(run)

            def part(n: int, ids: list[str], steps: int = steps, at: int = now) -> list[KernelRun]:
                return self.gateway.run_kernel(n, job.id, ids, w, steps, at)

            runs = self._on_nodes(job.id, nodes, part)
            now = max(r.end_ns for r in runs)
            done += steps
            calls += max(r.kernel_calls for r in runs)  # per socket: all run the same kernels
            hbm_bytes += max(r.hbm_bytes for r in runs)
            flops += max(r.flops for r in runs)
            self.store.add_event(
                job.id,
                "progress",
                {
                    "fraction": done / total,
                    "message": f"{done} of {total} steps",
                    "emulated_ns": now,
                },
            )
            self._notify(job.id)
        result = self._result(w, now - start, total, calls, hbm_bytes, flops)
        # The result event first: a watcher stops once the job is finished.
        self.store.add_event(job.id, "result", result)
        self.store.transition(job.id, JobState.SUCCEEDED, result=result, emulated_end_ns=now)

    def _execute_coe(self, job: Job, w: CoeWorkload, run: _Run) -> None:
        job, start = self._start(job)
        platform = job_platform(self.platform, job.spec.platform)
        replicas = replica_groups(job.sockets, w.tensor_parallel or platform.node.sockets)
        run.replicas = replicas
        router = Router.for_catalog(w.num_experts)
        requests = build_requests(w, router)
        marks = {
            round(len(requests) * k / self.progress_chunks)
            for k in range(1, self.progress_chunks + 1)
        }

        def progress(done: int, total: int, emulated_ns: int) -> None:
            if job.id in self._cancelled:
                raise _Cancelled
            self._check(run)
            if done in marks or done == total:
                self.store.add_event(
                    job.id,
                    "progress",
                    {
                        "fraction": done / total,
                        "message": f"{done} of {total} requests",
                        "emulated_ns": start + emulated_ns,
                    },
                )
                self._notify(job.id)

        engine = CoeEngine(
            w,
            platform,
            self.models,
            router.names,
            GatewayReplicas(self.gateway, job.id, replicas, run.lost.get),
            range(len(replicas)),
            functional=job.spec.payload_mode == "functional",
            start_ns=start,
            progress=progress,
        )
        try:
            report = engine.run(requests)
        except _Cancelled:
            return
        except CoeOutOfMemory as e:
            result = {"kind": "coe_inference", **e.report.to_dict()}
            self.store.add_event(job.id, "result", result)
            self.store.transition(job.id, JobState.FAILED, error=e.report.oom_reason, result=result)
            return
        result = {"kind": "coe_inference", **report.to_dict()}
        self.store.add_event(job.id, "result", result)
        end = start + round(report.emulated_s * 1e9)
        self.store.transition(job.id, JobState.SUCCEEDED, result=result, emulated_end_ns=end)

    def _execute_training(self, job: Job, w: TrainingWorkload, run: _Run) -> None:
        """Segments of steps on every node at once (the ranks meet over the links);
        progress and cancellation between segments. A retried job resumes from the last
        checkpoint in its directory."""
        job, start = self._start(job)
        platform = job_platform(self.platform, job.spec.platform)
        ranks = ranks_of(list(job.sockets))
        links = {s.socket_id: s.link_address for n in self.gateway.nodes() for s in n.sockets}
        group = [(sid, links.get(sid, "")) for sid in ranks]
        nodes = self._by_node(ranks)
        checkpoints = str(self.checkpoint_dir / job.id) if self.checkpoint_dir else ""
        name = "" if platform is self.platform else platform.name
        losses: list[float] = []
        segment, first = 1, True  # the first segment is one step: it tells the total
        while True:
            if job.id in self._cancelled:
                return
            self._check(run)

            def part(
                n: int, ids: list[str], steps: int = segment, at: int = start if first else 0
            ) -> list[RankReport]:
                return self.gateway.train(
                    n,
                    job.id,
                    ids,
                    w,
                    group,
                    platform_name=name,
                    steps=steps,
                    start_ns=at,
                    checkpoint_dir=checkpoints,
                )

            reports = self._on_nodes(job.id, nodes, part)
            first = False
            lead = min(reports, key=lambda r: r.rank)
            losses += [x for x in lead.losses if not math.isnan(x)]  # timing mode: none
            loss = f", loss {losses[-1]:.4f}" if losses else ""
            # Progressive: the total is every stage's budget; blocks freeze earlier.
            of = f"at most {lead.total}, {lead.stage}" if w.strategy != "full" else lead.total
            self.store.add_event(
                job.id,
                "progress",
                {
                    "fraction": lead.step / lead.total if lead.total else 1.0,
                    "message": f"step {lead.step} of {of}{loss}",
                    "emulated_ns": max(r.end_ns for r in reports),
                },
            )
            self._notify(job.id)
            if all(r.finished for r in reports):
                break
            segment = max(1, lead.total // self.progress_chunks)
        result = training_result(w, platform, reports, losses, start)
        self.store.add_event(job.id, "result", result)
        end = max(r.end_ns for r in reports)
        self.store.transition(job.id, JobState.SUCCEEDED, result=result, emulated_end_ns=end)

    def _result(
        self,
        w: KernelWorkload,
        emulated_ns: int,
        steps: int,
        calls: int,
        hbm_bytes: int,
        flops: int,
    ) -> dict[str, Any]:
        """A kernel job's result; bytes, calls and FLOPs are per socket."""
        emulated_s = emulated_ns * 1e-9
        socket = self.platform.socket
        peak = socket.hbm.bandwidth_bytes_per_s
        result: dict[str, Any] = {
            "emulated_s": emulated_s,
            "kernel_calls": calls,
            "hbm_bandwidth_utilization": hbm_bytes / (emulated_s * peak) if emulated_s else 0.0,
            "compute_utilization": (
                flops / (emulated_s * socket.peak_flops_per_s) if emulated_s else 0.0
            ),
        }
        if w.phase is Phase.DECODE:
            result["tokens_per_s"] = w.batch_size * steps / emulated_s if emulated_s else 0.0
        return result

    def _failed(self, job_id: str, error: str, retry: bool) -> None:
        trace.get_current_span().set_status(trace.StatusCode.ERROR, error)  # the job's span
        job = self.store.get(job_id)
        try:
            if retry and job.state in ACTIVE and job.attempts < self.max_attempts:
                self.store.transition(
                    job_id, JobState.PENDING, sockets=(), reason=f"retrying after: {error}"
                )
                wait_s = self.retry_backoff_s * 2 ** max(0, job.attempts - 1)
                self._not_before[job_id] = time.monotonic() + wait_s
            elif not job.state.terminal:
                self.store.transition(job_id, JobState.FAILED, error=error)
        except IllegalTransition:
            pass  # cancelled meanwhile


class _Cancelled(Exception):
    """Raised from a CoE job's progress hook to stop serving a cancelled job."""


class _Aborted(LinkFailure):
    """A run the health watcher stopped (a socket or agent of the job died)."""


def _split(total: int, parts: int) -> list[int]:
    base, extra = divmod(total, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]
