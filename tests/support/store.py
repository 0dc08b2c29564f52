"""Jobs for the job store's tests (tests/unit/test_store*.py)."""

from __future__ import annotations

from rdurack.orchestrator.jobs import JobSpec, JobState, KernelWorkload
from rdurack.orchestrator.results import KernelResult
from rdurack.orchestrator.store import JobStore
from rdurack.rack.kernels import Phase

S = JobState
DONE = KernelResult(emulated_s=1e-3, kernel_calls=3)


def spec(name: str = "job", priority: int = 0, sockets: int = 8, **workload: object) -> JobSpec:
    return JobSpec(
        name=name,
        priority=priority,
        workload=KernelWorkload(
            model="llama3-8b", phase=Phase.DECODE, num_sockets=sockets, **workload
        ),
    )


def states(store: JobStore, job_id: str) -> list[str]:
    return [e.payload["state"] for e in store.events(job_id) if e.kind == "state"]


def run(store: JobStore, job_id: str, sockets: tuple[str, ...] = ("n0.s0",)) -> None:
    """PENDING -> SCHEDULED -> RUNNING, started once more."""
    store.transition(job_id, S.SCHEDULED, sockets=sockets)
    attempts = store.get(job_id).attempts
    store.transition(job_id, S.RUNNING, attempts=attempts + 1, emulated_start_ns=1_000)
