"""The fast predictor: the rack/ timing model in one process, no Ray, no sockets.

It answers the memory-wall questions directly: what fusion buys, how fast a model
decodes on a platform, what serving a Composition of Experts costs with switching, and
how many experts a platform holds. The cluster runs the same timing model and must
agree with it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, is_dataclass
from functools import lru_cache
from math import ceil
from typing import Any

from rdurack.errors import InvalidRequest
from rdurack.rack.calibration import fitted_values
from rdurack.rack.kernels import FusionPlan, Phase, Shape, Step, mixed_step, step
from rdurack.rack.layers import expert_mapping
from rdurack.rack.models import ModelSpec
from rdurack.rack.placement import Placement, place
from rdurack.rack.spec import PlatformSpec
from rdurack.rack.timing import CollectiveCosts, StepTiming, Timer, tp_group

# ------------------------------------------------------------------ shared pieces


class Result:
    """Base of the predictor's result dataclasses: each prints as one JSON object."""

    def to_dict(self) -> dict[str, Any]:
        assert is_dataclass(self) and not isinstance(self, type)
        return asdict(self)


class Predictor:
    """Predictions for one platform. Step timings are cached: a CoE study asks for the
    same shapes thousands of times."""

    def __init__(self, platform: PlatformSpec, collectives: CollectiveCosts | None = None) -> None:
        self.platform = platform
        self._collectives = collectives  # shared with other predictors (rack/timing.py)
        self._timers: dict[int, Timer] = {}
        self._step = lru_cache(maxsize=4096)(self._step_uncached)
        self._mixed = lru_cache(maxsize=4096)(self._mixed_uncached)

    def timer(self, sockets: int) -> Timer:
        if sockets not in self._timers:
            group = tp_group(self.platform, sockets)
            self._timers[sockets] = Timer(self.platform, group, self._collectives)
        return self._timers[sockets]

    def _step_uncached(
        self,
        model: ModelSpec,
        phase: Phase,
        plan: FusionPlan,
        batch: int,
        seq: int,
        sockets: int,
        cold: float | None,
    ) -> StepTiming:
        ops = self.decompose(model, phase, batch, seq, sockets, cold)
        return self.timer(sockets).step(ops, plan)

    def decompose(
        self,
        model: ModelSpec,
        phase: Phase,
        batch: int,
        seq: int,
        sockets: int,
        cold: float | None = None,
    ) -> Step:
        """The operators of one step, as `step` times them."""
        if cold is None:
            cold = self.cold_experts(model, sockets, batch * seq)
        return step(model, phase, batch, seq, sockets, cold_experts=cold)

    def cold_experts(self, model: ModelSpec, sockets: int, kv_tokens: int) -> float:
        """The share of an MoE model's routed experts in DDR beside a KV cache of
        `kv_tokens` tokens (rack/placement.py); 0 for a dense model."""
        if model.moe is None:
            return 0.0
        return place(model, self.platform, sockets, kv_tokens).cold_experts

    def step(
        self,
        model: ModelSpec,
        phase: Phase,
        plan: FusionPlan,
        batch: int,
        seq: int,
        sockets: int,
        cold: float | None = None,
    ) -> StepTiming:
        """One step; `cold`: the share of the routed experts in DDR (default: as this
        step's own KV cache leaves them; a serve batch passes its final placement's)."""
        return self._step(model, phase, plan, batch, seq, sockets, cold)

    def mixed(
        self,
        model: ModelSpec,
        plan: FusionPlan,
        shapes: tuple[Shape, ...],
        logits: int,
        sockets: int,
        cold: float,
    ) -> StepTiming:
        """One pass over several shapes at once (rack/kernels.py `mixed_step`)."""
        return self._mixed(model, plan, shapes, logits, sockets, cold)

    def _mixed_uncached(
        self,
        model: ModelSpec,
        plan: FusionPlan,
        shapes: tuple[Shape, ...],
        logits: int,
        sockets: int,
        cold: float,
    ) -> StepTiming:
        return self.timer(sockets).step(mixed_step(model, shapes, logits, sockets, cold), plan)

    @property
    def invocation_s(self) -> float:
        """What starting a model invocation costs before its first kernel (program and
        argument load; KernelCostSpec.invocation_ns)."""
        return self.platform.socket.kernels.invocation_ns * 1e-9

    def decode_loop_s(
        self,
        model: ModelSpec,
        plan: FusionPlan,
        batch: int,
        prompt_tokens: int,
        tokens: int,
        sockets: int,
    ) -> float:
        """`tokens` decode steps after a prompt. Each step attends to the context so far;
        decode time is linear in context between the roofline corners, so the mean
        context (prompt + tokens/2) gives the loop's time."""
        if tokens <= 0:
            return 0.0
        context = prompt_tokens + max(1, tokens // 2)
        return tokens * self.step(model, Phase.DECODE, plan, batch, context, sockets).total_s

    def default_decode_plan(self) -> FusionPlan:
        """Kernel looping on SN40L (the whole decode loop one kernel); GPUs unfused."""
        dataflow = self.platform.socket.kernels.dataflow_fusion
        return FusionPlan.KERNEL_LOOPED if dataflow else FusionPlan.UNFUSED

    def check_fits_hbm(
        self, model: ModelSpec, sockets: int, kv_tokens: int, extra: int = 0
    ) -> Placement:
        """Weights split over `sockets` plus the KV cache must fit in each socket's HBM
        (an MoE model's routed experts may stay in DDR: rack/placement.py)."""
        return place(model, self.platform, sockets, kv_tokens, extra)


# ------------------------------------------------------------------ fusion


@dataclass(frozen=True)
class FusionResult(Result):
    model: str
    phase: str
    seq: int
    sockets: int
    batch: int
    unfused_s: float
    fused_so_s: float
    fused_s: float
    kernel_looped_s: float | None
    speedup: float
    fused_kernel_calls: int
    unfused_kernel_calls: int
    hbm_bandwidth_utilization: float


def predict_fusion(
    p: Predictor, model: ModelSpec, phase: Phase, seq: int, sockets: int, batch: int = 1
) -> FusionResult:
    """One step (one prefill pass, one decoded token, one training step) unfused, fused
    host-orchestrated and fused hardware-orchestrated on `sockets` sockets."""
    if not p.platform.socket.kernels.dataflow_fusion:
        raise InvalidRequest(f"{p.platform.name} has no dataflow fusion; use an sn40l platform")
    kv = batch * seq if phase is not Phase.TRAIN else 0
    p.check_fits_hbm(model, sockets, kv)
    unfused = p.step(model, phase, FusionPlan.UNFUSED, batch, seq, sockets)
    fused_so = p.step(model, phase, FusionPlan.FUSED_SO, batch, seq, sockets)
    fused = p.step(model, phase, FusionPlan.FUSED_HO, batch, seq, sockets)
    looped = (
        p.step(model, phase, FusionPlan.KERNEL_LOOPED, batch, seq, sockets).total_s
        if phase is Phase.DECODE
        else None
    )
    peak = p.platform.socket.hbm.bandwidth_bytes_per_s
    return FusionResult(
        model=model.name,
        phase=phase.value,
        seq=seq,
        sockets=sockets,
        batch=batch,
        unfused_s=unfused.total_s,
        fused_so_s=fused_so.total_s,
        fused_s=fused.total_s,
        kernel_looped_s=looped,
        speedup=unfused.total_s / fused.total_s,
        fused_kernel_calls=fused.kernel_calls,
        unfused_kernel_calls=unfused.kernel_calls,
        hbm_bandwidth_utilization=fused.hbm_bytes / (fused.total_s * peak),
    )


# ------------------------------------------------------------------ decode throughput


@dataclass(frozen=True)
class DecodeResult(Result):
    platform: str
    model: str
    sockets: int
    batch: int
    context: int
    plan: str
    step_s: float
    tokens_per_s_per_user: float
    tokens_per_s: float
    hbm_bandwidth_utilization: float
    expert_mapping: str | None  # an MoE model's (rack/layers.py); None for a dense one
    placement: dict[str, float]  # bytes per socket by tier (rack/placement.py)
    # One step on one socket: the bytes each part of the model reads from HBM (weights;
    # the KV cache apart) and copies from DDR, and the time launches and exposed
    # collectives take.
    breakdown: dict[str, float]


# What a decode step reads, by part of the model: operator names (rack/layers.py).
PARTS = {
    "attention": {"qkv_proj", "q_down", "q_up", "kv_down", "q_absorb", "v_absorb", "kv_up",
                  "o_proj"},
    "dense_mlp": {"up_proj", "down_proj"},
    "router": {"router"},
    "shared_experts": {"shared_up", "shared_down"},
    "routed_experts": {"experts_up", "experts_down"},
    "embedding_and_head": {"embed", "lm_head"},
}  # fmt: skip


def step_breakdown(model: ModelSpec, t: StepTiming, s: Step) -> dict[str, float]:
    """Per socket, per step: `<part>_bytes` of weights each part reads, the KV cache
    read and written, other bytes (norms, activations between kernels), DDR copies,
    and the launch and exposed collective seconds."""
    parts = dict.fromkeys(PARTS, 0.0)
    kv = ddr = 0.0
    for block, n in s.blocks:
        for op in block.ops:
            part = next((k for k, names in PARTS.items() if op.name in names), None)
            if part is not None:
                parts[part] += n * op.weight_bytes
            kv += n * op.kv_bytes
            ddr += n * op.ddr_bytes
    weights = sum(parts.values())
    return {
        **{f"{k}_bytes": v for k, v in parts.items()},
        "kv_cache_bytes": kv,
        "other_hbm_bytes": max(0.0, t.hbm_bytes - weights - kv),
        "ddr_copy_bytes": ddr,
        "launch_s": t.launch_s,
        "collective_s": t.collective_s,
    }


def predict_decode(
    p: Predictor,
    model: ModelSpec,
    batch: int,
    sockets: int | None = None,
    context: int = 4096,
    plan: FusionPlan | None = None,
) -> DecodeResult:
    """Steady-state decode on a platform: kernel looping on SN40L, unfused on GPUs."""
    n = p.platform.sockets if sockets is None else sockets
    if plan is None:
        dataflow = p.platform.socket.kernels.dataflow_fusion
        plan = FusionPlan.KERNEL_LOOPED if dataflow else FusionPlan.UNFUSED
    placement = p.check_fits_hbm(model, n, batch * context)
    t = p.step(model, Phase.DECODE, plan, batch, context, n)
    mapping = expert_mapping(model, n)
    shape = step(model, Phase.DECODE, batch, context, n, cold_experts=placement.cold_experts)
    peak = p.platform.socket.hbm.bandwidth_bytes_per_s
    return DecodeResult(
        platform=p.platform.name,
        model=model.name,
        sockets=n,
        batch=batch,
        context=context,
        plan=plan.value,
        step_s=t.total_s,
        tokens_per_s_per_user=1.0 / t.total_s,
        tokens_per_s=batch / t.total_s,
        hbm_bandwidth_utilization=t.hbm_bytes / (t.total_s * peak),
        expert_mapping=None if mapping is None else mapping.value,
        placement=placement.to_dict(),
        breakdown=step_breakdown(model, t, shape),
    )


# ------------------------------------------------------------------ CoE serving


def table_v_prompt_tokens() -> int:
    """The prompt length of PAPER Table V's evaluation: not published, so an assumption
    fitted with the others (rack/calibration.py, `table_v.prompt_tokens`); it is also the
    default prompt of a CoE job."""
    return round(fitted_values()["table_v.prompt_tokens"])


# Assumption: host DRAM a DGX keeps for the OS, the framework and pinned staging buffers
# (not available to hold expert weights). PAPER does not say; 64 GB is a conservative
# figure for a 2 TB server. It only moves the DGX's expert limit from 148 to 143.
DGX_HOST_RESERVE_BYTES = 64_000_000_000


@dataclass(frozen=True)
class CoeSetting:
    """A batch of CoE requests, PAPER Sec. VI-C: the router runs once on the batch, then
    each (prompt, expert) pair runs in turn; every prompt goes to a different expert that
    is not yet in HBM (the paper's switching-bound case)."""

    experts: int = 150
    batch: int = 8
    output_tokens: int = 20
    prompt_tokens: int = field(default_factory=table_v_prompt_tokens)
    expert_model: str = "llama2-7b"
    router_model: str = "llama2-7b"
    sockets: int = 8  # TP8 on every platform, as in the paper
    decode_plan: FusionPlan | None = None  # None: the platform's default

    def __post_init__(self) -> None:
        for name in ("experts", "batch", "output_tokens", "prompt_tokens", "sockets"):
            if getattr(self, name) <= 0:
                raise InvalidRequest(
                    f"{name.replace('_', '-')} must be positive, got {getattr(self, name)}"
                )


@dataclass(frozen=True)
class CoeResult(Result):
    platform: str
    experts: int
    batch_size: int
    output_tokens: int
    prompt_tokens: int
    decode_plan: str
    oom: bool
    oom_reason: str | None = None
    total_s: float | None = None
    router_s: float | None = None
    switch_s: float | None = None
    switch_s_per_expert: float | None = None
    expert_s: float | None = None
    request_s: list[float] = field(default_factory=list)


def expert_capacity(p: PlatformSpec, expert: ModelSpec, sockets: int) -> int:
    """How many TP-split experts one node's capacity tier (DDR, or a DGX's host DRAM)
    holds: each socket keeps 1/sockets of every expert."""
    share = ceil(expert.weight_bytes / sockets)
    usable = p.socket.ddr.capacity_bytes
    if p.socket.kind == "gpu":
        usable -= ceil(DGX_HOST_RESERVE_BYTES / p.node.sockets)
    return max(0, usable // share)


def switch_time_s(p: PlatformSpec, nbytes: int, sockets: int) -> float:
    """Bring `nbytes` of weights, split over `sockets` of one node, into HBM: each socket
    copies its share at its own DDR->HBM rate, all under the node-level cap."""
    per_socket = nbytes / sockets / p.socket.ddr_to_hbm_bandwidth_bytes_per_s
    node = nbytes / p.node.ddr_to_hbm_node_bandwidth_bytes_per_s
    return max(per_socket, node)


def predict_coe(p: Predictor, s: CoeSetting, models: dict[str, ModelSpec]) -> CoeResult:
    plan = s.decode_plan or p.default_decode_plan()
    expert, router = models[s.expert_model], models[s.router_model]
    base: dict[str, Any] = {
        "platform": p.platform.name,
        "experts": s.experts,
        "batch_size": s.batch,
        "output_tokens": s.output_tokens,
        "prompt_tokens": s.prompt_tokens,
        "decode_plan": plan.value,
    }
    if s.sockets > p.platform.node.sockets:
        raise InvalidRequest(
            f"a CoE deployment runs on one node: {s.sockets} sockets > {p.platform.node.sockets}"
        )
    capacity = expert_capacity(p.platform, expert, s.sockets)
    if s.experts > capacity:
        tier = "host DRAM" if p.platform.socket.kind == "gpu" else "DDR"
        need = s.experts * expert.weight_bytes
        return CoeResult(
            **base,
            oom=True,
            oom_reason=(
                f"{s.experts} x {expert.name} experts need {need / 1e12:.2f} TB of {tier}; "
                f"a {p.platform.name} node holds at most {capacity} "
                f"({s.sockets} x {p.platform.socket.ddr.capacity_bytes / 1e9:.0f} GB"
                + (
                    f", less {DGX_HOST_RESERVE_BYTES / 1e9:.0f} GB reserved for the host)"
                    if p.platform.socket.kind == "gpu"
                    else ")"
                )
            ),
        )
    kv_tokens = s.prompt_tokens + s.output_tokens
    # HBM holds the router, one active expert and the KV cache of the batch.
    p.check_fits_hbm(
        router, s.sockets, s.batch * kv_tokens, extra=ceil(expert.weight_bytes / s.sockets)
    )
    router_s = (
        p.invocation_s
        + p.step(
            router,
            Phase.PREFILL,
            FusionPlan.FUSED_HO if plan is not FusionPlan.UNFUSED else FusionPlan.UNFUSED,
            s.batch,
            s.prompt_tokens,
            s.sockets,
        ).total_s
    )
    per_switch = switch_time_s(p.platform, expert.weight_bytes, s.sockets)
    prefill_plan = FusionPlan.UNFUSED if plan is FusionPlan.UNFUSED else FusionPlan.FUSED_HO
    prefill = p.step(expert, Phase.PREFILL, prefill_plan, 1, s.prompt_tokens, s.sockets).total_s
    decode = p.decode_loop_s(expert, plan, 1, s.prompt_tokens, s.output_tokens - 1, s.sockets)
    expert_each = p.invocation_s + prefill + decode
    requests = [router_s + (i + 1) * (per_switch + expert_each) for i in range(s.batch)]
    return CoeResult(
        **base,
        oom=False,
        total_s=requests[-1],
        router_s=router_s,
        switch_s=s.batch * per_switch,
        switch_s_per_expert=per_switch,
        expert_s=s.batch * expert_each,
        request_s=requests,
    )


# ------------------------------------------------------------------ footprint


@dataclass(frozen=True)
class FootprintResult(Result):
    platform: str
    expert_model: str
    serving_tier: str
    max_experts: int
    experts: int | None
    nodes_needed: int | None


def predict_footprint(
    platform: PlatformSpec, expert: ModelSpec, experts: int | None = None
) -> FootprintResult:
    """Experts a node holds where it serves them from without slow switching: an SN40L
    node in DDR (switching at over 1 TB/s); a DGX in HBM (its host link is 32-64 GB/s),
    as PAPER's footprint comparison assumes. Weights are TP-split over the node."""
    sockets = platform.node.sockets
    if platform.socket.kind == "rdu":
        tier, per_node = "ddr", expert_capacity(platform, expert, sockets)
    else:
        tier = "hbm"
        per_node = platform.socket.hbm.capacity_bytes // ceil(expert.weight_bytes / sockets)
    if experts is not None and experts <= 0:
        raise InvalidRequest(f"experts must be positive, got {experts}")
    nodes = None if experts is None or per_node == 0 else ceil(experts / per_node)
    return FootprintResult(platform.name, expert.name, tier, per_node, experts, nodes)
