"""What a client asks of a Composition-of-Experts inference job (the job spec's `coe`
workload), and the requests it turns into.

Where the requests come from, first that applies: a `trace` (replayed at its arrival
times), a `poisson` load, the `prompts` (all arriving at once), or else one batch of
`batch_size` synthetic prompts of `prompt_tokens` tokens, each for a different expert:
PAPER Sec. VI-C's switching-bound case, which Table V measures.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
from pydantic import Field, model_validator

from rdurack.config import Config
from rdurack.errors import InvalidRequest
from rdurack.rack.kernels import FusionPlan
from rdurack.workloads.coe.router import Router, RoutingPolicy, hash_route, resolve_hint, tokenize
from rdurack.workloads.predictor import table_v_prompt_tokens

# Bounds that keep one job's spec and result within gRPC's default 4 MB messages.
MAX_REQUESTS = 20_000
MAX_PROMPT_CHARS = 20_000
MAX_TOKENS = 1 << 20


class TraceRequest(Config):
    """One line of a request trace (JSONL): when it arrives and what it asks."""

    arrival_s: float = Field(default=0.0, ge=0, le=1e7)  # emulated s after the job starts
    prompt: str | None = Field(default=None, max_length=MAX_PROMPT_CHARS)
    prompt_tokens: int | None = Field(default=None, gt=0, le=MAX_TOKENS)
    expert: str | None = Field(default=None, max_length=200)  # an expert hint
    output_tokens: int | None = Field(default=None, gt=0, le=1 << 16)

    @model_validator(mode="after")
    def _one_prompt(self) -> TraceRequest:
        if (self.prompt is None) == (self.prompt_tokens is None):
            raise ValueError("give exactly one of prompt or prompt_tokens")
        return self


class PoissonLoad(Config):
    """Requests arriving as a Poisson process, experts drawn with a Zipf skew."""

    requests: int = Field(gt=0, le=MAX_REQUESTS)
    rate_per_s: float = Field(gt=0, le=1e6)  # mean arrivals per emulated second
    skew: float = Field(default=1.0, ge=0, le=5)  # Zipf exponent over experts; 0: uniform
    seed: int = Field(default=0, ge=0)


class CoeWorkload(Config):
    """Serve prompts with a model bundle: a router and `num_experts` experts."""

    kind: Literal["coe_inference"] = "coe_inference"
    num_experts: int = Field(default=150, gt=0, le=10_000)
    expert_model: str = Field(default="llama2-7b", min_length=1, max_length=100)
    router_model: str = Field(default="llama2-7b", min_length=1, max_length=100)
    batch_size: int = Field(default=8, gt=0, le=1024)
    output_tokens: int = Field(default=20, gt=0, le=1 << 16)
    prompt_tokens: int = Field(default_factory=table_v_prompt_tokens, gt=0, le=MAX_TOKENS)
    prompts: list[str] = Field(default_factory=list, max_length=MAX_REQUESTS)
    expert_hints: list[str] = Field(default_factory=list, max_length=MAX_REQUESTS)
    routing: RoutingPolicy = RoutingPolicy.ROUTER
    trace: list[TraceRequest] = Field(default_factory=list, max_length=MAX_REQUESTS)
    poisson: PoissonLoad | None = None
    node_routing: Literal["cache-aware", "random"] = "cache-aware"
    pinned_experts: list[str] = Field(default_factory=list, max_length=10_000)
    reserved_hbm_bytes: int | None = Field(default=None, gt=0)  # per socket
    decode_plan: FusionPlan | None = None  # None: kernel-looped on SN40L, unfused on GPUs
    num_sockets: int = Field(default=8, gt=0, le=1024)  # 8: one node; 16: both serve
    # Sockets per serving replica (TP degree); None: a whole node, as in PAPER (TP8).
    tensor_parallel: int | None = Field(default=None, gt=0, le=64)
    seed: int = Field(default=0, ge=0)

    @model_validator(mode="after")
    def _consistent(self) -> CoeWorkload:
        for p in self.prompts:
            if len(p) > MAX_PROMPT_CHARS:
                raise ValueError(f"a prompt is longer than {MAX_PROMPT_CHARS} characters")
        if self.expert_hints and len(self.expert_hints) != len(self.prompts):
            raise ValueError(
                f"expert_hints: {len(self.expert_hints)} hints for {len(self.prompts)} prompts"
            )
        sources = [bool(self.trace), self.poisson is not None]
        if sum(sources) > 1:
            raise ValueError("give at most one of trace and poisson")
        if (self.trace or self.poisson) and self.prompts:
            raise ValueError("prompts cannot be combined with a trace or a Poisson load")
        return self


@dataclass(frozen=True)
class CoeRequest:
    """One request after routing. Times are emulated ns after the job's start."""

    index: int
    arrival_ns: int
    prompt_tokens: int
    output_tokens: int
    expert: int  # index into the catalog
    prompt_ids: tuple[int, ...] = ()  # the prompt's tokens, when it has a text


def route_one(
    w: CoeWorkload, router: Router, n: int, text: str | None, ids: tuple[int, ...], hint: str | None
) -> int:
    """Request `n`'s expert: its hint when it has one (any policy); otherwise by the
    policy: the router on its text, or a stable hash of its token ids (of its index,
    when it has only a token count)."""
    if hint:
        return resolve_hint(hint, router.names)
    if w.routing is RoutingPolicy.HINT:
        raise InvalidRequest(f"request {n}: routing 'hint' needs an expert hint")
    if w.routing is RoutingPolicy.ROUTER and text is not None:
        return router.route(text)
    return hash_route(ids or (n,), router.n_experts)


def build_requests(w: CoeWorkload, router: Router) -> list[CoeRequest]:
    """The job's requests in arrival order, each routed to an expert."""
    if w.trace:
        out = []
        for n, t in enumerate(sorted(w.trace, key=lambda t: t.arrival_s)):
            ids = tuple(tokenize(t.prompt)) if t.prompt is not None else ()
            tokens = len(ids) if t.prompt is not None else (t.prompt_tokens or 1)
            expert = route_one(w, router, n, t.prompt, ids, t.expert)
            arrival = round(t.arrival_s * 1e9)
            out_tokens = t.output_tokens or w.output_tokens
            out.append(CoeRequest(n, arrival, max(1, tokens), out_tokens, expert, ids))
        return out
    if w.poisson is not None:
        p = w.poisson
        rng = np.random.default_rng(p.seed)
        arrivals = np.cumsum(rng.exponential(1.0 / p.rate_per_s, p.requests))
        weights = np.arange(1, router.n_experts + 1, dtype=np.float64) ** -p.skew
        experts = rng.choice(router.n_experts, size=p.requests, p=weights / weights.sum())
        return [
            CoeRequest(n, round(float(arrivals[n]) * 1e9), w.prompt_tokens, w.output_tokens, int(e))
            for n, e in enumerate(experts)
        ]
    if w.prompts:
        out = []
        for n, text in enumerate(w.prompts):
            ids = tuple(tokenize(text))
            hint = w.expert_hints[n] if w.expert_hints else None
            expert = route_one(w, router, n, text, ids, hint)
            out.append(CoeRequest(n, 0, max(1, len(ids)), w.output_tokens, expert, ids))
        return out
    # PAPER's switching-bound batch: each prompt for a different expert.
    return [
        CoeRequest(n, 0, w.prompt_tokens, w.output_tokens, n % router.n_experts)
        for n in range(w.batch_size)
    ]
