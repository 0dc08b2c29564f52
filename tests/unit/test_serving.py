"""Serving a batch end to end (workloads/serving/): the figures and what they mean, the
exact sum of the decode against its step-by-step reference, speculative decoding, and
the requests that are refused."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest

from rdurack.errors import InvalidRequest, OutOfMemory, UnknownName
from rdurack.rack.kernels import FusionPlan, Phase, step
from rdurack.rack.models import builtin_models
from rdurack.rack.presets import builtin_platforms, platform
from rdurack.workloads.predictor import Predictor, predict_decode
from rdurack.workloads.serving import costs
from rdurack.workloads.serving.batch import ServeRequest, resolve
from rdurack.workloads.serving.costs import (
    Cost,
    decode_cost,
    iteration_cost,
    prefill_cost,
    segments,
    split_steps,
)
from rdurack.workloads.serving.predict import predict_serve, predict_speculative_decode
from rdurack.workloads.serving.report import ServeReport
from rdurack.workloads.serving.speculative import (
    SpeculativeSetting,
    expected_tokens,
)
from rdurack.workloads.serving.step_sum import Vector, exact_sum, linear_sum

MODELS = builtin_models()
PLATFORMS = sorted(builtin_platforms())
SPEC = SpeculativeSetting()


def _serve(name: str, model: str = "llama3.1-8b", **kw: Any) -> ServeReport:
    fields: dict[str, Any] = {"batch_size": 1, "prompt_tokens": 128, "output_tokens": 64}
    return predict_serve(Predictor(platform(name)), ServeRequest(model, **fields | kw), MODELS)


def _itl(r: ServeReport) -> float:
    assert r.itl_s is not None
    return r.itl_s


# ------------------------------------------------------------------ the exact sum


def test_linear_sum_is_exact_on_piecewise_linear_functions() -> None:
    def f(i: int) -> Vector:
        return (max(3.0 * i, 5.0 * i - 700), 2.0 * i + 1, 7.0)

    for lo, hi in ((0, 0), (0, 1), (3, 1000), (17, 2047)):
        assert linear_sum(f, lo, hi) == pytest.approx(exact_sum(f, lo, hi), rel=1e-12)


def test_linear_sum_evaluates_a_few_points_around_each_kink() -> None:
    seen: set[int] = set()

    def f(i: int) -> Vector:
        seen.add(i)
        return (max(2.0 * i, 4.0 * i - 3000, 9.0 * i - 15000),)

    linear_sum(f, 0, 100_000)
    assert len(seen) < 150  # two kinks, 17 levels of halving each


def _exact_decode(p: Predictor, b: object, count: int) -> Cost:
    """The reference: every decode iteration priced on its own."""
    from rdurack.workloads.serving.batch import ServeBatch

    assert isinstance(b, ServeBatch)
    return Cost(*exact_sum(lambda i: decode_cost(p, b, i, 1).vector(), 0, count - 1))


@pytest.mark.parametrize("name", PLATFORMS)
@pytest.mark.parametrize("speculative", [None, SPEC], ids=["plain", "speculative"])
@pytest.mark.parametrize(
    ("model", "batch", "prompt"), [("llama3.1-8b", 16, 128), ("llama2-70b", 1, 2048)]
)
def test_the_decode_sum_matches_the_step_by_step_sum_within_a_thousandth(
    name: str, speculative: SpeculativeSetting | None, model: str, batch: int, prompt: int
) -> None:
    p = Predictor(platform(name))
    b = resolve(
        ServeRequest(model, batch, prompt, 1024, speculative=speculative), p.platform, MODELS
    )
    got = decode_cost(p, b, 0, b.iterations)
    want = _exact_decode(p, b, b.iterations)
    for field, value in vars(want).items():
        assert getattr(got, field) == pytest.approx(value, rel=1e-3, abs=1e-12), field


def test_a_plain_decode_step_j_attends_to_the_prompt_and_j_tokens() -> None:
    p = Predictor(platform("sn40l-node"))
    m = MODELS["llama3.1-8b"]
    b = resolve(ServeRequest(m.name, 4, 300, 9), p.platform, MODELS)
    assert b.iterations == 8
    steps = [p.step(m, Phase.DECODE, b.plan, 4, 300 + j, 8).total_s for j in range(1, 9)]
    assert decode_cost(p, b, 0, 8).seconds == pytest.approx(sum(steps), rel=1e-12)


def test_2048_tokens_are_priced_from_a_few_iterations(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    real: Callable[..., Cost] = costs.iteration_cost

    def counted(p: Predictor, b: object, base: int) -> Cost:
        calls.append(base)
        return real(p, b, base)

    monkeypatch.setattr(costs, "iteration_cost", counted)
    for speculative in (None, SPEC):
        calls.clear()
        _serve("sn40l-rack16", "llama3.1-70b", output_tokens=2048, speculative=speculative)
        assert 0 < len(calls) < 100


# ------------------------------------------------------------------ the figures


@pytest.mark.parametrize("name", PLATFORMS)
def test_figures_are_consistent(name: str) -> None:
    r = _serve(name, batch_size=16, prompt_tokens=512, output_tokens=256)
    d = r.breakdown
    assert r.ttft_s == d.prefill_s > 0
    assert r.e2e_s == pytest.approx(d.prefill_s + d.decode_s)
    assert r.itl_s == pytest.approx(d.decode_s / 255)
    assert r.tokens_per_s_per_user == pytest.approx(1 / d.decode_s * 255)
    assert r.tokens_per_s == pytest.approx(16 * 256 / r.e2e_s)
    assert 0 < r.hbm_bandwidth_utilization < 1
    assert 0 < d.launch_s < r.e2e_s and 0 <= d.collective_s < r.e2e_s
    assert d.decode_iterations == 255 and d.kernel_calls > 255
    m = MODELS["llama3.1-8b"]
    assert d.kv_cache_bytes == 16 * (512 + 256) * m.kv_bytes_per_token()
    sockets = platform(name).sockets
    # The KV cache and the K and V projections split by KV head (8): a 16-socket group
    # holds two copies of each.
    shards = min(sockets, m.kv_heads)
    kv_proj = m.layers * 2 * m.hidden * m.kv_dim * m.bytes_per_param
    weights = (m.weight_bytes - kv_proj) / sockets + kv_proj / shards
    assert d.hbm_bytes_per_socket == math.ceil(weights) + -(-d.kv_cache_bytes // shards)
    assert r.num_sockets == sockets and r.speculative is None
    plans = (r.plan, r.prefill_plan)
    dataflow = platform(name).socket.kernels.dataflow_fusion
    assert plans == (("kernel-looped", "fused-ho") if dataflow else ("unfused", "unfused"))


def test_the_first_token_is_the_invocation_and_the_prefill_pass() -> None:
    p = Predictor(platform("dgx-h100"))
    r = _serve("dgx-h100", batch_size=2, prompt_tokens=700, output_tokens=1)
    prefill = p.step(MODELS["llama3.1-8b"], Phase.PREFILL, FusionPlan.UNFUSED, 2, 700, 8)
    assert p.invocation_s > 0  # the calibrated program and argument load
    assert r.ttft_s == pytest.approx(p.invocation_s + prefill.total_s)
    # One output token: no decode, so no inter-token latency.
    assert r.e2e_s == r.ttft_s
    assert r.itl_s is None and r.tokens_per_s_per_user is None


def test_the_kv_cache_grows_the_inter_token_latency() -> None:
    short = _serve("sn40l-node", batch_size=16, prompt_tokens=128, output_tokens=128)
    long = _serve("sn40l-node", batch_size=16, prompt_tokens=8192, output_tokens=128)
    assert _itl(long) > 1.2 * _itl(short)


def test_per_user_speed_is_predict_decode_at_the_same_context() -> None:
    for name in PLATFORMS:
        p = Predictor(platform(name))
        r = predict_serve(p, ServeRequest("llama3.1-8b", 8, 4095, 2), MODELS)
        d = predict_decode(p, MODELS["llama3.1-8b"], 8, context=4096)
        assert r.tokens_per_s_per_user == pytest.approx(d.tokens_per_s_per_user, rel=1e-12)


def test_prefill_and_decode_plans_follow_the_decode_plan() -> None:
    for plan, prefill in (
        (FusionPlan.FUSED_SO, "fused-so"),
        (FusionPlan.FUSED_HO, "fused-ho"),
        (FusionPlan.UNFUSED, "unfused"),
    ):
        r = _serve("sn40l-node", plan=plan)
        assert (r.plan, r.prefill_plan) == (plan.value, prefill)


# ------------------------------------------------------------------ speculative decoding


def test_expected_tokens_per_iteration() -> None:
    assert expected_tokens(4, 0.8) == pytest.approx(3.3616)
    assert expected_tokens(8, 0.8) == pytest.approx(4.3289, abs=1e-4)
    assert expected_tokens(4, 1.0) == 5.0
    assert expected_tokens(4, 0.0) == 1.0
    assert SPEC.tokens_per_iteration == expected_tokens(SPEC.draft_tokens, SPEC.acceptance)


def test_an_iteration_is_k_draft_steps_and_one_verification_pass() -> None:
    p = Predictor(platform("sn40l-rack16"))
    setting = SpeculativeSetting(draft_tokens=3)
    b = resolve(ServeRequest("llama3.1-70b", 2, 100, 50, speculative=setting), p.platform, MODELS)
    assert b.draft is not None and b.draft.name == "llama3.1-8b"
    plan, draft = FusionPlan.KERNEL_LOOPED, b.draft
    verify = p.timer(16).step(step(b.target, Phase.DECODE, 2, 1004, 16, new_tokens=4), plan)
    drafts = [p.step(draft, Phase.DECODE, plan, 2, 1000 + j, 16).total_s for j in (1, 2, 3)]
    assert iteration_cost(p, b, 1000).seconds == pytest.approx(verify.total_s + sum(drafts))
    # 49 tokens after the first, at the expected tokens of k = 3 and the calibrated a.
    assert b.iterations == math.ceil(49 / expected_tokens(3, SPEC.acceptance))


def test_speculation_speeds_up_a_large_target_and_costs_when_nothing_is_accepted() -> None:
    plain = _serve("sn40l-rack16", "llama3.1-70b", output_tokens=256)
    fast = _serve("sn40l-rack16", "llama3.1-70b", output_tokens=256, speculative=SPEC)
    futile = _serve(
        "sn40l-rack16", "llama3.1-70b", output_tokens=256,
        speculative=SpeculativeSetting(acceptance=0.0),
    )  # fmt: skip
    assert _itl(fast) < _itl(plain) / 2
    assert _itl(futile) > _itl(plain)
    assert fast.ttft_s > plain.ttft_s  # the draft prefills too
    figures = fast.speculative
    assert figures is not None
    # The defaults are the calibrated k and a (rack/calibration.py).
    assert (figures.draft_model, figures.draft_tokens, figures.acceptance) == (
        "llama3.1-8b", SPEC.draft_tokens, SPEC.acceptance,
    )  # fmt: skip
    assert figures.tokens_per_iteration == pytest.approx(SPEC.tokens_per_iteration)


def test_speculative_decode_spreads_an_iteration_over_its_tokens() -> None:
    p = Predictor(platform("sn40l-rack16"))
    request = ServeRequest("llama3.1-405b", 1, 1, 1, speculative=SPEC)
    r = predict_speculative_decode(p, request, 8192, MODELS)
    b = resolve(ServeRequest("llama3.1-405b", 1, 8191, 1, speculative=SPEC), p.platform, MODELS)
    assert r.iteration_s == pytest.approx(iteration_cost(p, b, 8191).seconds)
    assert r.step_s == pytest.approx(r.iteration_s / SPEC.tokens_per_iteration)
    assert r.tokens_per_s_per_user == pytest.approx(1 / r.step_s)
    plain = predict_decode(p, MODELS["llama3.1-405b"], 1, context=8192)
    assert r.tokens_per_s_per_user > plain.tokens_per_s_per_user


def test_draft_models_are_checked() -> None:
    p = Predictor(platform("sn40l-node"))
    with pytest.raises(InvalidRequest, match="no default draft model"):
        predict_serve(p, ServeRequest("falcon-40b", 1, 8, 8, speculative=SPEC), MODELS)
    wrong = SpeculativeSetting(draft_model="llama2-7b")
    with pytest.raises(InvalidRequest, match="one tokenizer"):
        predict_serve(p, ServeRequest("llama3.1-70b", 1, 8, 8, speculative=wrong), MODELS)
    with pytest.raises(UnknownName, match="draft model"):
        SpeculativeSetting(draft_model="gpt-2").draft_of(MODELS["llama2-7b"], MODELS)
    with pytest.raises(InvalidRequest, match=r"^acceptance: "):
        SpeculativeSetting.of(acceptance=1.5)
    with pytest.raises(InvalidRequest, match=r"^draft-tokens: "):
        SpeculativeSetting.of(draft_tokens=0)


# ------------------------------------------------------------------ refused


def test_a_batch_that_does_not_fit_hbm_is_refused_with_the_numbers() -> None:
    with pytest.raises(OutOfMemory) as e:
        _serve("dgx-a100", "llama3.1-405b")
    m = MODELS["llama3.1-405b"]
    assert e.value.socket == "dgx-a100 socket" and e.value.tier == "hbm"
    assert e.value.asked_bytes > m.weight_bytes // 8
    assert e.value.free_bytes == 80_000_000_000
    assert len(str(e.value).splitlines()) == 1
    # The KV cache counts: 70B fits 8 H100s at batch 1 but not at batch 128 x 16K tokens.
    _serve("dgx-h100", "llama3.1-70b")
    with pytest.raises(OutOfMemory, match="128 x 16384 tokens"):
        _serve("dgx-h100", "llama3.1-70b", batch_size=128, prompt_tokens=8192, output_tokens=8192)


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"sockets": 3}, "must divide heads"),
        ({"sockets": 9}, "has 8 sockets"),
        ({"sockets": 0}, "sockets must be positive"),
        ({"batch_size": 0}, "batch-size must be positive"),
        ({"prompt_tokens": -1}, "prompt-tokens must be positive"),
        ({"output_tokens": 0}, "output-tokens must be positive"),
        ({"plan": FusionPlan.FUSED_HO}, "runs unfused kernels only"),
    ],
)
def test_bad_requests_are_one_line(kw: dict[str, Any], match: str) -> None:
    with pytest.raises(InvalidRequest, match=match) as e:
        _serve("dgx-a100", **kw)
    assert len(str(e.value).splitlines()) == 1


# ------------------------------------------------------------------ a job's steps


def test_segments_cover_every_step_once_and_sum_to_the_whole() -> None:
    p = Predictor(platform("sn40l-node"))
    b = resolve(ServeRequest("llama3.1-8b", 16, 512, 512, speculative=SPEC), p.platform, MODELS)
    parts = segments(b, 10)
    assert parts[0] == (0, 1) and len(parts) == 11
    assert [f for f, _ in parts] == [0] + [1 + sum(c for _, c in parts[1:i]) for i in range(1, 11)]
    assert sum(c for _, c in parts) == b.steps
    assert split_steps(b, 0, 1) == (True, 0, 0)
    assert split_steps(b, 0, 3) == (True, 0, 2)
    assert split_steps(b, 5, 2) == (False, 4, 2)
    decode = Cost()
    for first, count in parts[1:]:
        _, it, n = split_steps(b, first, count)
        decode += decode_cost(p, b, it, n)
    whole = decode_cost(p, b, 0, b.iterations)
    assert decode.seconds == pytest.approx(whole.seconds, rel=1e-9)
    assert prefill_cost(p, b).seconds == pytest.approx(predict_serve(p, b.request, MODELS).ttft_s)
    with pytest.raises(InvalidRequest, match="not steps of this batch"):
        split_steps(b, b.steps - 1, 2)
    assert segments(resolve(ServeRequest("mistral-7b", 1, 8, 1), p.platform, MODELS), 10) == [
        (0, 1)
    ]
