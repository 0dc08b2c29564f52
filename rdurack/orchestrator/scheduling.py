"""The scheduling round: which queued jobs start now, and placing them on the rack.

A round (`Rounds.once`) asks the cheap questions first (is any job queued, is any socket
free?), then the agents (which sockets they hold, which are unhealthy, with the health
watcher's verdict), and hands the queue to the scheduler (scheduler.py: pure policy)
with each tenant's allowance (its quota less what its SCHEDULED and RUNNING jobs hold).
Each placement is reserved on every node of the job (all or none), the job marked
SCHEDULED and handed to a worker (supervision.py). A round that placed jobs is a span;
each job's span links to it. At start, `release_orphans` frees the sockets that agents
still hold for jobs no longer scheduled or running (a crash left them reserved).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping, Sequence

from opentelemetry import trace

from rdurack.errors import LinkFailure, NotLeader, SocketBusy, UnknownName
from rdurack.orchestrator.gateway import NodeGateway, NodeView
from rdurack.orchestrator.health import HealthWatcher
from rdurack.orchestrator.jobs import IllegalTransition, Job, JobState
from rdurack.orchestrator.kinds.contract import by_node
from rdurack.orchestrator.scheduler import Scheduler
from rdurack.orchestrator.store import JobStore
from rdurack.orchestrator.supervision import ACTIVE, Supervisor, release
from rdurack.rack.topology import Topology
from rdurack.telemetry import names


class Rounds:
    """Scheduling rounds on the rack of `topology` (see the module docstring).

    `quotas`: tenant -> the sockets its active jobs may hold; `clock`: monotonic
    seconds, the supervisor's (retried jobs wait their backoff on it); `notify(job_id)`:
    the job has a new event."""

    def __init__(
        self,
        store: JobStore,
        gateway: NodeGateway,
        topology: Topology,
        scheduler: Scheduler,
        supervisor: Supervisor,
        health: HealthWatcher | None,
        *,
        quotas: Mapping[str, int],
        clock: Callable[[], float],
        tracer: trace.Tracer,
        notify: Callable[[str], None],
    ) -> None:
        self.store = store
        self.gateway = gateway
        self.scheduler = scheduler
        self.supervisor = supervisor
        self.health = health
        self.quotas = quotas
        self._topology = topology
        self._sockets = len(topology.sockets)
        self._clock = clock
        self._tracer = tracer
        self._notify = notify
        # Whether the last round found every socket taken. A submission alone cannot
        # change that, so it need not call for a round: what frees a socket (a run's
        # end, a cancellation, a health change) does, and so does the next poll. Under
        # a burst of submissions to a full rack, a round per submission was a sixth of
        # the orchestrator's work per SubmitJob, and of the database's.
        self.full = False

    def once(self) -> int:
        """One scheduling round; returns how many jobs it started."""
        began = time.time_ns()
        self.full = False
        if not self.store.any_queued():
            return 0
        # The cheap questions first: while every socket is taken, a round can place
        # nothing, so it neither asks the agents nor reads the queue. (Such a round
        # counts against no job's starvation guard either: nothing overtakes anyone.)
        active = self.store.list(list(ACTIVE))
        busy = {s for j in active for s in j.sockets}
        if len(busy) >= self._sockets:
            self.full = True
            return 0
        nodes = self.gateway.nodes()
        # A socket an agent reports held is busy, whatever the store says.
        busy |= {s.socket_id for n in nodes for s in n.sockets if s.job_id}
        unhealthy = self._unhealthy(nodes)
        if len(busy | unhealthy) >= self._sockets:
            self.full = True
            return 0
        allowance = {t: q - self.in_use(t, active) for t, q in self.quotas.items()}
        now = self._clock()
        # The queue is read a page at a time, as far as the round gets (all 1-socket jobs
        # and 3 free sockets: one page, however long the queue). A job backing off after
        # a failed attempt is skipped until its time comes.
        walked: dict[str, Job] = {}

        def queued() -> Iterator[Job]:
            for job in self.store.queued_lazily():
                if self.supervisor.backing_off(job.id, now):
                    continue
                walked[job.id] = job
                yield job

        placements = self.scheduler.schedule(
            queued(), busy, unhealthy, allowance, still_queued=self._counted_and_queued()
        )
        if not placements:
            return 0
        started = 0
        with self._tracer.start_as_current_span(names.SPAN_SCHEDULE, start_time=began) as span:
            for p in placements:
                if self._place(walked[p.job_id], p.sockets):
                    started += 1
            span.set_attribute(names.ATTR_JOBS_PLACED, started)
        return started

    def _counted_and_queued(self) -> set[str]:
        """The jobs with a starvation counter that are still queued: the scheduler keeps
        the counters of these (its `still_queued` matters for those ids only). Asked
        job by job, and there are few: reading the id of every queued job made each
        round's cost grow with the queue (thousands, under a stream of submissions)."""
        still: set[str] = set()
        for job_id in list(self.scheduler.skips):
            try:
                if self.store.get(job_id).state is JobState.PENDING:
                    still.add(job_id)
            except UnknownName:
                continue
        return still

    def in_use(self, tenant: str, active: Sequence[Job] | None = None) -> int:
        """Sockets the tenant's SCHEDULED and RUNNING jobs hold (of `active`, or read)."""
        jobs = self.store.list(list(ACTIVE), tenant) if active is None else active
        return sum(j.spec.sockets for j in jobs if j.tenant == tenant)

    def release_orphans(self) -> None:
        """Release sockets the agents still hold for jobs that are no longer scheduled or
        running (a crash left them reserved; recovery cleared only the store)."""
        active = {j.id for j in self.store.list(list(ACTIVE))}
        for node in self.gateway.nodes():
            orphans: dict[str, list[str]] = {}
            for s in node.sockets:
                if s.job_id and s.job_id not in active:
                    orphans.setdefault(s.job_id, []).append(s.socket_id)
            for job_id, sockets in orphans.items():
                release(self.gateway, node.index, job_id, sockets)

    def _unhealthy(self, nodes: list[NodeView]) -> set[str]:
        bad: set[str] = set()
        for node in nodes:
            if not node.healthy and not node.sockets:
                bad |= {str(s) for s in self._topology.sockets if s.node == node.index}
            bad |= {s.socket_id for s in node.sockets if not s.healthy}
        if self.health is not None:
            bad |= self.health.unhealthy()
        return bad

    def _place(self, job: Job, sockets: Sequence[str]) -> bool:
        """Reserve a placement on every node (all or none), then mark the job SCHEDULED
        and hand it to a worker."""
        held: list[tuple[int, list[str]]] = []
        try:
            for node, ids in by_node(sockets).items():
                self.gateway.reserve(node, job.id, ids)
                held.append((node, ids))
            self.store.transition(job.id, JobState.SCHEDULED, sockets=tuple(sockets))
            self.supervisor.placed(job.id, sockets)
        except (SocketBusy, LinkFailure, IllegalTransition, NotLeader) as e:
            for node, ids in held:
                release(self.gateway, node, job.id, ids)
            if isinstance(e, NotLeader):
                raise  # the term ended: the round stops
            if not isinstance(e, IllegalTransition):
                self.store.add_event(job.id, "placement", {"error": str(e)})
                self._notify(job.id)
            return False
        self._notify(job.id)
        # The job's span links to the round that placed it.
        self.supervisor.hand_over(job.id, trace.get_current_span().get_span_context())
        return True
