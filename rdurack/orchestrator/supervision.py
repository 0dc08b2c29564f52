"""Run supervision: each placed job's run, from its worker to its end, and what faults
do to it.

A placed job is handed to a worker (`hand_over`), which runs it inside the job's span
(linked to the scheduling round that placed it) through its kind (kinds/), and at the
end always releases its sockets. A run that fails is retried by policy: a lost socket
or agent, a link failure or a busy socket is not the job's fault, and the job goes back
to PENDING (while it has been started fewer than `max_attempts` times), to be placed
again once `retry_backoff_s`, doubled with each attempt it made, has passed on the
orchestrator's clock (so a fault that lasts a while does not use up its attempts at
once); any other error fails the job. A cancelled job's run stops quietly.

A run writes through the store of the leader's term it was placed in (`store`, set by
the orchestrator when its term begins): if the term ends, the run's writes fail
(NotLeader) and it stops without writing; `abort_all` stops every run at once, and the
next leader recovers their jobs.

Faults (docs/faults.md): the health watcher's report (`on_health`) stops at once every
run that a lost socket or agent (dead, restarted) was part of: its calls in flight on
the survivors are aborted, and the job is retried elsewhere. A CoE job with several
replicas loses only the replica that died: its requests are re-routed to the others.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor

from opentelemetry import trace

from rdurack.errors import LinkFailure, NotLeader, RdurackError, SocketBusy
from rdurack.orchestrator.gateway import NodeGateway
from rdurack.orchestrator.health import Change, HealthWatcher
from rdurack.orchestrator.jobs import IllegalTransition, Job, JobState
from rdurack.orchestrator.kinds.contract import Cancelled, JobKind, JobRun, Run, by_node
from rdurack.orchestrator.store import JobStore
from rdurack.rack.topology import Topology
from rdurack.telemetry import names

log = logging.getLogger(__name__)
ACTIVE = (JobState.SCHEDULED, JobState.RUNNING)


def release(gateway: NodeGateway, node: int, job_id: str, sockets: Sequence[str]) -> None:
    """Release a job's sockets on one node; an agent that fails to is only logged."""
    try:
        gateway.release(node, job_id, sockets)
    except RdurackError as e:  # a dead agent frees its sockets anyway
        log.warning("release of %s on node %d failed: %s", job_id, node, e)


class Supervisor:
    """The runs of the jobs this orchestrator placed (see the module docstring).

    `kinds`: the job kinds by workload kind; `health`: the watcher whose reports
    `on_health` takes (None: no watcher); `clock`: monotonic seconds, the watcher's;
    `notify(job_id)`: the job has a new event; `kick()`: schedule again soon."""

    def __init__(
        self,
        store: JobStore,
        gateway: NodeGateway,
        topology: Topology,
        kinds: Mapping[str, JobKind],
        health: HealthWatcher | None,
        *,
        max_attempts: int,
        retry_backoff_s: float,
        clock: Callable[[], float],
        tracer: trace.Tracer,
        notify: Callable[[str], None],
        kick: Callable[[], None],
    ) -> None:
        self.store = store
        self.gateway = gateway
        self.kinds = kinds
        self.health = health
        self.max_attempts = max_attempts
        self.retry_backoff_s = retry_backoff_s
        self._topology = topology
        self._clock = clock
        self._tracer = tracer
        self._notify = notify
        self._kick = kick
        self._runs: dict[str, Run] = {}
        self._lock = threading.Lock()  # guards _runs
        self._idle = threading.Condition(self._lock)  # notified as each run ends
        self._not_before: dict[str, float] = {}  # job -> clock s it may be placed again
        self._cancelled: set[str] = set()
        workers = len(topology.sockets)  # a socket serves one job at a time
        self._workers = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="job")

    # ------------------------------------------------------------------ placement side

    def placed(self, job_id: str, sockets: Sequence[str]) -> None:
        """A job was placed (and is SCHEDULED): from now on faults may stop its run."""
        with self._lock:
            self._runs[job_id] = Run(job_id, tuple(sockets), self._clock())
        self._not_before.pop(job_id, None)

    def backing_off(self, job_id: str, now: float) -> bool:
        """Whether a retried job still waits its backoff at clock `now`."""
        return self._not_before.get(job_id, 0.0) > now

    def hand_over(self, job_id: str, placed_by: trace.SpanContext | None) -> None:
        """Run a placed job on a worker, writing through the store of the term that
        placed it; its span links to `placed_by` (the round)."""
        self._workers.submit(self._run, job_id, placed_by, self.store)

    def cancel(self, job_id: str) -> None:
        """The job was cancelled: its run stops at its next step."""
        self._cancelled.add(job_id)

    def sync_cancelled(self) -> None:
        """Stop the runs of jobs cancelled through another replica (the store says so)."""
        with self._lock:
            running = list(self._runs)
        self._cancelled.update(self.store.cancelled(running))

    def abort_all(self, reason: str) -> None:
        """Stop every run now (this replica's term ended): calls in flight are aborted."""
        with self._lock:
            runs = list(self._runs.values())
        for run in runs:
            self._stop_run(run, list(run.sockets), reason)

    def wait_idle(self, timeout_s: float) -> bool:
        """Wait until no run is in progress (each released its sockets); False if some
        still are after `timeout_s`."""
        with self._idle:
            return self._idle.wait_for(lambda: not self._runs, timeout_s)

    def stop(self) -> None:
        """Wait for the runs in progress to end."""
        self._workers.shutdown(wait=True, cancel_futures=False)

    # ------------------------------------------------------------------ a run

    def _run(self, job_id: str, placed_by: trace.SpanContext | None, store: JobStore) -> None:
        job = store.get(job_id)
        kind = self.kinds[job.spec.workload.kind]
        links = [trace.Link(placed_by)] if placed_by is not None and placed_by.is_valid else []
        span = self._tracer.start_span(
            names.SPAN_JOB,
            links=links,
            attributes={
                names.ATTR_JOB_ID: job_id,
                names.ATTR_JOB_SOCKETS: list(job.sockets),
                names.ATTR_JOB_ATTEMPT: job.attempts + 1,
                names.ATTR_PLATFORM: job.spec.platform,
                **kind.attributes(job.spec),
            },
        )
        with trace.use_span(span, end_on_exit=True):
            self._run_job(job, kind, store)

    def _run_job(self, job: Job, kind: JobKind, store: JobStore) -> None:
        job_id = job.id
        with self._lock:
            run = self._runs.get(job_id) or Run(job_id, job.sockets, self._clock())
        try:
            if job.state is not JobState.SCHEDULED:
                return
            this = JobRun(job, run, store, self.gateway, self._notify, self._is_cancelled)
            this.check()
            kind.execute(this)
        except (Cancelled, IllegalTransition):
            pass  # cancelled before or while running: the store already says so
        except NotLeader as ended:  # a write of the run found its term over
            log.warning("job %s: run stopped: %s", job_id, ended)
        except Exception as e:
            lost = self._lost(run)
            try:
                if lost is not None:  # a socket or agent of the job died: not its fault
                    self._failed(store, job_id, lost, retry=True)
                elif isinstance(e, LinkFailure | SocketBusy):
                    self._failed(store, job_id, str(e), retry=True)
                elif isinstance(e, RdurackError):
                    self._failed(store, job_id, str(e), retry=False)
                else:  # never leave a job hanging in RUNNING
                    log.exception("job %s failed", job_id)
                    why = f"internal error: {type(e).__name__}: {e}"
                    self._failed(store, job_id, why, retry=False)
            except NotLeader as ended:  # the next leader recovers the job
                log.warning("job %s: run stopped: %s", job_id, ended)
        finally:
            for node, ids in by_node(job.sockets).items():
                release(self.gateway, node, job_id, ids)
            with self._idle:  # over once its sockets are released (`wait_idle`)
                if self._runs.get(job_id) is run:  # not a later placement of the job
                    del self._runs[job_id]
                self._idle.notify_all()
            self._notify(job_id)
            self._kick()

    def _is_cancelled(self, job_id: str) -> bool:
        return job_id in self._cancelled

    def _lost(self, run: Run) -> str | None:
        """Why the run was lost to a fault (a socket or agent of the job died or was
        restarted since it was placed), or None."""
        if run.abort is not None:
            return run.abort
        if self.health is None:
            return None
        return self.health.trouble_since(run.sockets, run.started)

    def _failed(self, store: JobStore, job_id: str, error: str, retry: bool) -> None:
        trace.get_current_span().set_status(trace.StatusCode.ERROR, error)  # the job's span
        job = store.get(job_id)
        try:
            if retry and job.state in ACTIVE and job.attempts < self.max_attempts:
                store.transition(
                    job_id, JobState.PENDING, sockets=(), reason=f"retrying after: {error}"
                )
                wait_s = self.retry_backoff_s * 2 ** max(0, job.attempts - 1)
                self._not_before[job_id] = self._clock() + wait_s
            elif not job.state.terminal:
                store.transition(job_id, JobState.FAILED, error=error)
        except IllegalTransition:
            pass  # cancelled meanwhile

    # ------------------------------------------------------------------ faults

    def on_health(self, changes: list[Change]) -> None:
        """The health watcher's report: stop the runs a lost socket or agent (dead,
        restarted) was part of; schedule again (sockets may be back in the pool)."""
        down: dict[str, str] = {}  # socket -> why
        for c in changes:
            if not c.lost:
                continue
            ids = [c.socket_id] if c.socket_id else self._node_sockets(c.node)
            for sid in ids:
                down.setdefault(sid, f"{c.what}: {c.reason}")
        with self._lock:
            runs = list(self._runs.values())
        for run in runs:
            hit = [s for s in run.sockets if s in down]
            if hit:
                self._stop_run(run, hit, down[hit[0]])
        self._kick()

    def _node_sockets(self, node: int) -> list[str]:
        return [str(s) for s in self._topology.sockets if s.node == node]

    def _stop_run(self, run: Run, hit: list[str], reason: str) -> None:
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
            self._abort_calls(run.job_id, by_node(run.sockets), reason)

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
