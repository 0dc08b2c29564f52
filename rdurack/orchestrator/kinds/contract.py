"""The contract between the orchestrator and a job kind: what a kind does (JobKind), what
it knows of the rack (KindContext), and what it is handed to run one placed job (JobRun).

A kind's `execute` starts the job (`JobRun.start`: RUNNING at the latest emulated clock
of its sockets; clocks meet at a job's start), runs it on the node agents (`on_nodes`:
every node of the job at once; the first to fail aborts the others), calls `check`
between its steps (a cancelled job stops quietly, a run the health watcher stopped
fails as lost), reports progress, and records the result (`finish`). Run is the record
of a placed job that the health watcher may stop (supervision.py); `by_node` groups a
job's sockets by the node agent that drives them, and `workload_of` gives a kind its
own workload type.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

from rdurack.errors import LinkFailure, RdurackError
from rdurack.orchestrator.gateway import NodeGateway
from rdurack.orchestrator.jobs import Job, JobSpec, JobState
from rdurack.orchestrator.results import JobResult
from rdurack.orchestrator.scheduler import Scheduler
from rdurack.orchestrator.store import JobStore
from rdurack.rack.models import ModelSpec
from rdurack.rack.spec import PlatformSpec
from rdurack.rack.topology import SocketId

T = TypeVar("T")
W = TypeVar("W")


@dataclass(frozen=True)
class KindContext:
    """What every job kind knows of the rack it runs jobs on."""

    platform: PlatformSpec  # the rack's own
    models: dict[str, ModelSpec]  # the model presets jobs may name
    scheduler: Scheduler  # refuses sizes the rack cannot place
    progress_chunks: int  # about how many progress events a job reports


def workload_of(spec: JobSpec, kind: type[W]) -> W:
    """The spec's workload, of the type its kind handles."""
    w = spec.workload
    assert isinstance(w, kind), "the registry hands a kind its own jobs only"
    return w


@dataclass
class Run:
    """A job placed by this orchestrator and not yet finished: what the health watcher
    may stop. `abort` says why the run must stop; a CoE job's `replicas` may be lost one
    at a time (their requests re-routed) before the whole run is."""

    job_id: str
    sockets: tuple[str, ...]
    started: float  # the orchestrator's monotonic clock when it was placed, s
    abort: str | None = None
    replicas: list[tuple[int, list[str]]] | None = None  # (node, TP group) of each
    lost: dict[int, str] = field(default_factory=dict)  # replica -> why


class Cancelled(Exception):
    """The job was cancelled while it ran: its run stops (the store already says so)."""


class Aborted(LinkFailure):
    """A run the health watcher stopped (a socket or agent of the job died)."""


def by_node(sockets: Sequence[str]) -> dict[int, list[str]]:
    """Socket ids by node, each node's in the order given."""
    nodes: dict[int, list[str]] = {}
    for sid in sockets:
        nodes.setdefault(SocketId.parse(sid).node, []).append(sid)
    return nodes


class JobRun:
    """One placed job while its kind runs it: the job (as of its last move), its run
    record, and the steps every kind takes."""

    def __init__(
        self,
        job: Job,
        run: Run,
        store: JobStore,
        gateway: NodeGateway,
        notify: Callable[[str], None],
        cancelled: Callable[[str], bool],
    ) -> None:
        """`notify(job_id)`: the job has a new event (wakes its watchers);
        `cancelled(job_id)`: whether a client cancelled it."""
        self.job = job
        self.run = run
        self.store = store
        self.gateway = gateway
        self._notify = notify
        self._cancelled = cancelled

    def start(self) -> int:
        """Move the job to RUNNING at the latest clock of its sockets; that clock, ns."""
        clocks = {s.socket_id: s.clock_ns for n in self.gateway.nodes() for s in n.sockets}
        start = max(clocks.get(s, 0) for s in self.job.sockets)
        self.job = self.store.transition(
            self.job.id, JobState.RUNNING, attempts=self.job.attempts + 1, emulated_start_ns=start
        )
        self._notify(self.job.id)
        return start

    def check(self) -> None:
        """Between a job's steps: raise Cancelled for a cancelled job, Aborted for a run
        the health watcher stopped."""
        if self._cancelled(self.job.id):
            raise Cancelled
        if self.run.abort is not None:
            raise Aborted(self.run.abort)

    def progress(self, fraction: float, message: str, emulated_ns: int) -> None:
        self.store.add_event(
            self.job.id,
            "progress",
            {"fraction": fraction, "message": message, "emulated_ns": emulated_ns},
        )
        self._notify(self.job.id)

    def finish(self, result: JobResult, end_ns: int | None = None, error: str = "") -> None:
        """Record the result: SUCCEEDED at emulated `end_ns`, or FAILED with `error`."""
        # The result event first: a watcher stops once the job is finished.
        self.store.add_event(self.job.id, "result", result.model_dump(mode="json"))
        if error:
            self.store.transition(self.job.id, JobState.FAILED, error=error, result=result)
        else:
            self.store.transition(
                self.job.id, JobState.SUCCEEDED, result=result, emulated_end_ns=end_ns
            )

    def on_nodes(
        self, nodes: dict[int, list[str]], call: Callable[[int, list[str]], list[T]]
    ) -> list[T]:
        """`call(node, sockets)` on every node of the job at once, each in a copy of this
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
                            self.gateway.abort(node, self.job.id, nodes[node], why)
                wait(futures.values())
                raise failed
            return [r for f in futures.values() for r in f.result()]


class JobKind(Protocol):
    """One kind of job (the JobSpec workload's `kind`)."""

    def validate(self, spec: JobSpec) -> None:
        """Refuse, before it is stored, a job that could never run."""
        ...

    def attributes(self, spec: JobSpec) -> dict[str, str]:
        """What the job's span says about its workload (model, phase)."""
        ...

    def execute(self, job: JobRun) -> None:
        """Run the placed job to its result (the module docstring says how)."""
        ...
