"""A data-parallel training job on the rack: its spec, what each rank reports, and a
script job's files (what a step costs and how DDP scales: scaling.py).

Two kinds of model:
- "mlp" and "transformer" are small real torch models (FUNCTIONAL jobs): they train on
  a real dataset, their gradients really travel over the links;
- a model preset (e.g. "llama3.2-1b") is timed only (TIMING jobs): the same loop of
  forward, backward and bucketed gradient all-reduces, with sized descriptors.

`hbm_cap_bytes` (> 0) caps a job's HBM per socket below the socket's capacity, for
either strategy: a job whose planned peak does not fit under it is refused.

A script job's files: its source, checked before it is stored, and where its ranks
keep their files under the job's directory (the orchestrator's checkpoint directory for
the job, on a filesystem every node agent sees): one working folder all ranks share, as
torchrun's ranks on one node share theirs, and one log per rank (its stdout and stderr
as they interleaved).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import ConfigDict, Field, model_validator

from rdurack.config import Config
from rdurack.rack.kernels import FusionPlan
from rdurack.rack.spec import PlatformSpec
from rdurack.rack.topology import SocketId
from rdurack.workloads.training.progressive import (
    DEFAULT_THRESHOLD,
    DEFAULT_WINDOW_STEPS,
    Strategy,
)
from rdurack.workloads.training.rank import DEFAULT_BUCKET_CAP_BYTES, DEFAULT_TIMEOUT_S, TrainSpec

if TYPE_CHECKING:  # torch: imported where a built-in model is built, not with the spec
    pass

BUILT_IN_MODELS = ("mlp", "transformer")
# Wall seconds a call waits for a script's steps before it reports its progress, and
# for a stopped script's thread to end (node_agent/training/script_thread.py).
SCRIPT_PROGRESS_S = 2.0
SCRIPT_STOP_S = 10.0
# Wall seconds a node's ranks may take to start (RunTraining with `prepare`): the
# training stack imported (torch, about 2 s of CPU a process), the runner built. Every
# rank starts before any waits for a peer, so a slow start is not a dead peer: started
# together in one step with the rest, 32 ranks on this 2-core machine kept their peers
# waiting past the 60 s wall_timeout_s, and the job's first attempt failed. Generous:
# starting takes no peer's time, and a dead socket still fails the call at once.
START_TIMEOUT_S = 600.0
MAX_LOOP_BYTES = 1 << 20  # a pickled training function, within gRPC's 4 MB messages


class TrainingWorkload(Config):
    """torch DDP semantics: one rank per socket, data parallel."""

    # Bytes (the client's pickled loop) travel as base64 in JSON, as in proto3's JSON.
    model_config = ConfigDict(
        **Config.model_config, ser_json_bytes="base64", val_json_bytes="base64"
    )

    kind: Literal["training"] = "training"
    model: str = Field(default="mlp", min_length=1, max_length=100)
    dataset: Literal["digits", "synthetic"] = "digits"  # built-in models only
    world_size: int = Field(default=4, ge=1)  # at most the platform's sockets (kinds/training)
    global_batch: int = Field(default=64, ge=1, le=1 << 20)  # samples per step, all ranks
    steps: int | None = Field(default=None, ge=1, le=1 << 20)
    epochs: int | None = Field(default=None, ge=1, le=10_000)  # default: 5 without steps
    optimizer: Literal["sgd", "adam"] = "sgd"
    learning_rate: float = Field(default=0.1, gt=0, le=100)
    momentum: float = Field(default=0.9, ge=0, lt=1)
    seed: int = Field(default=0, ge=0)
    sequence_length: int = Field(default=1024, ge=1, le=1 << 20)  # presets: tokens/sample
    hidden: int = Field(default=64, ge=1, le=4096)  # built-in models: hidden width
    checkpoint_every: int = Field(default=0, ge=0)  # steps; 0: no checkpoints
    # How late (emulated seconds) a rank may reach a collective after the first one.
    timeout_s: float = Field(default=DEFAULT_TIMEOUT_S, gt=0)
    # Wall seconds a rank waits for a peer that never arrives (a dead or hung rank).
    wall_timeout_s: float = Field(default=60.0, gt=0, le=3600)
    broadcast_parameters: bool = True  # False: the article's mistake, diagnosed
    sampler: Literal["distributed", "none"] = "distributed"  # "none": the other one
    # "full" trains the whole model; "progressive" (ProFL) an MLP block by block.
    strategy: Strategy = "full"
    blocks: int = Field(default=1, ge=1, le=64)  # the MLP's hidden layers (its blocks)
    # Progressive: a block freezes at the end of the first window of `freeze_window`
    # steps whose effective movement is below `freeze_threshold` (progressive.py).
    freeze_window: int = Field(default=DEFAULT_WINDOW_STEPS, ge=2, le=10_000)
    freeze_threshold: float = Field(default=DEFAULT_THRESHOLD, gt=0, lt=1)
    # The job's HBM per socket, bytes; 0: the socket's capacity.
    hbm_cap_bytes: int = Field(default=0, ge=0)
    bucket_cap_bytes: int = Field(default=DEFAULT_BUCKET_CAP_BYTES, ge=1)
    # The Python client's own train_loop_per_worker(ctx), cloudpickled; empty: the
    # built-in loop. It runs in the socket actors: whoever may submit jobs may run code.
    loop: bytes = Field(default=b"", max_length=MAX_LOOP_BYTES)
    # A torchrun-style script: its source, run as __main__ once per rank in the socket
    # actors (node_agent/training/script.py), its file name (what tracebacks show) and
    # its sys.argv[1:]. Empty: not a script job. Whoever may submit jobs may run code.
    script: bytes = Field(default=b"", max_length=MAX_LOOP_BYTES)
    script_name: str = Field(default="", max_length=255)
    script_args: tuple[str, ...] = Field(default=(), max_length=1024)
    # Wall seconds a script (or a client's loop) may run on a rank: one still running
    # then is stopped (its next torch operator raises) and fails the job.
    run_timeout_s: float = Field(default=3600.0, gt=0, le=7 * 86400)
    # How the compute runs: "unfused", "fused-so", "fused-ho"; "": the platform's way
    # (fused-ho where kernels fuse, as on SN40L; unfused on a GPU). A script's operators
    # (node_agent/training/script_kernels.py) and a preset's step take it.
    fusion_plan: Literal["", "unfused", "fused-so", "fused-ho"] = ""

    @model_validator(mode="after")
    def _consistent(self) -> TrainingWorkload:
        if self.script and self.loop:
            raise ValueError("a job runs a script or a client's loop, not both")
        if self.script:
            check_script(self.script, self.script_name)
        if self.user_code:
            if self.strategy != "full":
                raise ValueError(
                    "strategy progressive is the built-in loop's: a script or a client's "
                    "loop freezes what it likes itself (requires_grad_(False))"
                )
            return self  # the model, data and batch fields are the built-in loop's
        if self.global_batch % self.world_size:
            raise ValueError(
                f"global_batch {self.global_batch} is not divisible by world_size "
                f"{self.world_size}: each rank takes global_batch / world_size samples a step"
            )
        if self.blocks != 1 and self.model != "mlp":
            raise ValueError(f"blocks: {self.model} is one block; only the mlp takes blocks")
        if self.strategy == "progressive":
            if self.model != "mlp" or self.blocks < 2:
                raise ValueError(
                    "strategy progressive trains the mlp block by block: use model mlp with "
                    f"blocks >= 2 (got {self.model!r}, blocks {self.blocks})"
                )
            if self.checkpoint_every:
                raise ValueError(
                    "checkpoint_every: progressive training does not checkpoint (its stages "
                    "and freezing state are not saved); use 0"
                )
        return self

    def call_timeout_s(self, segment_s: float, prepare: bool = False) -> float:
        """How long a call running this job's ranks may take, given `segment_s` for one
        segment of steps. A script's call comes back within SCRIPT_PROGRESS_S, but its
        first meets the peers at the rendezvous (up to `wall_timeout_s`) and one may stop
        a script that ran past `run_timeout_s` (up to SCRIPT_STOP_S). `prepare`: the
        call that starts the ranks, which may take START_TIMEOUT_S beside `segment_s`
        (the caller's own way there and back)."""
        if prepare:
            return START_TIMEOUT_S + segment_s
        if not self.user_code:
            return segment_s
        return segment_s + self.wall_timeout_s + SCRIPT_PROGRESS_S + SCRIPT_STOP_S

    def plan(self, platform: PlatformSpec) -> FusionPlan:
        """The fusion plan the job runs on `platform`."""
        if self.fusion_plan:
            return FusionPlan(self.fusion_plan)
        dataflow = platform.socket.kernels.dataflow_fusion
        return FusionPlan.FUSED_HO if dataflow else FusionPlan.UNFUSED

    @property
    def user_code(self) -> bool:
        """A script or a client's loop: the job runs the user's code, not the built-in
        loop (the model, data and batch fields do not apply)."""
        return bool(self.script or self.loop)

    @property
    def label(self) -> str:
        """What the job trains, for its result: the model, or the user's code."""
        if self.script:
            return f"(script {self.script_name})"
        return "(client loop)" if self.loop else self.model

    @property
    def num_sockets(self) -> int:
        return self.world_size

    @property
    def functional(self) -> bool:
        return self.model in BUILT_IN_MODELS

    @property
    def local_batch(self) -> int:
        return self.global_batch // self.world_size

    def train_spec(self, resume: bool = True) -> TrainSpec:
        """The loop's spec for a built-in model; `resume` picks up the newest checkpoint."""
        epochs = self.epochs if self.epochs is not None or self.steps is not None else 5
        return TrainSpec(
            model=self.model,  # a built-in model: callers check `functional`
            hidden=self.hidden,
            blocks=self.blocks,
            strategy=self.strategy,
            freeze_window=self.freeze_window,
            freeze_threshold=self.freeze_threshold,
            dataset=self.dataset,
            world_size=self.world_size,
            global_batch=self.global_batch,
            epochs=epochs,
            steps=self.steps,
            optimizer=self.optimizer,
            lr=self.learning_rate,
            momentum=self.momentum,
            seed=self.seed,
            checkpoint_every=self.checkpoint_every,
            resume=resume,
            broadcast_parameters=self.broadcast_parameters,
            sampler=self.sampler,
            timeout_s=self.timeout_s,
            bucket_cap_bytes=self.bucket_cap_bytes,
        )


@dataclass
class RankReport:
    """Where one rank is after a segment, and (once finished) its outcome."""

    socket_id: str
    rank: int
    step: int
    total: int
    finished: bool
    losses: list[float]  # this segment's local losses
    start_ns: int
    end_ns: int
    steps_began_ns: int  # clock at the first step (this run's), after DDP's broadcast
    compute_ns: int
    all_reduce_ns: int
    exposed_ns: int
    memory: dict[str, int]
    hbm_peak_bytes: int
    result: dict[str, Any] = field(default_factory=dict)  # RankResult.to_dict() at the end
    loop_result: bytes = b""  # a user loop's return value, pickled
    peak_bytes: dict[str, int] = field(default_factory=dict)  # tier -> the job's peak here
    stage: str = ""  # the stage the last step belonged to


def ranks_of(sockets: list[str]) -> list[str]:
    """The job's sockets in rank order: rack by rack, node by node, socket index within a
    node."""
    return sorted(sockets, key=SocketId.parse)


WORK = "work"  # the ranks' shared working folder (their cwd)
LOGS = "logs"


def work_dir(job_dir: Path) -> Path:
    return job_dir / WORK


def log_path(job_dir: Path, rank: int) -> Path:
    """Rank `rank`'s stdout and stderr."""
    return job_dir / LOGS / f"rank-{rank}.log"


def check_script(source: bytes, name: str) -> None:
    """Refuse a script that could never run: a bad file name, text that is not UTF-8,
    a syntax error (with its line)."""
    if not name.endswith(".py") or "/" in name or "\\" in name or name.startswith("."):
        raise ValueError(f"script_name {name!r}: a plain file name ending in .py, e.g. train.py")
    try:
        text = source.decode()
    except UnicodeDecodeError as e:
        raise ValueError(f"{name}: not UTF-8 text (byte {e.start})") from None
    try:
        compile(text, name, "exec")
    except SyntaxError as e:
        raise ValueError(f"{name}, line {e.lineno}: {e.msg}") from None
