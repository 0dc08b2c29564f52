"""The orchestrator: accepts jobs, schedules them on the rack, runs them, records all.

`Orchestrator` is the one class its callers use: api/job_service.py serves it over
gRPC, and it reaches node agents only through a NodeGateway. This module holds its API
(submit, get, jobs, cancel, watch, rack) and what a tenant may see; it composes the
rest: the job kinds (kinds/, a registry keyed by the JobSpec workload's `kind`), the
scheduling round (scheduling.py), run supervision under faults (supervision.py) and
the health watcher (health.py). Every state change goes through the job store (written
before it is acknowledged) and its transition table, so a cancelled or finished job is
never overwritten by a late worker.

Started, one scheduling thread runs a round whenever something changed (and every
`poll_s`), the health watcher polls the agents on its own thread, and a pool of workers
runs the placed jobs. Started without them (`start(background=False)`), the caller
steps the rounds itself: `schedule_once()` and `supervise_once()`.

Replicas (leadership.py): several orchestrators may share one job store. Each serves
reads and watches and accepts submissions and cancellations; only the one that holds
the store's lease, the leader, schedules and runs jobs, through a view of the store
fenced by its term. A replica that becomes leader first recovers what the previous
leader left scheduled or running (as a restarted orchestrator does); one whose term
ends aborts its runs, which the next leader recovers. Jobs submitted to a follower
reach the leader's queue through the store, at its next round (`poll_s` at most).

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
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Literal

from opentelemetry import trace

from rdurack.errors import (
    InvalidRequest,
    NotLeader,
    PermissionDenied,
    QuotaExceeded,
    UnknownName,
)
from rdurack.orchestrator.gateway import NodeGateway, NodeView, SocketView
from rdurack.orchestrator.health import DEAD_AFTER_S, INTERVAL_S, Change, HealthWatcher
from rdurack.orchestrator.jobs import Job, JobSpec, JobState
from rdurack.orchestrator.kinds.coe import CoeKind
from rdurack.orchestrator.kinds.contract import JobKind, KindContext
from rdurack.orchestrator.kinds.endpoint import EndpointKind
from rdurack.orchestrator.kinds.kernel import KernelKind
from rdurack.orchestrator.kinds.training import TrainingKind
from rdurack.orchestrator.leadership import LEASE_TTL_S, Elector
from rdurack.orchestrator.scheduler import Scheduler
from rdurack.orchestrator.scheduling import Rounds
from rdurack.orchestrator.signals import JobSignals
from rdurack.orchestrator.store import Event, JobStore
from rdurack.orchestrator.store.lease import Term
from rdurack.orchestrator.supervision import ACTIVE, Supervisor
from rdurack.rack.models import builtin_models
from rdurack.rack.spec import PlatformSpec
from rdurack.rack.topology import Topology
from rdurack.telemetry import names
from rdurack.telemetry.served import PassesServed
from rdurack.workloads.serving.stream.pricing import Pass

log = logging.getLogger(__name__)
OTHER_TENANT = "(another tenant's job)"  # what a tenant sees of a socket it does not hold


class Orchestrator:
    """Jobs on one rack, from submission to their result (the module docstring)."""

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
        clock: Callable[[], float] = time.monotonic,
        replica: str = "orchestrator",
        lease_ttl_s: float = LEASE_TTL_S,
    ) -> None:
        """`checkpoint_dir`: where training jobs checkpoint (a directory per job), on a
        filesystem every node agent sees; None: training jobs do not checkpoint.
        `quotas`: tenant -> the sockets its active jobs may hold (module docstring).
        `heartbeat_s`: how often the health watcher polls the agents (None: no watcher);
        `dead_after_s`: how long an agent may be silent before it counts as down.
        `retry_backoff_s`: a retried job waits this long before it is placed again,
        doubled with each attempt it has made (so a fault that lasts a while does not
        use up its attempts at once).
        `tracer_provider`: where its spans go (default: the process's global one).
        `clock`: monotonic seconds for backoffs and health deadlines (a test's own clock
        lets it say how much time passed between the rounds it runs).
        `replica`: this orchestrator's name among the replicas sharing the store (its
        address); `lease_ttl_s`: how long a silent leader keeps the lease."""
        self.store = store
        self.gateway = gateway
        self.platform = platform
        self.recovery = recovery
        self.poll_s = poll_s
        self.quotas = dict(quotas or {})
        self.models = builtin_models()
        self.scheduler = Scheduler(
            platform.nodes_total, platform.node.sockets, nodes_per_rack=platform.nodes
        )
        self._topology = Topology(platform)
        context = KindContext(platform, self.models, self.scheduler, progress_chunks)
        self._training = TrainingKind(context, checkpoint_dir)
        # The registry: each JobSpec workload `kind` and the kind that validates and
        # runs its jobs.
        self._endpoint = EndpointKind(context)
        self._kinds: dict[str, JobKind] = {
            "kernel": KernelKind(context),
            "coe_inference": CoeKind(context),
            "training": self._training,
            "endpoint": self._endpoint,
        }
        self.health = (
            HealthWatcher(
                gateway,
                platform,
                interval_s=heartbeat_s,
                dead_after_s=dead_after_s,
                monotonic=clock,
            )
            if heartbeat_s
            else None
        )
        self._kicked = threading.Event()  # something changed: a round is due
        self._signals = JobSignals()  # wakes a job's watchers on its new events
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # The lease is on real time (the database's clock), never on a test's `clock`.
        self.elector = Elector(store, replica, lease_ttl_s, on_change=self._kick)
        self._led: Term | None = None  # the term this replica leads in, its recovery done
        self._lead_lock = threading.Lock()  # one change of office at a time
        tracer = trace.get_tracer(names.TRACER_ORCHESTRATOR, tracer_provider=tracer_provider)
        self._supervisor = Supervisor(
            store,
            gateway,
            self._topology,
            self._kinds,
            self.health,
            max_attempts=max_attempts,
            retry_backoff_s=retry_backoff_s,
            clock=clock,
            tracer=tracer,
            notify=self._signals.notify,
            kick=self._kick,
        )
        if self.health is not None:
            self.health.on_change = self._supervisor.on_health
        self._rounds = Rounds(
            store,
            gateway,
            self._topology,
            self.scheduler,
            self._supervisor,
            self.health,
            quotas=self.quotas,
            clock=clock,
            tracer=tracer,
            notify=self._signals.notify,
        )

    @property
    def checkpoint_dir(self) -> Path | None:
        """Where training jobs checkpoint (None: they do not); may be changed between jobs."""
        return self._training.checkpoint_dir

    @checkpoint_dir.setter
    def checkpoint_dir(self, path: Path | None) -> None:
        self._training.checkpoint_dir = path

    # ------------------------------------------------------------------ lifecycle

    def start(self, *, background: bool = True) -> list[Job]:
        """Ask the agents for their health once and claim the leader's lease; if this
        replica leads, recover what a previous leader left scheduled or running and
        release the sockets the agents hold for no active job (the jobs recovered are
        returned). The lease is claimed on a thread from then on. Then (`background`)
        start the scheduling and health threads. Without them, nothing is scheduled or
        watched until the caller runs `schedule_once()` (which also follows the lease:
        a term that ended aborts the runs) or `supervise_once()` (placed jobs still run
        on the workers)."""
        if self.health is not None:
            self.health.poll_once()
            if background:
                self.health.start()
        self.elector.step()
        recovered = self._lead()
        self.elector.start()  # a renewal is not a step a test drives: a lapse aborts runs
        if background:
            self._thread = threading.Thread(target=self._loop, name="scheduler", daemon=True)
            self._thread.start()
        return recovered

    def stop(self) -> None:
        """Stop scheduling, wait for the runs in progress, then give up the lease (a
        follower takes over at once)."""
        self._stop.set()
        if self.health is not None:
            self.health.stop()
        self._kick()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._endpoint.stop()  # its holds would never end on their own
        self._supervisor.stop()
        self.elector.stop()
        self._signals.stop()

    @property
    def leading(self) -> bool:
        """Whether this replica leads (and has recovered its predecessor's jobs)."""
        return self._led is not None and self.elector.holds(self._led)

    def schedule_once(self) -> int:
        """One scheduling round (scheduling.py) if this replica leads; returns how many
        jobs it started."""
        # Cleared before the round reads anything: a change from here on, during the
        # round too, calls for the next one.
        self._kicked.clear()
        self._lead()
        if self._led is None:
            return 0
        self._supervisor.sync_cancelled()
        return self._rounds.once()

    def _lead(self) -> list[Job]:
        """Follow the elector: a term that ended aborts this replica's runs; a new one
        recovers what the previous leader left (its jobs returned)."""
        with self._lead_lock:
            term = self.elector.term()
            if term == self._led:
                return []
            if self._led is not None:
                ended, self._led = self._led, None
                self._supervisor.abort_all(
                    f"replica {ended.holder} stopped leading (term {ended.epoch} ended); "
                    "the next leader retries the job"
                )
            if term is None:
                return []
            # A new term of this replica right after its last one lapsed: the old runs
            # must release their sockets before recovery places their jobs again.
            if not self._supervisor.wait_idle(self.elector.ttl_s):
                log.warning("runs of an ended term still in progress; recovering anyway")
            store = self.store.fenced(term, self.elector.holds)
            self._supervisor.store = self._rounds.store = store
            recovered = store.recover(self.recovery, self._supervisor.max_attempts)
            self._rounds.release_orphans()
            self._led = term
            return recovered

    def supervise_once(self) -> list[Change]:
        """One health round: ask every agent, stop the runs a lost socket or agent was
        part of (supervision.py); the changes seen (none without a health watcher)."""
        return self.health.poll_once() if self.health is not None else []

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.schedule_once()
            except Exception:  # the loop must survive anything; the next round retries
                log.exception("scheduling round failed")
            self._kicked.wait(timeout=self.poll_s)

    def _kick(self) -> None:
        self._kicked.set()

    @property
    def round_due(self) -> bool:
        """Whether something that calls for a scheduling round happened since the last
        one began: the scheduling thread runs it at once rather than at its next poll."""
        return self._kicked.is_set()

    # ------------------------------------------------------------------ the API

    def validate(self, spec: JobSpec) -> None:
        """Refuse, before storing, what could never run: the wrong platform, an unknown
        model, an impossible socket count, a model that does not fit its sockets."""
        self._kinds[spec.workload.kind].validate(spec)

    def submit(
        self, spec: JobSpec, client_request_id: str | None = None, tenant: str = ""
    ) -> tuple[Job, bool]:
        """Store a job of `tenant` once it passes `validate` and the tenant's quota."""
        self.validate(spec)
        quota = self.quotas.get(tenant)
        if quota is not None and spec.sockets > quota:
            raise QuotaExceeded(tenant, spec.sockets, quota, self._rounds.in_use(tenant))
        job, created = self.store.submit(
            uuid.uuid4().hex[:12], spec, client_request_id or None, tenant
        )
        if created:
            self._signals.notify(job.id)
            if not self._rounds.full:  # a full rack waits for a socket (Rounds.full)
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
        self._supervisor.cancel(job_id)
        why = reason or "cancelled by the client"
        job = self.store.transition(job_id, JobState.CANCELLED, reason=why, error=why)
        self._signals.notify(job_id)
        self._kick()
        return job

    def run_passes(
        self,
        job_id: str,
        offset_ns: int,
        passes: Sequence[Pass],
        kv_tokens: int,
        tenant: str | None = None,
        served: PassesServed | None = None,
    ) -> tuple[list[int], int]:
        """An endpoint job's passes on its sockets (kinds/endpoint.py `run`); `served`:
        the requests each pass served, which its spans link to."""
        job = self.get(job_id, tenant)
        if not self.leading:
            leader = self.elector.leader
            raise NotLeader(
                f"replica {self.elector.holder} does not lead; "
                f"{leader or 'no replica'} does: an endpoint job's passes run on the "
                "leader, which runs the job",
                leader=leader,
            )
        if job.spec.workload.kind != "endpoint":
            raise InvalidRequest(
                f"job {job_id} is a {job.spec.workload.kind} job; passes run on endpoint jobs"
            )
        return self._endpoint.run(job_id, offset_ns, passes, kv_tokens, served)

    def events(self, job_id: str, after: int = 0) -> list[Event]:
        return self.store.events(job_id, after)

    def watch(
        self,
        job_id: str,
        after: int = 0,
        on_hang_up: Callable[[Callable[[], None]], bool] | None = None,
        tenant: str | None = None,
    ) -> Iterator[Event]:
        """Every event of a job after `after`, as they happen, until the job is finished
        (or the watcher goes away, or the orchestrator stops). `on_hang_up(f)` has `f`
        called when the watcher's client goes away, and returns False if it is gone
        already (gRPC's `context.add_callback`)."""
        if tenant is not None:
            self.get(job_id, tenant)  # not its job: fail before reading its events
        # An unknown id fails at the first read of its events, before any wait.
        with self._signals.watching(job_id) as signal:
            if on_hang_up is not None and not on_hang_up(signal.hang_up):
                return
            # A watcher its client left reads nothing more: no one would get it.
            while not signal.gone:
                seen = signal.version()  # before reading: a change after it wakes us
                events = self.store.events(job_id, after)
                yield from events
                if events:
                    after = events[-1].seq
                if self.store.get(job_id).state.terminal and not self.store.events(job_id, after):
                    return
                if self._stop.is_set():
                    return
                # Woken by the job's next event here, or by its client hanging up. The
                # timeout is for the events this replica does not see made: another
                # replica (the leader) writes them to the shared store.
                signal.wait(seen, timeout_s=self.poll_s)

    def rack(self, tenant: str | None = None) -> list[NodeView]:
        """Every node and socket as its agent reports it, with the health watcher's
        verdict, since when, and why (a node that does not answer lists its sockets as
        down). With `tenant`, a socket held by another tenant's job shows OTHER_TENANT
        instead of that job's id: busy, but whose is not said."""
        nodes = self.gateway.nodes()
        if self.health is not None:
            nodes = [self._with_health(v, self.health) for v in nodes]
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

    def _with_health(self, view: NodeView, health: HealthWatcher) -> NodeView:
        node = health.node(view.index)
        sockets = view.sockets or tuple(
            SocketView(str(s), view.index, False, reason=view.error)
            for s in self._topology.sockets
            if s.node == view.index
        )
        merged = []
        for s in sockets:
            h = health.socket(s.socket_id)
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
