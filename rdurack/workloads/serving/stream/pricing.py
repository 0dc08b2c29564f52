"""What an iteration costs the model's sockets, by the one timing model.

- A prefill iteration: the prompts it admits, those of one length as one batched pass
  (`Predictor.step` at that batch and length), after the model's invocation (its
  program and argument load), as a batch's prefill is priced (serving/costs.py). Two
  prompts of different lengths are two passes: the timing model prices a pass of one
  length, and a causal pass's attention grows with the square of its length, which a
  mean length would understate.
- A decode iteration: one step of every request in it, the batch attending to its
  mean context. A step's cost is linear in the context its sequences attend to
  (KV-cache reads and attention FLOPs add up over the sequences; weights are read once
  for the batch), so the mean is exact; at a fractional mean the cost is interpolated
  between the two integer contexts around it, as a speculative iteration's is.

The budget of the KV cache is what leaves every routed expert in HBM (rack/placement.py
`capacity`), so no step copies experts from DDR.
"""

from __future__ import annotations

from collections import Counter
from math import floor

from rdurack.rack.kernels import FusionPlan, Phase
from rdurack.rack.models import ModelSpec
from rdurack.rack.placement import capacity
from rdurack.workloads.predictor import Predictor
from rdurack.workloads.serving.costs import Cost
from rdurack.workloads.serving.stream.scheduler import Iteration

HOT = 0.0  # the share of routed experts in DDR under the KV budget (see above)


def kv_budget_tokens(p: Predictor, model: ModelSpec, sockets: int) -> int:
    """KV-cache tokens the sockets hold beside the model with its experts all in HBM."""
    return capacity(model, p.platform, sockets, context=1).max_batch_experts_in_hbm


class Pricer:
    """Prices iterations of one model on `sockets` sockets."""

    def __init__(self, p: Predictor, model: ModelSpec, sockets: int, plan: FusionPlan) -> None:
        self.predictor = p
        self.model = model
        self.sockets = sockets
        self.plan = plan
        # Kernel looping loops the decode; a prefill is one fused pass per layer.
        self.prefill_plan = FusionPlan.FUSED_HO if plan is FusionPlan.KERNEL_LOOPED else plan

    def __call__(self, it: Iteration) -> Cost:
        cost = Cost()
        if it.prefill:
            invocation = self.predictor.invocation_s
            cost += Cost(seconds=invocation, launch_s=invocation)
            lengths = Counter(r.arrival.prompt_tokens for r in it.prefill)
            for length, count in sorted(lengths.items()):
                cost += self._step(Phase.PREFILL, self.prefill_plan, count, length)
        members = (*it.decode, *it.padding)
        if members:
            # A done request (padding) is computed at its final context.
            mean = sum(r.context for r in members) / len(members)
            cost += self._decode(len(members), mean)
        return cost

    def _step(self, phase: Phase, plan: FusionPlan, batch: int, seq: int) -> Cost:
        timing = self.predictor.step(self.model, phase, plan, batch, seq, self.sockets, HOT)
        return Cost.of(timing)

    def _decode(self, batch: int, context: float) -> Cost:
        low = floor(context)
        share = context - low
        lo = self._step(Phase.DECODE, self.plan, batch, low)
        if share < 1e-9:
            return lo
        hi = self._step(Phase.DECODE, self.plan, batch, low + 1)
        return Cost(*(x + (y - x) * share for x, y in zip(lo.vector(), hi.vector(), strict=True)))
