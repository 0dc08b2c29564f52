"""A batch of requests to serve, and the batch resolved on a platform: its target and
draft models, its plans, its decode iterations, and the HBM it holds (refused, with the
numbers, when it does not fit).

A batch of B requests of P prompt tokens, each generating O tokens, on S sockets
(tensor parallel): one prefill pass yields the first token; then O - 1 decode steps,
or, speculating, ceil((O - 1) / E) iterations of k draft steps and one verification
pass, E being the expected tokens per iteration (serving/speculative.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from math import ceil

from rdurack.errors import InvalidRequest, OutOfMemory, UnknownName
from rdurack.rack.kernels import FusionPlan, Phase, step
from rdurack.rack.models import ExpertMapping, ModelSpec
from rdurack.rack.placement import Placement, place
from rdurack.rack.spec import PlatformSpec
from rdurack.workloads.serving.speculative import SpeculativeSetting

# The kernel-job phase that runs a whole batch (prefill, then decode). Not a
# rack/kernels.Phase: those are the phases of one step.
SERVE = "serve"


@dataclass(frozen=True)
class ServeRequest:
    """What a user asks: a batch of requests of one model (`sockets` None: every socket
    of the platform; `plan` None: the platform's default decode plan)."""

    model: str
    batch_size: int
    prompt_tokens: int
    output_tokens: int
    sockets: int | None = None
    plan: FusionPlan | None = None
    speculative: SpeculativeSetting | None = None
    expert_mapping: ExpertMapping | None = None  # an MoE target's; None: the default

    def __post_init__(self) -> None:
        for name in ("batch_size", "prompt_tokens", "output_tokens", "sockets"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise InvalidRequest(f"{name.replace('_', '-')} must be positive, got {value}")


@dataclass(frozen=True)
class ServeBatch:
    """A request resolved on a platform: its models, plans and decode iterations."""

    request: ServeRequest
    platform: PlatformSpec
    target: ModelSpec
    draft: ModelSpec | None
    sockets: int
    plan: FusionPlan  # decode (the draft's steps too)
    prefill_plan: FusionPlan
    draft_tokens: int  # k; 0 without speculation
    tokens_per_iteration: float  # E; 1 without speculation

    @property
    def iterations(self) -> int:
        """Decode iterations after the prefill's token (O - 1 steps without speculation)."""
        rest = self.request.output_tokens - 1
        # The tolerance keeps float rounding of rest / E from adding an iteration.
        return ceil(rest / self.tokens_per_iteration - 1e-9) if rest else 0

    @property
    def steps(self) -> int:
        """The prefill and every decode iteration: a serve job's steps."""
        return 1 + self.iterations

    @property
    def models(self) -> list[ModelSpec]:
        """The target, and the draft when speculating."""
        return [self.target] if self.draft is None else [self.target, self.draft]

    def kv_tokens(self) -> int:
        """Tokens of KV cache each model holds at the end, the whole batch: prompt and
        output, and the drafts of the last verification pass."""
        r = self.request
        return r.batch_size * (r.prompt_tokens + r.output_tokens + self.draft_tokens)

    def kv_cache_bytes(self) -> int:
        """The KV caches at the end, every model, as one logical cache each (a socket
        may hold a copy of a part another holds: rack/placement.py)."""
        return sum(self.kv_tokens() * m.kv_bytes_per_token() for m in self.models)

    @cached_property
    def placements(self) -> list[Placement]:
        """Each model's placement at the end of the batch (rack/placement.py), in the
        order of `models`; the socket actors hold exactly these. A draft's HBM comes
        first: an MoE target's experts fill what is left. Over HBM, they are returned
        all the same: `resolve` refuses them, with the batch's numbers."""
        kv, s = self.kv_tokens(), self.sockets
        if self.draft is None:
            return [place(self.target, self.platform, s, kv, strict=False)]
        draft = place(self.draft, self.platform, s, kv, strict=False)
        return [place(self.target, self.platform, s, kv, draft.hbm_bytes, strict=False), draft]

    @cached_property
    def cold_experts(self) -> list[float]:
        """Each model's share of routed experts in DDR (0 for a dense one), in the order
        of `models`. Cached, as `placements`: a serve prices hundreds of steps of one
        batch."""
        return [p.cold_experts for p in self.placements]

    def held_per_socket(self) -> int:
        """HBM a socket holds at the end: its share of every model's weights and KV
        cache, rounded up as the socket actors allocate them (node_agent/job_memory.py)."""
        return sum(p.hbm_bytes for p in self.placements)


def prefill_plan(plan: FusionPlan) -> FusionPlan:
    """The prefill's plan under a decode `plan`: kernel looping loops the decode; the
    prefill is one fused pass per layer. Else the decode's."""
    return FusionPlan.FUSED_HO if plan is FusionPlan.KERNEL_LOOPED else plan


def resolve(
    request: ServeRequest, platform: PlatformSpec, models: dict[str, ModelSpec]
) -> ServeBatch:
    """The request on `platform`, or one line saying why it cannot run: an unknown
    model, a socket count the platform lacks or that does not divide the heads, a plan
    the platform cannot run, a draft that cannot draft, a batch that does not fit HBM."""
    if request.model not in models:
        raise UnknownName("model", request.model, sorted(models))
    target = models[request.model].placed(request.expert_mapping)
    sockets = platform.sockets if request.sockets is None else request.sockets
    if sockets > platform.sockets:
        raise InvalidRequest(
            f"{platform.name} has {platform.sockets} sockets; cannot use {sockets}"
        )
    dataflow = platform.socket.kernels.dataflow_fusion
    plan = request.plan or (FusionPlan.KERNEL_LOOPED if dataflow else FusionPlan.UNFUSED)
    if plan is not FusionPlan.UNFUSED and not dataflow:
        raise InvalidRequest(
            f"{platform.name} runs unfused kernels only (no dataflow fusion); asked for "
            f"{plan.value}"
        )
    spec = request.speculative
    batch = ServeBatch(
        request=request,
        platform=platform,
        target=target,
        draft=None if spec is None else spec.draft_of(target, models),
        sockets=sockets,
        plan=plan,
        prefill_plan=prefill_plan(plan),
        draft_tokens=0 if spec is None else spec.draft_tokens,
        tokens_per_iteration=1.0 if spec is None else spec.tokens_per_iteration,
    )
    for m in batch.models:
        step(m, Phase.DECODE, 1, 1, sockets)  # TP over the sockets must divide the heads
    need, cap = batch.held_per_socket(), platform.socket.hbm.capacity_bytes
    if need > cap:
        draft = f" and draft {batch.draft.name}" if batch.draft is not None else ""
        raise OutOfMemory(
            f"{platform.name} socket",
            "hbm",
            need,
            cap,
            what=f"{target.name}{draft} (weights and KV cache of {request.batch_size} x "
            f"{request.prompt_tokens + request.output_tokens} tokens) split over "
            f"{sockets} sockets",
        )
    return batch
