"""What a finished job reports: one frozen model per job kind, tagged by `kind` as the
JobSpec's workload is, with the fields of the proto's results (rdurack.v1 KernelResult,
CoeInferenceResult, TrainingResult; wire/jobs.py converts them).

The job store keeps a result as JSON. Rows written before these models held plain JSON
dicts of the same keys, and still load: a result without a `kind` is a kernel job's
(its dict had none), and a field it lacks reads as the proto's default, as the dicts'
conversion to protos read it. So every field here has its proto default.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Discriminator, Tag, TypeAdapter

from rdurack.config import Config
from rdurack.workloads.coe.report import CoeReport
from rdurack.workloads.serving.report import ServeReport


class Result(Config):
    """Base of the results: Config, except that a number may be NaN (a result is a
    measurement: a diverged loss is reported as it is), written as JSON's NaN as
    json.dumps wrote it before."""

    model_config = ConfigDict(allow_inf_nan=True, ser_json_inf_nan="constants")  # merged


class KernelResult(Result):
    """A kernel job's outcome; calls, bytes and FLOPs are per socket."""

    kind: Literal["kernel"] = "kernel"
    emulated_s: float = 0.0
    kernel_calls: int = 0
    hbm_bandwidth_utilization: float = 0.0  # achieved over peak, 0..1
    compute_utilization: float = 0.0  # achieved FLOP/s over peak, 0..1
    tokens_per_s: float | None = None  # decode and serve jobs only
    launch_overhead_s: float | None = None  # emulated time launching kernels (None: older rows)
    # A serve job's figures: those of `rdu predict serve`, made by the same code.
    serve: ServeReport | None = None


class CoeResult(Result, CoeReport):
    """A CoE inference job's outcome (also a FAILED job's, with `oom`): the serving
    engine's report (workloads/coe/report.py), tagged."""

    kind: Literal["coe_inference"] = "coe_inference"


class TrainingDiagnostic(Result):
    code: str = ""  # "replicas-differ", "duplicate-samples", ...
    message: str = ""
    step: int = 0  # optimizer steps done when it was found


class TrainingMemory(Result):
    """HBM one rank holds, bytes."""

    weights: int = 0
    gradients: int = 0
    optimizer: int = 0
    activations: int = 0
    movement: int = 0  # progressive: the freezing metric's sample
    total: int = 0


class TrainingStage(Result):
    """One stage of a training job: the whole model, or one block of a progressive
    job's shrinking or growing stage."""

    name: str = ""  # "full", "shrink block 3", ...
    phase: str = ""  # "full", "shrink" or "grow"
    block: int | None = None
    start_step: int = 0
    steps: int = 0
    converged: bool = False  # ended by the movement metric, not its step budget
    frozen_at_step: int | None = None
    movement: float | None = None
    test_accuracy: float | None = None
    final_loss: float | None = None
    peak_hbm_bytes: int = 0  # on a socket (a job's: the largest over its sockets)
    peak_ddr_bytes: int = 0
    emulated_s: float = 0.0


class TrainingSocketMemory(Result):
    """One socket's peaks over a job, bytes."""

    socket_id: str = ""
    peak_sram_bytes: int = 0
    peak_hbm_bytes: int = 0
    peak_ddr_bytes: int = 0


class TrainingResult(Result):
    """A training job's outcome, emulated seconds (the proto's comments say what each
    field is)."""

    kind: Literal["training"] = "training"
    emulated_s: float = 0.0
    steps_completed: int = 0
    samples_per_s: float = 0.0
    exposed_allreduce_s: float = 0.0
    step_time_s: float = 0.0
    peak_hbm_bytes: int = 0
    diagnostics: tuple[TrainingDiagnostic, ...] = ()
    losses: tuple[float, ...] = ()
    memory: TrainingMemory = TrainingMemory()
    compute_s: float = 0.0
    allreduce_s: float = 0.0
    world_size: int = 0
    start_step: int = 0
    checkpoints: tuple[str, ...] = ()
    platform: str = ""
    model: str = ""
    # A client's own loop: each rank's return value, pickled, in base64 (proto3 JSON's
    # form of bytes, and the stored form).
    loop_results: tuple[str, ...] = ()
    final_loss: float | None = None
    test_accuracy: float | None = None
    strategy: str = ""
    hbm_cap_bytes: int = 0
    peak_ddr_bytes: int = 0
    socket_memory: tuple[TrainingSocketMemory, ...] = ()
    stages: tuple[TrainingStage, ...] = ()


def _kind(value: Any) -> str:
    """The tag of a result, as a model or as its JSON dict (a kernel's had none)."""
    if isinstance(value, dict):
        return str(value.get("kind", "kernel"))
    return str(getattr(value, "kind", "kernel"))


# The kinds are the proto's JobResult oneof names, and the JobSpec workloads' kinds.
JobResult = Annotated[
    Annotated[KernelResult, Tag("kernel")]
    | Annotated[CoeResult, Tag("coe_inference")]
    | Annotated[TrainingResult, Tag("training")],
    Discriminator(_kind),
]

# Reads a result from its stored JSON, or from a result event's payload.
RESULTS: TypeAdapter[JobResult] = TypeAdapter(JobResult)
