"""What a DDP step costs one rank, and how DDP scales: how much of the gradient
all-reduce hides behind backward, and the step time and throughput per world size that
follow (`rdu predict ddp`).

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
  measured on the model's own arrays before the job runs (strategy.plan_memory): parameters,
  gradients, the optimizer's state, what forward keeps for backward, the progressive
  freezing metric's sample. The rank's memory is the stage with the highest HBM.

The overlap, a pure timing model: backward produces the buckets' gradients one after
another; bucket i is ready when the compute of buckets 0..i is done. torch DDP launches
each bucket's all-reduce when it is ready, on one communication stream, so bucket i's
all-reduce starts at max(bucket i ready, bucket i-1's all-reduce done) and all-reduces
never overlap each other. The step's backward phase ends when the last all-reduce is
done; the part of that after backward's own end is the exposed (not hidden)
communication time. All times in seconds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from math import ceil
from typing import TYPE_CHECKING

from rdurack.errors import InvalidRequest, OutOfMemory, UnknownName
from rdurack.rack.collectives import Algorithm, Cost, all_reduce
from rdurack.rack.hierarchy import hierarchical_all_reduce
from rdurack.rack.kernels import Phase
from rdurack.rack.models import ModelSpec
from rdurack.rack.spec import PlatformSpec, Tier
from rdurack.rack.topology import SocketId, Topology
from rdurack.workloads.predictor import Predictor
from rdurack.workloads.training.data import Params
from rdurack.workloads.training.job import BUILT_IN_MODELS, TrainingWorkload
from rdurack.workloads.training.rank import DEFAULT_BUCKET_CAP_BYTES

if TYPE_CHECKING:  # torch: imported where a built-in model is built, not with the spec
    from rdurack.workloads.training.models import Trainable
    from rdurack.workloads.training.strategy import MemoryPlan

FP32 = 4  # bytes: master weights and optimizer state
DEFAULT_FIRST_BUCKET_BYTES = 1024 * 1024  # torch: dist._DEFAULT_FIRST_BUCKET_BYTES
ACTIVATION_BYTES_PER_TOKEN_HIDDEN = 34  # Korthikanti et al. 2023, Sec. 4.1 (BF16)
ATTENTION_FACTOR = 5  # ... plus 5·a·s/h for the attention scores


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


@dataclass(frozen=True, slots=True)
class Bucket:
    """One DDP all-reduce's worth of gradients."""

    index: int  # position in all-reduce order (0 is reduced first)
    params: tuple[str, ...]  # parameter names, in the order their gradients become ready
    numel: int  # elements
    nbytes: int  # bytes on the wire per all-reduce


def assign_buckets(
    sizes: Sequence[tuple[str, int, int]],
    bucket_cap_bytes: int = DEFAULT_BUCKET_CAP_BYTES,
    first_bucket_cap_bytes: int = DEFAULT_FIRST_BUCKET_BYTES,
) -> list[Bucket]:
    """torch DDP's buckets, in all-reduce order, for parameters given as (name, numel,
    itemsize) in definition order: its steady state, `_compute_bucket_assignment_by_size`
    with limits [1 MiB, bucket_cap] over the gradient-ready order, as torch rebuilds its
    buckets after the first iteration (which itself runs with one bucket: a difference
    in that step's timing only). The rule: walk the parameters in reverse definition
    order, add each to the open bucket, close the bucket once it holds at least its limit
    (so a bucket may overshoot by one tensor); the first bucket's limit is
    `first_bucket_cap_bytes` (communication starts early), every later one's
    `bucket_cap_bytes`. Pure: the timing model calls it with descriptor sizes."""
    if bucket_cap_bytes < 1 or first_bucket_cap_bytes < 1:
        raise InvalidRequest(
            f"bucket caps must be >= 1 byte, got {bucket_cap_bytes} and {first_bucket_cap_bytes}"
        )
    buckets: list[Bucket] = []
    names: list[str] = []
    numel = nbytes = 0
    for name, n, itemsize in reversed(sizes):
        names.append(name)
        numel += n
        nbytes += n * itemsize
        limit = first_bucket_cap_bytes if not buckets else bucket_cap_bytes
        if nbytes >= limit:
            buckets.append(Bucket(len(buckets), tuple(names), numel, nbytes))
            names, numel, nbytes = [], 0, 0
    if names:
        buckets.append(Bucket(len(buckets), tuple(names), numel, nbytes))
    return buckets


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
    from rdurack.workloads.training.strategy import Trainee, plan_memory

    spec = w.train_spec()
    plan = plan_memory(spec, platform.socket)
    features, classes = data_shape(spec)
    model = Trainee("full", spec.model, features, classes, w.seed, w.hidden, w.blocks).model
    return model_cost(model, w, platform, RankMemory(**plan.peak_stage(Tier.HBM).hbm_parts()))


def built_in_plan(w: TrainingWorkload, platform: PlatformSpec) -> MemoryPlan:
    """A built-in model's memory, stage by stage (strategy.plan_memory)."""
    from rdurack.workloads.training.strategy import plan_memory

    return plan_memory(w.train_spec(), platform.socket)


def model_cost(
    model: Trainable, w: TrainingWorkload, platform: PlatformSpec, memory: RankMemory
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
    return StepCost(forward, backward, bucket_bytes(trained, w.bucket_cap_bytes), memory)


def bucket_bytes(params: Params, bucket_cap_bytes: int) -> tuple[int, ...]:
    """Bytes per DDP bucket of `params` (what trains), all-reduce order."""
    sizes = [(n, p.size, p.itemsize) for n, p in params.items()]
    return tuple(b.nbytes for b in assign_buckets(sizes, bucket_cap_bytes))


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


@dataclass(frozen=True, slots=True)
class OverlapTiming:
    """The schedule of one step's backward and bucket all-reduces, seconds."""

    ready_s: tuple[float, ...]  # when each bucket's gradients are ready
    start_s: tuple[float, ...]  # when each bucket's all-reduce starts
    done_s: tuple[float, ...]  # when each bucket's all-reduce is done
    backward_end_s: float  # when backward's compute ends
    end_s: float  # when the step's gradients are all reduced (the optimizer may run)
    exposed_s: float  # communication time not hidden behind backward: end - backward end
    all_reduce_s: float  # total all-reduce time

    @property
    def hidden_s(self) -> float:
        """All-reduce time that ran while backward was still computing."""
        return self.all_reduce_s - self.exposed_s


def overlap(
    backward_s: Sequence[float], all_reduce_s: Sequence[float], start_s: float = 0.0
) -> OverlapTiming:
    """The schedule for backward compute per bucket `backward_s` (in the order buckets
    become ready) and all-reduce time per bucket `all_reduce_s`, from `start_s`."""
    if len(backward_s) != len(all_reduce_s):
        raise InvalidRequest(
            f"{len(backward_s)} backward times for {len(all_reduce_s)} all-reduce times: "
            "give one of each per bucket"
        )
    if any(t < 0 for t in backward_s) or any(t < 0 for t in all_reduce_s):
        raise InvalidRequest("backward and all-reduce times must be >= 0 seconds")
    ready: list[float] = []
    starts: list[float] = []
    dones: list[float] = []
    compute_t = comm_t = float(start_s)  # when the compute / communication stream is free
    for compute, comm in zip(backward_s, all_reduce_s, strict=True):
        compute_t += compute
        begin = max(compute_t, comm_t)
        comm_t = begin + comm
        ready.append(compute_t)
        starts.append(begin)
        dones.append(comm_t)
    end = max(compute_t, comm_t)
    return OverlapTiming(
        ready_s=tuple(ready),
        start_s=tuple(starts),
        done_s=tuple(dones),
        backward_end_s=compute_t,
        end_s=end,
        exposed_s=end - compute_t,
        all_reduce_s=float(sum(all_reduce_s)),
    )


def split_by_bytes(total_s: float, bucket_bytes: Sequence[int]) -> list[float]:
    """`total_s` of backward compute shared among buckets in proportion to their bytes
    (assumption: gradient compute time is proportional to parameter count, which holds
    for the matmul-dominated layers DDP buckets hold)."""
    if total_s < 0 or any(b < 0 for b in bucket_bytes):
        raise InvalidRequest("times and bucket sizes must be >= 0")
    total_bytes = sum(bucket_bytes)
    if total_bytes == 0:
        return [total_s / len(bucket_bytes)] * len(bucket_bytes) if bucket_bytes else []
    return [total_s * b / total_bytes for b in bucket_bytes]


@dataclass(frozen=True)
class ScalingPoint:
    world_size: int
    step_s: float
    compute_s: float
    all_reduce_s: float
    exposed_s: float
    samples_per_s: float
    crosses_nodes: bool
    nodes: int = 1  # hosts the ranks span, over all racks
    racks: int = 1
    # samples/s over world_size times one rank's: one rank's step over this step.
    efficiency: float = 1.0


def scaling_world_sizes(platform: PlatformSpec) -> tuple[int, ...]:
    """1, 2, 4, ... up to every socket of the platform, and every socket."""
    sizes = [1 << k for k in range(platform.sockets.bit_length()) if 1 << k <= platform.sockets]
    return tuple(sorted({*sizes, platform.sockets}))


def _bucket_all_reduce_s(
    topo: Topology, group: list[SocketId], bucket_bytes: tuple[int, ...], itemsize: int
) -> list[float]:
    """Seconds of each bucket's all-reduce over `group`: inside a rack the ring simulated
    on the links; across racks the hierarchical ring of rack/hierarchy.py (the rack's
    ring plus the spine's phase)."""
    if len(group) == 1:
        return [0.0] * len(bucket_bytes)
    rack: dict[float, Cost] = {}  # the rack's ring per bucket size: sizes repeat

    def in_rack(members: list[SocketId], nbytes: float) -> Cost:
        if nbytes not in rack:
            rack[nbytes] = all_reduce(topo, members, nbytes, Algorithm.RING, itemsize)
        return rack[nbytes]

    across = topo.racks_of(group) > 1
    return [
        (
            hierarchical_all_reduce(topo, group, b, itemsize, in_rack)
            if across
            else in_rack(group, b)
        ).total_s
        for b in bucket_bytes
    ]


def predict_scaling(
    w: TrainingWorkload,
    platform: PlatformSpec,
    models: dict[str, ModelSpec],
    world_sizes: tuple[int, ...] | None = None,
) -> list[ScalingPoint]:
    """DDP scaling at a fixed per-rank batch: step time and throughput per world size
    (default: `scaling_world_sizes`), on the first sockets rack by rack, node by node
    (16 crosses the inter-node links of an SN40L rack, 32 the spine)."""
    topo = Topology(platform)
    sockets = topo.sockets
    out = []
    for n in world_sizes if world_sizes is not None else scaling_world_sizes(platform):
        if n > platform.sockets:
            continue
        wn = w.model_copy(update={"world_size": n, "global_batch": w.local_batch * n})
        cost = step_cost(wn, platform, models)
        group = sockets[:n]
        itemsize = 4 if w.functional else models[w.model].bytes_per_param
        comm = _bucket_all_reduce_s(topo, group, cost.bucket_bytes, itemsize)
        racks = topo.racks_of(group)
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
                topo.nodes_of(group) > 1,
                topo.nodes_of(group),
                racks,
                # One rank's step is its compute: nothing to all-reduce.
                (cost.forward_s + cost.backward_s) / step,
            )
        )
    return out
