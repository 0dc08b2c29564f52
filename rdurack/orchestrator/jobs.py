"""Jobs: what a client submits, the states a job moves through, and which moves are legal;
a job as the store keeps it (its result is one of results.py's models).

    PENDING ──> SCHEDULED ──> RUNNING ──> SUCCEEDED
       │            │            ├──────> FAILED
       │            │            └──────> CANCELLED
       │            └─> PENDING  (placement undone: a node refused, the orchestrator restarted)
       │                  RUNNING ─> PENDING (retried by policy after a failure or restart)
       └─> CANCELLED / FAILED (from any non-terminal state)

A job is stored (PENDING) before its submission is acknowledged; terminal states never
change again.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from rdurack.config import Config
from rdurack.errors import InvalidRequest, RdurackError
from rdurack.orchestrator.results import JobResult
from rdurack.rack.kernels import FusionPlan, Phase
from rdurack.rack.models import ExpertMapping
from rdurack.workloads.coe.spec import CoeWorkload
from rdurack.workloads.serving.batch import SERVE, ServeRequest
from rdurack.workloads.serving.speculative import SpeculativeSetting
from rdurack.workloads.serving.stream.bundle import BundleLayout
from rdurack.workloads.training.job import TrainingWorkload


class JobState(StrEnum):
    PENDING = "PENDING"  # accepted and stored, waiting for sockets
    SCHEDULED = "SCHEDULED"  # sockets chosen and reserved
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL


TERMINAL = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED})
TRANSITIONS: dict[JobState, frozenset[JobState]] = {
    JobState.PENDING: frozenset({JobState.SCHEDULED, JobState.CANCELLED, JobState.FAILED}),
    JobState.SCHEDULED: frozenset(
        {JobState.RUNNING, JobState.PENDING, JobState.CANCELLED, JobState.FAILED}
    ),
    JobState.RUNNING: frozenset(
        {JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED, JobState.PENDING}
    ),
    JobState.SUCCEEDED: frozenset(),
    JobState.FAILED: frozenset(),
    JobState.CANCELLED: frozenset(),
}


class IllegalTransition(RdurackError):
    """A job asked to move to a state the transition table does not allow."""

    def __init__(self, job_id: str, current: JobState, wanted: JobState):
        self.job_id, self.current, self.wanted = job_id, current, wanted
        allowed = ", ".join(sorted(TRANSITIONS[current])) or "none: it is finished"
        super().__init__(
            f"job {job_id} is {current}; it cannot become {wanted} (allowed: {allowed})"
        )

    def __reduce__(self) -> tuple[type, tuple[str, JobState, JobState]]:
        return (type(self), (self.job_id, self.current, self.wanted))


# ------------------------------------------------------------------ specs (what clients send)


class KernelWorkload(Config):
    """Run a model's prefill, decode or training step on N sockets (tensor parallel), or
    serve a whole batch of requests (phase "serve": the prefill, then the decode).
    Field names are those of the proto's KernelJob, so errors name what clients send."""

    kind: Literal["kernel"] = "kernel"
    model: str = Field(min_length=1, max_length=100)
    # A step's phase, or SERVE (workloads/serving/batch.py), which is not one step.
    phase: Phase | Literal["serve"]
    # The steps' plan (fused-ho when unset); a serve job's decode plan, None (unset) for
    # the platform's default.
    fusion_plan: FusionPlan | None = None
    sequence_length: int = Field(default=1024, gt=0, le=1 << 20)  # prompt, or decode context
    batch_size: int = Field(default=1, gt=0, le=4096)
    num_sockets: int = Field(default=8, gt=0, le=1024)
    output_tokens: int = Field(default=1, gt=0, le=1 << 20)  # decode, serve: tokens generated
    speculative: SpeculativeSetting | None = None  # serve only
    expert_mapping: ExpertMapping | None = None  # MoE models only; None: the default

    @model_validator(mode="before")
    @classmethod
    def _step_plan(cls, data: Any) -> Any:
        """A step's plan defaults to fused-ho; a serve job's stays unset (resolved on the
        platform that runs it)."""
        if (
            isinstance(data, dict)
            and data.get("fusion_plan") is None
            and data.get("phase") != SERVE
        ):
            return {**data, "fusion_plan": FusionPlan.FUSED_HO}
        return data

    @property
    def serves(self) -> bool:
        return self.phase == SERVE

    def step_phase(self) -> Phase:
        """The phase of its step; a serve job has none (it runs a whole batch)."""
        if isinstance(self.phase, Phase):
            return self.phase
        raise InvalidRequest("phase serve runs a whole batch, not one step")

    def serve_request(self) -> ServeRequest:
        """A serve job's batch, as `rdu predict serve` takes it."""
        return ServeRequest(
            model=self.model,
            batch_size=self.batch_size,
            prompt_tokens=self.sequence_length,
            output_tokens=self.output_tokens,
            sockets=self.num_sockets,
            plan=self.fusion_plan,
            speculative=self.speculative,
            expert_mapping=self.expert_mapping,
        )


class EndpointWorkload(Config):
    """Hold N sockets (tensor parallel) for one model of an OpenAI-compatible endpoint
    until cancelled; the endpoint runs its iterations on them (RunPasses). Field names
    are those of the proto's EndpointJob."""

    kind: Literal["endpoint"] = "endpoint"
    model: str = Field(min_length=1, max_length=100)
    num_sockets: int = Field(default=8, gt=0, le=1024)
    bundle: BundleLayout | None = None  # a CoE bundle of experts of `model`


# The kinds are the proto's JobSpec oneof names.
Workload = Annotated[
    KernelWorkload | CoeWorkload | TrainingWorkload | EndpointWorkload,
    Field(discriminator="kind"),
]


class JobSpec(Config):
    name: str = Field(default="", max_length=200)
    priority: int = Field(default=0, ge=-1000, le=1000)  # higher runs first
    platform: str = Field(default="sn40l-rack16", max_length=100)
    payload_mode: Literal["timing", "functional"] = "timing"
    workload: Workload

    @property
    def sockets(self) -> int:
        return self.workload.num_sockets


# ------------------------------------------------------------------ a job (what the store keeps)


@dataclass(frozen=True)
class Job:
    """One job as stored. Immutable: a change is a new Job from `moved` or `replace`."""

    id: str
    spec: JobSpec
    state: JobState = JobState.PENDING
    seq: int = 0  # submission order (FIFO within a priority); set by the store
    client_request_id: str | None = None  # idempotency key, unique within its tenant
    tenant: str = ""  # who submitted it; "" for none (an open rack)
    sockets: tuple[str, ...] = ()
    attempts: int = 0  # times it was started
    created_s: float = field(default_factory=time.time)  # wall clock, seconds
    updated_s: float = field(default_factory=time.time)
    started_s: float | None = None  # wall clock when it last started RUNNING
    finished_s: float | None = None  # wall clock when it reached a terminal state
    emulated_start_ns: int | None = None
    emulated_end_ns: int | None = None
    result: JobResult | None = None
    error: str = ""

    def moved(self, state: JobState, **changes: Any) -> Job:
        """This job in `state`, if the transition table allows it."""
        if state not in TRANSITIONS[self.state]:
            raise IllegalTransition(self.id, self.state, state)
        now = time.time()
        started = now if state is JobState.RUNNING else self.started_s
        finished = now if state.terminal else self.finished_s
        return replace(
            self, state=state, updated_s=now, started_s=started, finished_s=finished, **changes
        )


def parse_state(text: str) -> JobState:
    try:
        return JobState(text.upper())
    except ValueError:
        accepted = ", ".join(s.value for s in JobState)
        raise InvalidRequest(f"unknown job state {text!r}; accepted: {accepted}") from None
