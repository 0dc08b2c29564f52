"""A CoE bundle served as a stream (workloads/serving/stream/bundle.py): one expert a
batch, the expert region's switches, the router's prefill, and `rdu predict serve
--experts`."""

from __future__ import annotations

from dataclasses import replace

import pytest

from rdurack.errors import InvalidRequest, OutOfMemory
from rdurack.rack.models import builtin_models
from rdurack.rack.presets import platform
from rdurack.workloads.predictor import Predictor, switch_time_s
from rdurack.workloads.serving.stream.arrivals import Arrival, poisson
from rdurack.workloads.serving.stream.bundle import (
    BUNDLE_NAME,
    Bundle,
    BundleSetting,
    assign_experts,
)
from rdurack.workloads.serving.stream.pricing import Pricer
from rdurack.workloads.serving.stream.replay import StreamSetting, prepare, replay
from rdurack.workloads.serving.stream.scheduler import Policy, Refused, Scheduler
from tests.support.cli import rdu, rdu_json

RACK = Predictor(platform("sn40l-rack16"))
MODELS = builtin_models()
SETTING = StreamSetting(BUNDLE_NAME, 8, Policy.CONTINUOUS, 64, bundle=BundleSetting(150))


def _bundle() -> tuple[Pricer, Scheduler]:
    return prepare(RACK, SETTING, MODELS)


def _a(index: int, expert: str, at_s: float = 0.0, routed: bool = False) -> Arrival:
    return Arrival(index, at_s, 100, 4, expert, routed)


def test_the_bundle_holds_what_a_coe_job_deploys() -> None:
    b = Bundle(RACK, BundleSetting(150), MODELS, 8, 64)
    expert = MODELS["llama2-7b"]
    assert b.switch_s == switch_time_s(RACK.platform, expert.weight_bytes, 8)
    # The KV cache reserved is a full batch at the context window; the region the rest.
    assert b.kv_budget_tokens >= 64 * 4096
    assert b.kv_budget_tokens < 64 * 4096 + 8 * 64e9 / expert.kv_bytes_per_token()
    assert 1 <= b.region_experts < 150


def test_a_batch_is_one_experts_and_a_new_expert_is_switched_in() -> None:
    _, s = _bundle()
    for a in [_a(0, "coding-python"), _a(1, "math-algebra"), _a(2, "coding-python")]:
        s.arrive(a)
    first = s.next(0.0)
    assert first is not None
    # Both coding-python requests start together (gathered past the other expert's).
    assert [r.arrival.index for r, _ in first.prefill] == [0, 2]
    assert (first.expert, first.switch) == ("coding-python", True)
    s.finish(first, 1.0)
    while (it := s.next(1.0)) is not None and it.expert == "coding-python":
        assert not it.switch  # resident now
        s.finish(it, 1.0)
    assert it is not None and [r.arrival.index for r, _ in it.prefill] == [1]
    assert (it.expert, it.switch) == ("math-algebra", True)
    assert s.switches == 2


def test_a_request_of_another_expert_waiting_stops_the_batch_from_growing() -> None:
    _, s = _bundle()
    s.arrive(_a(0, "coding-python"))
    it = s.next(0.0)
    assert it is not None
    s.finish(it, 0.1)
    s.arrive(_a(1, "math-algebra", 0.05))
    s.arrive(_a(2, "coding-python", 0.06))  # behind another expert's: waits its turn
    decode = s.next(0.1)
    assert decode is not None and not decode.prefill and decode.expert == "coding-python"


def test_the_region_evicts_the_least_recently_used_expert() -> None:
    _, s = _bundle()
    assert s.region is not None and s.region.resident() == []
    bundle = Bundle(RACK, BundleSetting(150), MODELS, 8, 64)
    held = bundle.region_experts
    names = bundle.names[: held + 1]
    for i, name in enumerate([*names, names[0]]):  # the first is back after `held` others
        s.arrive(_a(i, name))
        it = s.next(float(i))
        assert it is not None and it.switch, name
        while it is not None:
            s.finish(it, float(i))
            it = s.next(float(i))
    assert s.switches == held + 2


def test_a_routed_start_pays_the_router_and_a_switch_its_copy() -> None:
    pricer, s = _bundle()
    s.arrive(_a(0, "coding-python", routed=True))
    it = s.next(0.0)
    assert it is not None
    routed = pricer.pass_of(it)
    plain = replace(routed, routed=())
    resident = replace(plain, switch=False)
    router = pricer.predictor.mixed(
        MODELS["llama2-7b"], pricer.prefill_plan, routed.routed, 1, 8, 0.0
    )
    assert pricer.seconds(routed) - pricer.seconds(plain) == pytest.approx(router.total_s)
    assert pricer.seconds(plain) - pricer.seconds(resident) == pytest.approx(
        switch_time_s(RACK.platform, MODELS["llama2-7b"].weight_bytes, 8)
    )


def test_one_popular_expert_switches_once_and_many_switch_often() -> None:
    arrivals = poisson(4.0, 100, 256, 16, seed=3)
    one = replay(RACK, SETTING, [replace(a, expert="coding-python") for a in arrivals], MODELS)
    assert one.switches == 1 and one.model == BUNDLE_NAME
    names = Bundle(RACK, BundleSetting(150), MODELS, 8, 64).names
    many = replay(RACK, SETTING, assign_experts(arrivals, names, 0.0, 3), MODELS)
    assert many.switches is not None and many.switches > 50
    assert many.ttft_s.p50 > one.ttft_s.p50


def test_a_request_over_the_experts_context_window_is_refused() -> None:
    _, s = _bundle()
    s.arrive(Arrival(0, 0.0, 4000, 96, "coding-python"))  # 4,096: the window, whole
    with pytest.raises(Refused, match="4097 tokens exceed the model's context window of 4096"):
        s.arrive(Arrival(1, 0.0, 4000, 97, "coding-python"))


def test_a_bundle_that_does_not_fit_is_refused_with_the_numbers() -> None:
    with pytest.raises(OutOfMemory, match="experts in DDR"):
        prepare(RACK, replace(SETTING, bundle=BundleSetting(5000)), MODELS)
    with pytest.raises(InvalidRequest, match="group size 16"):
        prepare(RACK, replace(SETTING, sockets=16), MODELS)


def test_experts_are_drawn_with_their_skew_from_the_seed() -> None:
    arrivals = poisson(4.0, 2000, 10, 2, seed=0)
    names = ["a", "b", "c"]
    skewed = assign_experts(arrivals, names, 2.0, 1)
    assert skewed == assign_experts(arrivals, names, 2.0, 1)
    assert all(a.routed for a in skewed)
    share = sum(a.expert == "a" for a in skewed) / len(skewed)
    assert share == pytest.approx(1 / (1 + 1 / 4 + 1 / 9), abs=0.03)


def test_rdu_predict_serve_with_experts() -> None:
    args = ["predict", "serve", "--platform", "sn40l-rack16", "--model", "llama2-7b"]
    stream = ["--arrivals", "poisson", "--rate", "2", "--requests", "40"]
    report = rdu_json(*args, *stream, "--experts", "150")
    assert report["model"] == BUNDLE_NAME and report["requests"] == 40
    assert report["switches"] > 0
    for bad, why in [(["--skew", "1"], "--skew is --experts'"), (["--experts", "150"], "need")]:
        r = rdu(*args, *(stream if why != "need" else []), *bad)
        assert r.returncode != 0 and why in r.stderr and "Traceback" not in r.stderr
