"""What a batch's prefill and decode cost one socket, by the timing model
(rack/timing.Timer through the Predictor), kernel launches and TP collectives inside
each step.

- prefill: one pass over the batch's prompts (the draft's too, when speculating), after
  each model's invocation (loading its program and arguments);
- decode iteration i starts from P + i x E tokens of context, E the expected tokens per
  iteration (1 without speculation: step j attends to P + j tokens, so its KV-cache
  reads grow with every token). A plain iteration is one decode step; a speculative one
  is k draft steps and a verification pass of k + 1 new tokens per sequence. At a
  fractional context (E is a mean: the expected-value model of Leviathan et al.) its
  cost is the linear interpolation of the two integer contexts around it;
- the decode is summed over its iterations by serving/step_sum.py, exactly.

A serve job's steps are numbered: step 0 is the prefill, step i >= 1 decode iteration
i - 1 (`split_steps`); the cluster runs them in `segments`, each socket pricing its
call's `serve_parts`, and sums the same costs.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from math import floor

from rdurack.errors import InvalidRequest
from rdurack.rack.kernels import Phase, step
from rdurack.rack.timing import StepTiming
from rdurack.workloads.predictor import Predictor
from rdurack.workloads.serving.batch import ServeBatch
from rdurack.workloads.serving.step_sum import Vector, linear_sum


@dataclass(frozen=True)
class Cost:
    """What a part of the batch costs one socket (each socket of the TP group the same)."""

    seconds: float = 0.0
    launch_s: float = 0.0
    collective_s: float = 0.0
    hbm_bytes: float = 0.0
    flops: float = 0.0
    kernel_calls: float = 0.0

    @classmethod
    def of(cls, t: StepTiming) -> Cost:
        return cls(t.total_s, t.launch_s, t.collective_s, t.hbm_bytes, t.flops, t.kernel_calls)

    def vector(self) -> Vector:
        return tuple(getattr(self, f.name) for f in fields(self))

    def __add__(self, other: Cost) -> Cost:
        return Cost(*(a + b for a, b in zip(self.vector(), other.vector(), strict=True)))


def prefill_cost(p: Predictor, b: ServeBatch) -> Cost:
    """The prefill pass of every model of the batch (the target, and the draft), each
    model's invocation first (its program and argument load, KernelCostSpec.invocation_ns,
    counted with the launches)."""
    r = b.request
    cost = Cost()
    for m, cold in zip(b.models, b.cold_experts, strict=True):
        timing = p.step(
            m, Phase.PREFILL, b.prefill_plan, r.batch_size, r.prompt_tokens, b.sockets, cold
        )
        cost += Cost.of(timing) + Cost(seconds=p.invocation_s, launch_s=p.invocation_s)
    return cost


def iteration_cost(p: Predictor, b: ServeBatch, base: int) -> Cost:
    """One decode iteration from `base` tokens of context: a plain step attending to
    base + 1 tokens, or k draft steps and a verification pass of k + 1 new tokens."""
    batch, k = b.request.batch_size, b.draft_tokens
    # The experts in DDR are those of the batch's placement, as its sockets hold it.
    cold, *draft_cold = b.cold_experts
    if b.draft is None:
        return Cost.of(p.step(b.target, Phase.DECODE, b.plan, batch, base + 1, b.sockets, cold))
    # Predictor.step prices one new token per sequence; the verification pass has k + 1.
    verify = step(
        b.target, Phase.DECODE, batch, base + k + 1, b.sockets, new_tokens=k + 1, cold_experts=cold
    )
    cost = Cost.of(p.timer(b.sockets).step(verify, b.plan))
    for j in range(1, k + 1):
        cost += Cost.of(
            p.step(b.draft, Phase.DECODE, b.plan, batch, base + j, b.sockets, draft_cold[0])
        )
    return cost


def decode_cost(p: Predictor, b: ServeBatch, first: int, count: int) -> Cost:
    """Decode iterations first .. first + count - 1."""
    if count <= 0:
        return Cost()
    memo: dict[int, Vector] = {}

    def at_context(base: int) -> Vector:
        if base not in memo:
            memo[base] = iteration_cost(p, b, base).vector()
        return memo[base]

    def at(i: int) -> Vector:
        base = b.request.prompt_tokens + i * b.tokens_per_iteration
        low = floor(base)
        share = base - low
        if share < 1e-9:  # an integer context, but for float rounding
            return at_context(low)
        lo, hi = at_context(low), at_context(low + 1)
        return tuple(x + (y - x) * share for x, y in zip(lo, hi, strict=True))

    return Cost(*linear_sum(at, first, first + count - 1))


def split_steps(b: ServeBatch, first: int, count: int) -> tuple[bool, int, int]:
    """Steps first .. first + count - 1 of a serve job as (whether the prefill is among
    them, their first decode iteration, how many decode iterations)."""
    if first < 0 or count <= 0 or first + count > b.steps:
        raise InvalidRequest(
            f"steps {first} to {first + count - 1} are not steps of this batch (0 is the "
            f"prefill, 1 to {b.steps - 1} the decode iterations)"
        )
    start = max(first, 1)
    return first == 0, start - 1, first + count - start


@dataclass(frozen=True)
class Part:
    """The prefill, or a run of decode iterations, of a call that runs a serve job's
    steps: what it costs, and which iterations it holds."""

    phase: str  # "prefill" or "decode"
    cost: Cost
    first_iteration: int = 0
    iterations: int = 0


def serve_parts(p: Predictor, b: ServeBatch, first: int, count: int) -> list[Part]:
    """Steps first .. first + count - 1 of a serve job, priced: the prefill if step 0 is
    among them, then their decode iterations."""
    prefill, it, n = split_steps(b, first, count)
    parts = [Part("prefill", prefill_cost(p, b))] if prefill else []
    if n:
        parts.append(Part("decode", decode_cost(p, b, it, n), it, n))
    return parts


def segments(b: ServeBatch, chunks: int) -> list[tuple[int, int]]:
    """A serve job's steps as (first, count) segments: the prefill alone, then the
    decode iterations in up to `chunks` segments (a progress report after each)."""
    n = b.iterations
    parts = min(max(1, chunks), n)
    out, first = [(0, 1)], 1
    for i in range(parts):
        count = n // parts + (1 if i < n % parts else 0)
        out.append((first, count))
        first += count
    return out
