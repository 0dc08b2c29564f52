"""A data-parallel training job on the rack: its spec, each rank's memory, the cost of
one step, and the DDP scaling prediction.

Two kinds of model:
- "mlp" and "transformer" are small real numpy models (FUNCTIONAL jobs): they train on
  a real dataset, their gradients really travel over the links;
- a model preset (e.g. "llama3.2-1b") is timed only (TIMING jobs): the same loop of
  forward, backward and bucketed gradient all-reduces, with sized descriptors.

Step time (both kinds): forward, then backward, whose gradient buckets are all-reduced
on one communication stream as they become ready (overlap.py); the step ends when both
are done. Backward is 2/3 of a training step's compute, forward 1/3 (the usual 2:1 of
backward to forward FLOPs; assumption for the split of the fused train step the timing
model prices as a whole).

Memory per rank (bytes, in HBM):
- presets, mixed precision as the timing model's BF16 weights: weights and gradients
  at `bytes_per_param`, an FP32 master copy (4 bytes/param), optimizer state of FP32
  (SGD with momentum: 4 bytes/param; Adam: 8); activations kept for backward per layer
  `s·b·h·(34 + 5·a·s/h)` bytes (Korthikanti et al., "Reducing Activation Recomputation
  in Large Transformer Models", MLSys 2023, Sec. 4.1, no recomputation);
- numpy models: their real parameter, gradient and optimizer-state arrays; activations
  as the arrays kept for backward (each layer's input, the local batch wide).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from math import ceil
from typing import Any, Literal

from pydantic import ConfigDict, Field, model_validator

from rdurack.rack.collectives import Algorithm, all_reduce
from rdurack.rack.errors import OutOfMemory, UnknownName
from rdurack.rack.kernels import FusionPlan, Phase
from rdurack.rack.models import ModelSpec
from rdurack.rack.spec import Config, PlatformSpec
from rdurack.rack.topology import SocketId, Topology
from rdurack.workloads.predictor import Predictor
from rdurack.workloads.training.ddp import DEFAULT_BUCKET_CAP_BYTES, assign_buckets
from rdurack.workloads.training.distributed import DEFAULT_TIMEOUT_S, MAX_WORLD_SIZE
from rdurack.workloads.training.loop import TrainSpec
from rdurack.workloads.training.models import build_model
from rdurack.workloads.training.overlap import OverlapTiming, overlap, split_by_bytes

NUMPY_MODELS = ("mlp", "transformer")
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
    dataset: Literal["digits", "synthetic"] = "digits"  # numpy models only
    world_size: int = Field(default=4, ge=1, le=MAX_WORLD_SIZE)
    global_batch: int = Field(default=64, ge=1, le=1 << 20)  # samples per step, all ranks
    steps: int | None = Field(default=None, ge=1, le=1 << 20)
    epochs: int | None = Field(default=None, ge=1, le=10_000)  # default: 5 without steps
    optimizer: Literal["sgd", "adam"] = "sgd"
    learning_rate: float = Field(default=0.1, gt=0, le=100)
    momentum: float = Field(default=0.9, ge=0, lt=1)
    seed: int = Field(default=0, ge=0)
    sequence_length: int = Field(default=1024, ge=1, le=1 << 20)  # presets: tokens/sample
    hidden: int = Field(default=64, ge=1, le=4096)  # numpy models: hidden width
    checkpoint_every: int = Field(default=0, ge=0)  # steps; 0: no checkpoints
    # How late (emulated seconds) a rank may reach a collective after the first one.
    timeout_s: float = Field(default=DEFAULT_TIMEOUT_S, gt=0)
    # Wall seconds a rank waits for a peer that never arrives (a dead or hung rank).
    wall_timeout_s: float = Field(default=60.0, gt=0, le=3600)
    broadcast_parameters: bool = True  # False: the article's mistake, diagnosed
    sampler: Literal["distributed", "none"] = "distributed"  # "none": the other one
    strategy: Literal["full"] = "full"
    bucket_cap_bytes: int = Field(default=DEFAULT_BUCKET_CAP_BYTES, ge=1)
    # The Python client's own train_loop_per_worker(ctx), cloudpickled; empty: the
    # built-in loop. It runs in the socket actors: whoever may submit jobs may run code.
    loop: bytes = Field(default=b"", max_length=MAX_LOOP_BYTES)

    @model_validator(mode="after")
    def _consistent(self) -> TrainingWorkload:
        if self.global_batch % self.world_size:
            raise ValueError(
                f"global_batch {self.global_batch} is not divisible by world_size "
                f"{self.world_size}: each rank takes global_batch / world_size samples a step"
            )
        return self

    @property
    def num_sockets(self) -> int:
        return self.world_size

    @property
    def functional(self) -> bool:
        return self.model in NUMPY_MODELS

    @property
    def local_batch(self) -> int:
        return self.global_batch // self.world_size

    def train_spec(self, resume: bool = True) -> TrainSpec:
        """The loop's spec for a numpy model; `resume` picks up the newest checkpoint."""
        epochs = self.epochs if self.epochs is not None or self.steps is not None else 5
        return TrainSpec(
            model=self.model,  # a numpy model: callers check `functional`
            hidden=self.hidden,
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

    @property
    def total(self) -> int:
        return self.weights + self.gradients + self.optimizer + self.activations

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


def step_cost(
    w: TrainingWorkload, platform: PlatformSpec, models: dict[str, ModelSpec]
) -> StepCost:
    """What one step costs a rank on `platform` (one socket per rank, TP1)."""
    if w.functional:
        return _numpy_cost(w, platform)
    if w.model not in models:
        raise UnknownName("model", w.model, [*NUMPY_MODELS, *sorted(models)])
    m = models[w.model]
    p = Predictor(platform)
    dataflow = platform.socket.kernels.dataflow_fusion
    plan = FusionPlan.FUSED_HO if dataflow else FusionPlan.UNFUSED
    compute = p.step(m, Phase.TRAIN, plan, w.local_batch, w.sequence_length, 1).total_s
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
    return StepCost(compute / 3, 2 * compute / 3, tuple(x.nbytes for x in buckets), memory)


def _numpy_cost(w: TrainingWorkload, platform: PlatformSpec) -> StepCost:
    features, classes = (64, 10)  # digits: 8x8 images, 10 classes; synthetic defaults alike
    model = build_model(w.model, features, classes, w.seed, w.hidden)  # type: ignore[arg-type]
    params = model.params
    nbytes = sum(p.nbytes for p in params.values())
    count = sum(p.size for p in params.values())
    tokens = 8 if w.model == "transformer" else 1  # the transformer reads 8 tokens
    flops = 2.0 * count * w.local_batch * tokens  # forward; backward twice that
    kernels = platform.socket.kernels
    eff_flops = platform.socket.peak_flops_per_s * kernels.compute_efficiency
    eff_bw = platform.socket.hbm.bandwidth_bytes_per_s * kernels.memory_efficiency
    launch = (kernels.launch_ho_ns or kernels.launch_so_ns) * 1e-9
    forward = launch + max(flops / eff_flops, nbytes / eff_bw)
    backward = launch + max(2 * flops / eff_flops, 2 * nbytes / eff_bw)
    buckets = assign_buckets(
        [(n, p.size, p.itemsize) for n, p in params.items()], w.bucket_cap_bytes
    )
    widths = _layer_inputs(w, features)
    memory = RankMemory(
        weights=nbytes,
        gradients=nbytes,
        optimizer=nbytes * _state_per_param(w) // FP32,
        activations=w.local_batch * widths * 4,  # float32 arrays kept for backward
    )
    return StepCost(forward, backward, tuple(b.nbytes for b in buckets), memory)


def _state_per_param(w: TrainingWorkload) -> int:
    """FP32 optimizer state per parameter: SGD's momentum buffer, Adam's two moments."""
    if w.optimizer == "adam":
        return 2 * FP32
    return FP32 if w.momentum else 0


def _layer_inputs(w: TrainingWorkload, features: int) -> int:
    """Values per sample the numpy model keeps for backward."""
    if w.model == "mlp":
        return features + w.hidden + 10
    d_model = 32  # TransformerClassifier's default width
    return 8 * (features // 8 + 8 * d_model + w.hidden) + 8 * 8 * 4  # + attention weights


def check_fits(w: TrainingWorkload, platform: PlatformSpec, cost: StepCost) -> None:
    """Refuse, before the first step, a rank whose memory does not fit a socket's HBM."""
    cap = platform.socket.hbm.capacity_bytes
    if cost.memory.total > cap:
        parts = ", ".join(f"{k} {v / 1e9:.2f} GB" for k, v in cost.memory.to_dict().items())
        raise OutOfMemory(
            f"{platform.name} socket (each of {w.world_size} ranks)",
            "hbm",
            cost.memory.total,
            cap,
            what=f"{w.model} training, batch {w.local_batch} per rank ({parts})",
        )


def ranks_of(sockets: list[str]) -> list[str]:
    """The job's sockets in rank order: node by node, socket index within a node."""
    return sorted(sockets, key=lambda s: (SocketId.parse(s).node, SocketId.parse(s).index))


@dataclass(frozen=True)
class ScalingPoint:
    world_size: int
    step_s: float
    compute_s: float
    all_reduce_s: float
    exposed_s: float
    samples_per_s: float
    crosses_nodes: bool


def predict_scaling(
    w: TrainingWorkload,
    platform: PlatformSpec,
    models: dict[str, ModelSpec],
    world_sizes: tuple[int, ...] = (1, 2, 4, 8, 16),
) -> list[ScalingPoint]:
    """DDP scaling at a fixed per-rank batch: step time and throughput per world size,
    on the first sockets node by node (16 crosses the inter-node links)."""
    topo = Topology(platform)
    out = []
    for n in world_sizes:
        if n > platform.sockets:
            continue
        wn = w.model_copy(update={"world_size": n, "global_batch": w.local_batch * n})
        cost = step_cost(wn, platform, models)
        group = topo.sockets[:n]
        itemsize = 4 if w.functional else models[w.model].bytes_per_param
        comm = [
            all_reduce(topo, group, b, Algorithm.RING, itemsize).total_s if n > 1 else 0.0
            for b in cost.bucket_bytes
        ]
        t: OverlapTiming = overlap(split_by_bytes(cost.backward_s, cost.bucket_bytes), comm)
        step = cost.forward_s + t.end_s
        out.append(
            ScalingPoint(
                n,
                step,
                cost.compute_s,
                t.all_reduce_s,
                t.exposed_s,
                wn.global_batch / step,
                n > platform.node.sockets,
            )
        )
    return out
