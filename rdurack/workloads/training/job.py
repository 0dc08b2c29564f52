"""A data-parallel training job on the rack: its spec, each rank's memory and the cost
of one step (scaling.py predicts how DDP scales from them).

Two kinds of model:
- "mlp" and "transformer" are small real torch models (FUNCTIONAL jobs): they train on
  a real dataset, their gradients really travel over the links;
- a model preset (e.g. "llama3.2-1b") is timed only (TIMING jobs): the same loop of
  forward, backward and bucketed gradient all-reduces, with sized descriptors.

Step time (both kinds): forward, then backward, whose gradient buckets are all-reduced
on one communication stream as they become ready (scaling.py); the step ends when both
are done. Backward is 2/3 of a training step's compute, forward 1/3 (the usual 2:1 of
backward to forward FLOPs; assumption for the split of the fused train step the timing
model prices as a whole).

Memory per rank (bytes, in HBM):
- presets, mixed precision as the timing model's BF16 weights: weights and gradients
  at `bytes_per_param`, an FP32 master copy (4 bytes/param), optimizer state of FP32
  (SGD with momentum: 4 bytes/param; Adam: 8); activations kept for backward per layer
  `s·b·h·(34 + 5·a·s/h)` bytes (Korthikanti et al., "Reducing Activation Recomputation
  in Large Transformer Models", MLSys 2023, Sec. 4.1, no recomputation);
- built-in models: what the loop's memory account will hold, per stage of the strategy,
  measured on the model's own arrays before the job runs (memory_plan.py): parameters,
  gradients, the optimizer's state, what forward keeps for backward, the progressive
  freezing metric's sample. The rank's memory is the stage with the highest HBM.

`hbm_cap_bytes` (> 0) caps a job's HBM per socket below the socket's capacity, for
either strategy: a job whose planned peak does not fit under it is refused.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from math import ceil
from typing import TYPE_CHECKING, Any, Literal

from pydantic import ConfigDict, Field, model_validator

from rdurack.config import Config
from rdurack.errors import OutOfMemory, UnknownName
from rdurack.rack.kernels import FusionPlan, Phase
from rdurack.rack.models import ModelSpec
from rdurack.rack.spec import PlatformSpec, Tier
from rdurack.rack.topology import SocketId
from rdurack.workloads.predictor import Predictor
from rdurack.workloads.training.arrays import Params
from rdurack.workloads.training.ddp import DEFAULT_BUCKET_CAP_BYTES, assign_buckets
from rdurack.workloads.training.distributed import DEFAULT_TIMEOUT_S
from rdurack.workloads.training.movement import DEFAULT_THRESHOLD, DEFAULT_WINDOW_STEPS
from rdurack.workloads.training.progressive import Strategy
from rdurack.workloads.training.rank import TrainSpec
from rdurack.workloads.training.script_files import check_script

if TYPE_CHECKING:  # torch: imported where a built-in model is built, not with the spec
    from rdurack.workloads.training.memory_plan import MemoryPlan
    from rdurack.workloads.training.models import Model

BUILT_IN_MODELS = ("mlp", "transformer")
# Wall seconds a call waits for a script's steps before it reports its progress, and
# for a stopped script's thread to end (node_agent/training/script_thread.py).
SCRIPT_PROGRESS_S = 2.0
SCRIPT_STOP_S = 10.0
MAX_LOOP_BYTES = 1 << 20  # a pickled training function, within gRPC's 4 MB messages
FP32 = 4  # bytes: master weights and optimizer state
ACTIVATION_BYTES_PER_TOKEN_HIDDEN = 34  # Korthikanti et al. 2023, Sec. 4.1 (BF16)
ATTENTION_FACTOR = 5  # ... plus 5·a·s/h for the attention scores


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
    # steps whose effective movement is below `freeze_threshold` (movement.py).
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

    def call_timeout_s(self, segment_s: float) -> float:
        """How long a call running this job's ranks may take, given `segment_s` for one
        segment of steps. A script's call comes back within SCRIPT_PROGRESS_S, but its
        first meets the peers at the rendezvous (up to `wall_timeout_s`) and one may stop
        a script that ran past `run_timeout_s` (up to SCRIPT_STOP_S)."""
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


@dataclass(frozen=True)
class RankMemory:
    """HBM one rank holds, bytes."""

    weights: int
    gradients: int
    optimizer: int
    activations: int
    movement: int = 0  # progressive: the freezing metric's sample

    @property
    def total(self) -> int:
        return self.weights + self.gradients + self.optimizer + self.activations + self.movement

    def to_dict(self) -> dict[str, int]:
        return {**asdict(self), "total": self.total}


@dataclass(frozen=True)
class StepCost:
    """One rank's compute of one step, and its gradient buckets (all-reduce order)."""

    forward_s: float
    backward_s: float
    bucket_bytes: tuple[int, ...]
    memory: RankMemory

    @property
    def compute_s(self) -> float:
        return self.forward_s + self.backward_s


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


def step_cost(
    w: TrainingWorkload, platform: PlatformSpec, models: dict[str, ModelSpec]
) -> StepCost:
    """What one step costs a rank on `platform` (one socket per rank, TP1)."""
    if w.functional:
        return _built_in_cost(w, platform)
    if w.model not in models:
        raise UnknownName("model", w.model, [*BUILT_IN_MODELS, *sorted(models)])
    m = models[w.model]
    p = Predictor(platform)
    compute = p.step(m, Phase.TRAIN, w.plan(platform), w.local_batch, w.sequence_length, 1)
    compute_s = compute.total_s
    grad_bytes = m.bytes_per_param
    layers = [(f"layers.{i}", m.layer_params, grad_bytes) for i in range(m.layers)]
    buckets = assign_buckets(
        [("embeddings", m.embedding_params, grad_bytes), *layers], w.bucket_cap_bytes
    )
    state = _state_per_param(w)
    s, b, h, a = w.sequence_length, w.local_batch, m.hidden, m.heads
    per_layer = s * b * h * (ACTIVATION_BYTES_PER_TOKEN_HIDDEN + ATTENTION_FACTOR * a * s / h)
    memory = RankMemory(
        weights=m.params * (m.bytes_per_param + FP32),  # BF16 weights + FP32 master
        gradients=m.params * m.bytes_per_param,
        optimizer=m.params * state,
        activations=ceil(m.layers * per_layer),
    )
    return StepCost(compute_s / 3, 2 * compute_s / 3, tuple(x.nbytes for x in buckets), memory)


def _built_in_cost(w: TrainingWorkload, platform: PlatformSpec) -> StepCost:
    from rdurack.workloads.training.data import data_shape
    from rdurack.workloads.training.memory_plan import plan_memory
    from rdurack.workloads.training.strategy import Trainee

    spec = w.train_spec()
    plan = plan_memory(spec, platform.socket)
    features, classes = data_shape(spec)
    model = Trainee("full", spec.model, features, classes, w.seed, w.hidden, w.blocks).model
    return model_cost(model, w, platform, RankMemory(**plan.peak_stage(Tier.HBM).hbm_parts()))


def built_in_plan(w: TrainingWorkload, platform: PlatformSpec) -> MemoryPlan:
    """A built-in model's memory, stage by stage (memory_plan.py)."""
    from rdurack.workloads.training.memory_plan import plan_memory

    return plan_memory(w.train_spec(), platform.socket)


def model_cost(
    model: Model, w: TrainingWorkload, platform: PlatformSpec, memory: RankMemory
) -> StepCost:
    """One step of a built-in model: forward over every parameter it uses (frozen ones
    too), backward over those it trains, its gradient buckets."""
    trained, frozen = model.params, model.frozen
    tokens = 8 if w.model == "transformer" else 1  # the transformer reads 8 tokens
    flops = 2.0 * (_count(trained) + _count(frozen)) * w.local_batch * tokens  # forward
    trained_flops = 2.0 * _count(trained) * w.local_batch * tokens
    kernels = platform.socket.kernels
    eff_flops = platform.socket.peak_flops_per_s * kernels.compute_efficiency
    eff_bw = platform.socket.hbm.bandwidth_bytes_per_s * kernels.memory_efficiency
    launch = (kernels.launch_ho_ns or kernels.launch_so_ns) * 1e-9
    nbytes = _bytes(trained) + _bytes(frozen)
    forward = launch + max(flops / eff_flops, nbytes / eff_bw)
    # Backward: twice the forward of what trains (the usual 2:1), nothing for frozen blocks.
    backward = launch + max(2 * trained_flops / eff_flops, 2 * _bytes(trained) / eff_bw)
    buckets = assign_buckets(
        [(n, p.size, p.itemsize) for n, p in trained.items()], w.bucket_cap_bytes
    )
    return StepCost(forward, backward, tuple(b.nbytes for b in buckets), memory)


def _count(params: Params) -> int:
    return sum(p.size for p in params.values())


def _bytes(params: Params) -> int:
    return sum(p.nbytes for p in params.values())


def _state_per_param(w: TrainingWorkload) -> int:
    """FP32 optimizer state per parameter: SGD's momentum buffer, Adam's two moments."""
    if w.optimizer == "adam":
        return 2 * FP32
    return FP32 if w.momentum else 0


def hbm_limit(w: TrainingWorkload, platform: PlatformSpec) -> int:
    """HBM a rank of `w` may use on a socket: the cap, or the socket's capacity."""
    capacity = platform.socket.hbm.capacity_bytes
    return min(w.hbm_cap_bytes, capacity) if w.hbm_cap_bytes else capacity


def check_fits(w: TrainingWorkload, platform: PlatformSpec, cost: StepCost) -> None:
    """Refuse, before the first step, a rank whose memory does not fit a socket's HBM
    (or the job's HBM cap)."""
    limit = hbm_limit(w, platform)
    if cost.memory.total > limit:
        parts = ", ".join(
            f"{k} {_size(v)}" for k, v in cost.memory.to_dict().items() if v and k != "total"
        )
        capped = limit < platform.socket.hbm.capacity_bytes
        cap = f" under hbm_cap_bytes {w.hbm_cap_bytes:,}" if capped else ""
        raise OutOfMemory(
            f"{platform.name} socket (each of {w.world_size} ranks)",
            "hbm",
            cost.memory.total,
            limit,
            what=f"{w.model} training ({w.strategy}){cap}, batch {w.local_batch} per rank "
            f"({parts})",
        )


def _size(nbytes: int) -> str:
    """Bytes in decimal units, three figures: 91.2 GB, 64.2 kB."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if nbytes >= scale:
            return f"{nbytes / scale:.3g} {unit}"
    return f"{nbytes} B"


def ranks_of(sockets: list[str]) -> list[str]:
    """The job's sockets in rank order: rack by rack, node by node, socket index within a
    node."""
    return sorted(sockets, key=SocketId.parse)
