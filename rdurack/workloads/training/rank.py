"""What one training rank is given and what it reports: the job's spec, the launcher's
context, the events it emits while it trains, its result (loop.py trains), and its
diagnostics.

Diagnostics are a run's findings about how it was set up wrong. Errors stop a run (a
wrong world size cannot train at all); diagnostics are recorded and the run goes on,
because the mistake only costs correctness or efficiency (replicas that never agree,
samples every rank processes). Each names the mistake in the article's words and
carries its numbers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, model_validator

from rdurack.workloads.training.backend import Backend
from rdurack.workloads.training.data import Params
from rdurack.workloads.training.memory import MemoryAccount
from rdurack.workloads.training.progressive import (
    DEFAULT_THRESHOLD,
    DEFAULT_WINDOW_STEPS,
    Stage,
    StageReport,
    Strategy,
)

if TYPE_CHECKING:
    from rdurack.workloads.training.models import Trainable

DEFAULT_BUCKET_CAP_BYTES = 25 * 1024 * 1024  # torch: bucket_cap_mb=25
# torch's default process-group timeout (datetime.timedelta(minutes=30)), seconds.
DEFAULT_TIMEOUT_S = 1800.0

# Codes, stable for tests and for whoever turns diagnostics into job events.
REPLICAS_DIFFER = "replicas-differ"
DUPLICATE_SAMPLES = "duplicate-samples"
EVERY_RANK_CHECKPOINTS = "every-rank-checkpoints"  # a script's ranks saved one file
# A script's mistakes that stop it (node_agent/training/script_checks.py): its error
# starts with the code in brackets.
WRONG_WORLD_SIZE = "wrong-world-size"
TWO_PROCESSES_PER_SOCKET = "two-processes-per-socket"
WRONG_RANK = "wrong-rank"
STRAGGLER_TIMEOUT = "straggler-timeout"


@dataclass(frozen=True, slots=True)
class Diagnostic:
    code: str  # one of the codes above
    message: str  # one line for a person, with the numbers
    step: int  # training step (optimizer updates done) when it was found
    data: dict[str, Any] = field(default_factory=dict)  # the numbers, for programs

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class Passes(Protocol):
    """What the rack times of a step: its forward, then its backward, called before
    they run (node_agent/training/timed.py)."""

    def forward(self) -> None: ...

    def backward(self) -> None: ...


class TrainSpec(BaseModel):
    """One data-parallel training job."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    model: Literal["mlp", "transformer"] = "mlp"
    hidden: int = Field(64, ge=1)  # MLP hidden width; the transformer's MLP width
    blocks: int = Field(1, ge=1, le=64)  # MLP hidden layers (progressive: its blocks)
    strategy: Strategy = "full"
    freeze_window: int = Field(DEFAULT_WINDOW_STEPS, ge=2)  # steps per movement window
    freeze_threshold: float = Field(DEFAULT_THRESHOLD, gt=0, lt=1)  # freeze below it
    dataset: Literal["digits", "synthetic"] = "digits"
    synthetic_samples: int = Field(2000, ge=8)  # train + test, synthetic only
    synthetic_features: int = Field(64, ge=1)  # a multiple of 8 for the transformer
    synthetic_classes: int = Field(10, ge=2)
    world_size: int = Field(ge=1)  # at most the platform's sockets: checked where it is placed
    global_batch: int = Field(ge=1)  # samples per step over all ranks
    epochs: int | None = Field(None, ge=1)  # stop after this many epochs ...
    steps: int | None = Field(None, ge=1)  # ... or optimizer steps, whichever comes first
    optimizer: Literal["sgd", "adam"] = "sgd"
    lr: float = Field(0.1, gt=0)
    momentum: float = Field(0.9, ge=0, lt=1)  # SGD only
    weight_decay: float = Field(0.0, ge=0)
    seed: int = 0
    input_noise: float = Field(0.0, ge=0)  # std of Gaussian input noise (augmentation)
    checkpoint_every: int = Field(0, ge=0)  # steps between checkpoints; 0: none
    resume: bool = False  # start from the newest checkpoint in the checkpoint directory
    broadcast_parameters: bool = True  # False: the article's mistake, diagnosed
    sampler: Literal["distributed", "none"] = "distributed"  # "none": the other one
    check_every: int = Field(0, ge=0)  # steps between replica checks; 0: construction only
    bucket_cap_bytes: int = Field(DEFAULT_BUCKET_CAP_BYTES, ge=1)
    timeout_s: float = Field(DEFAULT_TIMEOUT_S, gt=0)  # per collective, wall seconds

    @model_validator(mode="after")
    def _consistent(self) -> TrainSpec:
        if self.global_batch % self.world_size:
            raise ValueError(
                f"global_batch {self.global_batch} is not divisible by world_size "
                f"{self.world_size}: every rank takes global_batch / world_size samples "
                "per step (equal shards are what makes DDP equal one process)"
            )
        if self.epochs is None and self.steps is None:
            raise ValueError("set epochs or steps (or both: the first reached stops)")
        if self.model != "mlp" and self.blocks != 1:
            raise ValueError(f"blocks: {self.model} has one block; only the mlp takes blocks")
        if self.strategy == "progressive":
            if self.model != "mlp" or self.blocks < 2:
                raise ValueError(
                    "strategy progressive trains an MLP block by block: use model mlp with "
                    f"blocks >= 2 (got {self.model}, blocks {self.blocks})"
                )
            if self.checkpoint_every:
                raise ValueError(
                    "checkpoint_every: progressive training does not checkpoint (its stage "
                    "and freezing state are not saved); use 0"
                )
        return self

    @property
    def local_batch(self) -> int:
        return self.global_batch // self.world_size


@dataclass(frozen=True, slots=True)
class RankContext:
    """What the launcher gives one rank (torch: the RANK environment, the device)."""

    transport: Backend  # this process's end of the process group
    rank: int  # the rank this process was told it has
    device: str  # its socket, rdu-n<node>-s<index>
    checkpoint_dir: Path | None = None  # where rank 0 writes and every rank resumes from
    # A stage's model's passes on the socket's clock (None: untimed, in one process).
    timing: Callable[[Trainable], Passes] | None = None
    # Mirrors what the rank holds on its socket's tiers (None: not accounted).
    memory: MemoryAccount | None = None
    # Told when a stage begins (with the seconds its memory moves took) and ends.
    on_stage: Callable[[StageEvent], None] | None = None
    # Told when this rank wrote (rank 0) or loaded a checkpoint.
    on_checkpoint: Callable[[CheckpointEvent], None] | None = None


@dataclass(frozen=True, slots=True)
class StageEvent:
    """A stage began (`report` None; `copy_s`: its weights' moves between tiers) or
    ended (`report` set)."""

    stage: Stage
    step: int
    copy_s: float = 0.0
    report: StageReport | None = None


@dataclass(frozen=True, slots=True)
class CheckpointEvent:
    """A checkpoint this rank wrote (`save`, rank 0) or resumed from (`load`)."""

    action: Literal["save", "load"]
    step: int  # the optimizer steps it holds
    path: str
    nbytes: int  # its parameters and optimizer state


@dataclass(slots=True)
class RankResult:
    """What one rank reports after training."""

    rank: int
    device: str
    losses: list[float]  # this rank's local batch loss, per step run here
    final_loss: float | None
    test_accuracy: float | None  # rank 0 only
    diagnostics: list[Diagnostic]
    samples_seen: int  # training samples this rank processed (repeats included)
    start_step: int  # step it started at (> 0 when resumed)
    steps: int  # optimizer steps done at the end (global count)
    epochs: int  # epochs entered, including a resumed one
    bucket_bytes: list[int]  # DDP buckets, all-reduce order
    checkpoints: list[str] = field(default_factory=list)  # files this rank wrote
    params: Params = field(default_factory=dict)  # final parameters (a copy)
    stages: list[StageReport] = field(default_factory=list)
    peak_bytes: dict[str, int] = field(default_factory=dict)  # tier -> this rank's peak

    def to_dict(self) -> dict[str, Any]:
        """JSON-able, without the parameters."""
        return {
            "rank": self.rank,
            "device": self.device,
            "losses": self.losses,
            "final_loss": self.final_loss,
            "test_accuracy": self.test_accuracy,
            "diagnostics": [d.to_dict() for d in self.diagnostics],
            "samples_seen": self.samples_seen,
            "start_step": self.start_step,
            "steps": self.steps,
            "epochs": self.epochs,
            "bucket_bytes": self.bucket_bytes,
            "checkpoints": self.checkpoints,
            "stages": [st.to_dict() for st in self.stages],
            "peak_bytes": dict(self.peak_bytes),
        }


@dataclass(frozen=True, slots=True)
class StepInfo:
    """Where a rank is after an optimizer step."""

    step: int  # steps done (global count, a resumed run included)
    total: int  # steps the run will do (progressive: at most, every stage its budget)
    loss: float  # this rank's local batch loss of the step
    stage: str = "full"  # the stage it belongs to
