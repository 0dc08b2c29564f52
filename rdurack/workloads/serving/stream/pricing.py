"""What an iteration costs the model's sockets, by the one timing model.

An iteration is one forward pass (rack/kernels.py `mixed_step`): every matmul runs over
all its new tokens, reading the weights once, and attention sums each request's own
work. The requests are grouped into shapes of equal lengths: prompts (or chunks of
them) that attend causally to what precedes them, decode steps that attend to their
whole context. So the cost is exact whatever the mix, and a batch of equal requests
arriving at once costs what `rdu predict serve` says of it.

- An iteration that starts a request (its prompt's first tokens) pays the model's
  invocation first (PAPER Sec. III's program and argument load, fitted at about 40 ms:
  docs/figures.md), as a batch's prefill does (serving/costs.py); the later chunks of a
  prompt under way do not, nor does a decode step.
- Plans: a prefill-only iteration runs the prefill's plan (fused, hardware-orchestrated
  under a kernel-looped decode); any other the decode's.
- The KV budget is what leaves every routed expert in HBM (rack/placement.py
  `capacity`), so no step copies experts from DDR.
- A CoE bundle's iteration (serving/stream/bundle.py) runs one expert: first, the
  router's prefill of the prompts it routes (whole prompts, the prefill's plan), then
  the switch of the expert into HBM if it is not there (`switch_time_s`), then the
  expert's pass. The three run one after another: the expert is not known before the
  router has run, nor usable before it is in HBM.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from rdurack.errors import InvalidRequest
from rdurack.rack.kernels import FusionPlan, Shape
from rdurack.rack.models import ModelSpec
from rdurack.rack.placement import capacity
from rdurack.workloads.predictor import Predictor, switch_time_s
from rdurack.workloads.serving.batch import prefill_plan
from rdurack.workloads.serving.costs import Cost
from rdurack.workloads.serving.stream.bundle import Bundle
from rdurack.workloads.serving.stream.scheduler import Iteration

HOT = 0.0  # the share of routed experts in DDR under the KV budget (see above)


def kv_budget_tokens(p: Predictor, model: ModelSpec, sockets: int) -> int:
    """KV-cache tokens the sockets hold beside the model with its experts all in HBM."""
    return capacity(model, p.platform, sockets, context=1).max_batch_experts_in_hbm


def _merged(count: Counter[tuple[int, int, bool]]) -> tuple[Shape, ...]:
    merged = (Shape(k, new, context, causal) for (new, context, causal), k in count.items())
    return tuple(sorted(merged, key=lambda s: (s.causal, s.new_tokens, s.context)))


def routed_shapes(it: Iteration) -> tuple[Shape, ...]:
    """The prompts the router reads in this iteration: those of routed requests it
    starts, whole."""
    count: Counter[tuple[int, int, bool]] = Counter()
    for r, _ in it.prefill:
        if r.arrival.routed and r.prefilled == 0:
            count[(r.arrival.prompt_tokens, r.arrival.prompt_tokens, True)] += 1
    return _merged(count)


def shapes(it: Iteration) -> tuple[tuple[Shape, ...], int]:
    """The iteration's shapes, equal ones merged (sorted, so that equal iterations are
    equal keys), and the new tokens whose next token is sampled."""
    count: Counter[tuple[int, int, bool]] = Counter()
    logits = 0
    for r, n in it.prefill:
        count[(n, r.prefilled + n, True)] += 1
        logits += r.prefilled + n == r.arrival.prompt_tokens  # a prompt's last chunk
    for r in (*it.decode, *it.padding):  # padding: computed at its final context
        count[(1, r.context, False)] += 1
        logits += 1
    return _merged(count), logits


@dataclass(frozen=True, slots=True)
class Pass:
    """What the sockets run for an iteration: its shapes under one plan, the new tokens
    whose next token is sampled, and whether it starts a request (pays the invocation);
    of a bundle, its expert, whether it switches it in, and the router's prompts.
    A rack's sockets price it by `cost`, as the predictor does (`rdu serve --rack`)."""

    plan: FusionPlan
    shapes: tuple[Shape, ...]
    logits: int
    invokes: bool
    expert: str = ""
    switch: bool = False
    routed: tuple[Shape, ...] = ()


def cost(
    p: Predictor, model: ModelSpec, sockets: int, done: Pass, router: ModelSpec | None = None
) -> Cost:
    """One pass of `model` (a bundle's: its expert model, and its `router`) on a TP
    group of `sockets`, by the one timing model."""
    timing = p.mixed(model, done.plan, done.shapes, done.logits, sockets, HOT)
    out = Cost.of(timing)
    if done.invokes:
        invocation = p.invocation_s
        out += Cost(seconds=invocation, launch_s=invocation)
    if done.routed:
        if router is None:
            raise InvalidRequest(f"{model.name} is not a bundle: it has no router")
        plan = prefill_plan(done.plan)
        logits = sum(s.batch for s in done.routed)  # a prompt's last token picks
        out += Cost.of(p.mixed(router, plan, done.routed, logits, sockets, HOT))
    if done.switch:
        switch = switch_time_s(p.platform, model.weight_bytes, sockets)
        out += Cost(seconds=switch)  # a copy: no launch, no collective
    return out


class Pricer:
    """Prices iterations of one model (or of a `bundle`: its experts' model and its
    router) on `sockets` sockets."""

    def __init__(
        self,
        p: Predictor,
        model: ModelSpec,
        sockets: int,
        plan: FusionPlan,
        bundle: Bundle | None = None,
    ) -> None:
        self.predictor = p
        self.model = model
        self.sockets = sockets
        self.plan = plan
        self.prefill_plan = prefill_plan(plan)
        self.bundle = bundle
        self.router = None if bundle is None else bundle.router_model

    def __call__(self, it: Iteration) -> Cost:
        return self.cost(self.pass_of(it))

    def cost(self, done: Pass) -> Cost:
        return cost(self.predictor, self.model, self.sockets, done, self.router)

    def seconds(self, done: Pass) -> float:
        return self.cost(done).seconds

    def pass_of(self, it: Iteration) -> Pass:
        parts, logits = shapes(it)
        prefill_only = not it.decode and not it.padding
        plan = self.prefill_plan if prefill_only else self.plan
        invokes = any(r.prefilled == 0 for r, _ in it.prefill)
        return Pass(plan, parts, logits, invokes, it.expert, it.switch, routed_shapes(it))
