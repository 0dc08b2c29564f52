"""The predictions of serving, in one process: a batch end to end (`rdu predict serve`)
and steady-state speculative decode (`rdu predict decode --speculative`)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from rdurack.errors import InvalidRequest
from rdurack.rack.layers import expert_mapping
from rdurack.rack.models import ModelSpec
from rdurack.workloads.predictor import DecodeResult, Predictor
from rdurack.workloads.serving.batch import ServeRequest, resolve
from rdurack.workloads.serving.costs import decode_cost, iteration_cost, prefill_cost
from rdurack.workloads.serving.report import ServeReport, report


def predict_serve(p: Predictor, request: ServeRequest, models: dict[str, ModelSpec]) -> ServeReport:
    """A batch of requests end to end on the predictor's platform."""
    b = resolve(request, p.platform, models)
    return report(b, prefill_cost(p, b), decode_cost(p, b, 0, b.iterations))


@dataclass(frozen=True)
class SpeculativeDecodeResult(DecodeResult):
    """Steady-state speculative decode: step_s is an iteration's time over the tokens it
    yields (so tokens/s per user is what a user sees), with the assumptions it used."""

    draft_model: str
    draft_tokens: int
    acceptance: float
    tokens_per_iteration: float
    iteration_s: float


def predict_speculative_decode(
    p: Predictor, request: ServeRequest, context: int, models: dict[str, ModelSpec]
) -> SpeculativeDecodeResult:
    """Speculative decode at `context` tokens (the context a plain step attends to): one
    iteration from context - 1 tokens. Both models' weights and KV caches must fit HBM
    with `context` tokens per sequence (and the drafts of one iteration)."""
    spec = request.speculative
    if spec is None:
        raise InvalidRequest("a speculative decode needs a speculative setting")
    if context < 2:
        raise InvalidRequest(
            f"context: a speculative decode needs at least 2 tokens, got {context}"
        )
    b = resolve(replace(request, prompt_tokens=context - 1, output_tokens=1), p.platform, models)
    assert b.draft is not None  # resolve gives a speculative request its draft
    cost = iteration_cost(p, b, context - 1)
    mapping = expert_mapping(b.target, b.sockets)
    per_token = cost.seconds / b.tokens_per_iteration
    return SpeculativeDecodeResult(
        platform=p.platform.name,
        model=b.target.name,
        sockets=b.sockets,
        batch=request.batch_size,
        context=context,
        plan=b.plan.value,
        step_s=per_token,
        tokens_per_s_per_user=1.0 / per_token,
        tokens_per_s=request.batch_size / per_token,
        hbm_bandwidth_utilization=cost.hbm_bytes
        / (cost.seconds * p.platform.socket.hbm.bandwidth_bytes_per_s),
        expert_mapping=None if mapping is None else mapping.value,
        placement=b.placements[0].to_dict(),  # the target's
        breakdown={},  # an iteration is two models' steps: serve's breakdown says it
        draft_model=b.draft.name,
        draft_tokens=b.draft_tokens,
        acceptance=spec.acceptance,
        tokens_per_iteration=b.tokens_per_iteration,
        iteration_s=cost.seconds,
    )
