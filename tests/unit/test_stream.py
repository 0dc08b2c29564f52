"""A stream of requests in the predictor: arrivals, the batching policies, iteration
prices and the report (workloads/serving/stream/)."""

from __future__ import annotations

from dataclasses import replace
from itertools import pairwise
from pathlib import Path

import pytest

from rdurack.errors import InvalidRequest
from rdurack.rack.kernels import FusionPlan, Phase
from rdurack.rack.models import builtin_models
from rdurack.rack.presets import platform
from rdurack.workloads.predictor import Predictor
from rdurack.workloads.serving.batch import ServeRequest
from rdurack.workloads.serving.predict import predict_serve
from rdurack.workloads.serving.stream.arrivals import Arrival, poisson, read_trace
from rdurack.workloads.serving.stream.pricing import Pricer, kv_budget_tokens
from rdurack.workloads.serving.stream.replay import StreamSetting, replay
from rdurack.workloads.serving.stream.report import Percentiles
from rdurack.workloads.serving.stream.scheduler import (
    Iteration,
    Policy,
    Refused,
    Running,
    Scheduler,
)

RACK = platform("sn40l-rack16")
MODELS = builtin_models()


# ------------------------------------------------------------------ arrivals


def test_a_poisson_stream_is_seeded_and_has_its_rate() -> None:
    a = poisson(4.0, 4000, 128, 64, seed=7)
    assert a == poisson(4.0, 4000, 128, 64, seed=7)
    assert a != poisson(4.0, 4000, 128, 64, seed=8)
    assert all(x.at_s < y.at_s for x, y in pairwise(a))
    # 4000 exponential gaps: the mean is within 5% of 1 / rate (its sd is 1.6%).
    assert a[-1].at_s / len(a) == pytest.approx(0.25, rel=0.05)
    assert {(x.prompt_tokens, x.output_tokens) for x in a} == {(128, 64)}


def test_a_vidur_csv_and_an_llmservingsim_jsonl_read_as_the_same_stream(tmp_path: Path) -> None:
    csv = tmp_path / "vidur.csv"
    csv.write_text(
        "arrived_at,num_prefill_tokens,num_decode_tokens,num_total_tokens\n"
        "0.5,100,20,120\n0.25,300,7,307\n"
    )
    jsonl = tmp_path / "sim.jsonl"
    jsonl.write_text(
        '{"input_toks": 100, "output_toks": 20, "arrival_time_ns": 500000000, '
        '"input_tok_ids": [1, 2]}\n\n'
        '{"input_toks": 300, "output_toks": 7, "arrival_time_ns": 250000000}\n'
    )
    for path in (csv, jsonl):
        assert read_trace(path) == [Arrival(1, 0.25, 300, 7), Arrival(0, 0.5, 100, 20)]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("arrived_at,num_prefill_tokens\n0,1\n", "lacks num_decode_tokens"),
        ("arrived_at,num_prefill_tokens,num_decode_tokens\n0,1.5,2\n", "line 2: num_prefill"),
        ("arrived_at,num_prefill_tokens,num_decode_tokens\nx,1,2\n", "arrived_at must be a n"),
        ("arrived_at,num_prefill_tokens,num_decode_tokens\n-1,1,2\n", "arrival must be"),
        ("arrived_at,num_prefill_tokens,num_decode_tokens\n1,0,2\n", "must be positive"),
        ("arrived_at,num_prefill_tokens,num_decode_tokens\n", "no requests"),
        ('{"input_toks": 1, "output_toks": 2}\n', "line 1: needs the fields"),
        ('{"input_toks": 1, "output_toks": 2, "arrival_time_ns": 0}\n{oops\n', "line 2: not JSON"),
        ("time,prompt\n1,2\n", "not a Vidur CSV"),
    ],
)
def test_a_bad_trace_is_refused_with_its_line(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "trace"
    path.write_text(text)
    with pytest.raises(InvalidRequest, match=message):
        read_trace(path)


def test_a_missing_trace_is_refused() -> None:
    with pytest.raises(InvalidRequest, match="cannot read it"):
        read_trace(Path("/nonexistent/trace.csv"))


# ------------------------------------------------------------------ the scheduler


def _arrivals(n: int, prompt: int = 100, output: int = 3, gap: float = 0.0) -> list[Arrival]:
    return [Arrival(i, i * gap, prompt, output) for i in range(n)]


def _drive(s: Scheduler, now: float = 0.0) -> list[Iteration]:
    """Run the scheduler to the end, each iteration one second."""
    out = []
    while (it := s.next(now)) is not None:
        out.append(it)
        now += 1.0
        s.finish(it, now)
    return out


def test_continuous_batching_admits_at_every_iteration_and_frees_at_once() -> None:
    s = Scheduler(Policy.CONTINUOUS, max_batch=2, kv_budget_tokens=10_000)
    a, c = _arrivals(2)
    b = Arrival(2, 0.0, 100, 5)  # outlives a
    s.arrive(a)
    first = s.next(0.0)
    assert first is not None and [(r.arrival, n) for r, n in first.prefill] == [(a, 100)]
    s.finish(first, 1.0)
    s.arrive(b)
    s.arrive(c)
    joined = s.next(1.0)  # b joins; c waits for a slot
    assert joined is not None and [r.arrival for r, _ in joined.prefill] == [b]
    assert list(s.waiting) == [c]
    s.finish(joined, 2.0)
    step = s.next(2.0)
    assert step is not None and [r.arrival for r in step.decode] == [a, b]
    s.finish(step, 3.0)
    s.finish(s.next(3.0) or Iteration(), 4.0)  # a's third token: a leaves
    assert [r.arrival for r in s.running] == [b]
    admitted = s.next(4.0)
    assert admitted is not None and [r.arrival for r, _ in admitted.prefill] == [c]


def test_a_static_batch_keeps_its_done_requests_as_padding_until_it_ends() -> None:
    s = Scheduler(Policy.STATIC, max_batch=4, kv_budget_tokens=10_000)
    short, long = Arrival(0, 0, 10, 1), Arrival(1, 0, 10, 3)
    s.arrive(short)
    s.arrive(long)
    its = _drive(s)
    assert [(len(i.prefill), len(i.decode), len(i.padding)) for i in its] == [
        (2, 0, 0),
        (0, 1, 1),
        (0, 1, 1),
    ]


def test_chunked_prefill_fills_a_token_budget_decodes_first() -> None:
    s = Scheduler(Policy.CHUNKED, max_batch=8, kv_budget_tokens=10_000, chunk_tokens=64)
    s.arrive(Arrival(0, 0, 100, 3))
    s.arrive(Arrival(1, 0, 30, 3))
    one = s.next(0.0)
    assert one is not None
    assert [(r.arrival.index, n) for r, n in one.prefill] == [(0, 64)]  # the budget, whole
    s.finish(one, 1.0)
    assert [r.generated for r in s.running] == [0]  # no token before the last chunk
    two = s.next(1.0)
    assert two is not None  # the rest of 0, then 28 of 1's 30
    assert [(r.arrival.index, n) for r, n in two.prefill] == [(0, 36), (1, 28)]
    s.finish(two, 2.0)
    three = s.next(2.0)
    assert three is not None
    assert [r.arrival.index for r in three.decode] == [0]  # its first token came at 2.0
    assert [(r.arrival.index, n) for r, n in three.prefill] == [(1, 2)]
    s.finish(three, 3.0)
    assert [r.token_s for r in s.running] == [[2.0, 3.0], [3.0]]


def test_admission_waits_for_the_kv_cache_and_refuses_what_never_fits() -> None:
    s = Scheduler(Policy.CONTINUOUS, max_batch=8, kv_budget_tokens=250)
    for a in _arrivals(3):  # 103 tokens each: two fit at once
        s.arrive(a)
    first = s.next(0.0)
    assert first is not None and len(first.prefill) == 2 and len(s.waiting) == 1
    assert s.reserved_tokens == 206
    said = r"100 prompt \+ 200 output = 300 tokens\) exceeds .*\(250 tokens\)"
    with pytest.raises(Refused, match=said):
        s.arrive(Arrival(9, 0, 100, 200))


# ------------------------------------------------------------------ prices and replay


@pytest.mark.parametrize(
    ("model", "sockets", "batch"),
    [("llama3.1-70b", 8, 8), ("llama3.1-8b", 1, 4), ("deepseek-r1", 16, 4)],
)
def test_a_static_batch_arriving_at_once_is_what_predict_serve_says(
    model: str, sockets: int, batch: int
) -> None:
    p = Predictor(RACK)
    arrivals = _arrivals(batch, prompt=512, output=64)
    r = replay(p, StreamSetting(model, sockets, Policy.STATIC, batch), arrivals, MODELS)
    one = predict_serve(p, ServeRequest(model, batch, 512, 64, sockets), MODELS)
    assert r.ttft_s.p99 == pytest.approx(one.ttft_s, rel=1e-12)
    assert r.e2e_s.p50 == pytest.approx(one.e2e_s, rel=1e-12)
    assert r.itl_s.mean == pytest.approx(one.itl_s, rel=1e-9)
    assert r.iterations == 64 and r.mean_batch == batch


def test_a_decode_of_two_contexts_costs_the_mean_of_the_two_uniform_batches() -> None:
    """A step is linear in its contexts away from a kink: attention adds up per
    sequence, the weights are read once."""
    p = Predictor(RACK)
    model = MODELS["llama3.1-70b"]
    pricer = Pricer(p, model, 8, FusionPlan.KERNEL_LOOPED)
    rows = [Running(Arrival(i, 0, 1000 + i, 50), 0.0, 1000 + i, 1) for i in range(2)]
    mixed = pricer(Iteration(decode=tuple(rows))).seconds  # contexts 1001 and 1002

    def at(context: int) -> float:
        step = p.step(model, Phase.DECODE, FusionPlan.KERNEL_LOOPED, 2, context, 8, 0.0)
        return step.total_s

    assert mixed == pytest.approx((at(1001) + at(1002)) / 2, rel=1e-9)
    assert at(1001) < mixed < at(1002)


def test_an_iteration_pays_the_invocation_when_it_starts_a_request() -> None:
    p = Predictor(RACK)
    pricer = Pricer(p, MODELS["llama3.1-8b"], 1, FusionPlan.KERNEL_LOOPED)
    fresh, under_way = Running(Arrival(0, 0, 200, 5), 0.0), Running(Arrival(1, 0, 200, 5), 0.0)
    under_way.prefilled = 100
    start = pricer(Iteration(prefill=((fresh, 100),)))
    go_on = pricer(Iteration(prefill=((under_way, 100),)))
    assert start.launch_s - go_on.launch_s == pytest.approx(p.invocation_s)
    # The second chunk attends to the first: it costs more than the invocation apart.
    assert go_on.seconds > start.seconds - p.invocation_s


def test_the_kv_budget_is_what_leaves_the_experts_in_hbm() -> None:
    p = Predictor(RACK)
    ds = MODELS["deepseek-r1"]
    budget = kv_budget_tokens(p, ds, 16)
    assert p.cold_experts(ds, 16, budget) == 0 < p.cold_experts(ds, 16, budget + 4096)


def test_continuous_batching_beats_static_at_the_p99_ttft_of_a_poisson_stream() -> None:
    p = Predictor(RACK)
    stream = poisson(6.0, 200, 512, 128, seed=3)
    runs = {
        policy: replay(p, StreamSetting("llama3.1-70b", 8, policy, 32), stream, MODELS)
        for policy in Policy
    }
    static, continuous = runs[Policy.STATIC], runs[Policy.CONTINUOUS]
    assert continuous.ttft_s.p99 < static.ttft_s.p99
    assert static.requests == continuous.requests == 200
    # The same tokens: each request its 128.
    assert static.output_tokens_per_s * static.span_s == pytest.approx(200 * 128)


def test_chunked_prefill_bounds_the_inter_token_tail_that_whole_prefills_make() -> None:
    p = Predictor(RACK)
    stream = poisson(6.0, 150, 1024, 128, seed=2)
    setting = StreamSetting("llama3.1-70b", 8, Policy.CONTINUOUS, 32)
    whole = replay(p, setting, stream, MODELS)
    chunked = replay(p, replace(setting, policy=Policy.CHUNKED), stream, MODELS)
    assert chunked.itl_s.p99 < whole.itl_s.p99
    assert chunked.itl_s.max < whole.itl_s.max
    assert (chunked.chunk_tokens, whole.chunk_tokens) == (512, None)


def test_goodput_counts_the_requests_that_met_their_slos() -> None:
    p = Predictor(RACK)
    stream = poisson(6.0, 100, 512, 64, seed=1)
    setting = StreamSetting("llama3.1-70b", 8, Policy.CONTINUOUS, 32)
    free = replay(p, setting, stream, MODELS)
    assert free.goodput_requests_per_s is None and free.slo_attainment is None
    slo = free.ttft_s.p50
    r = replay(p, replace(setting, slo_ttft_s=slo), stream, MODELS)
    met = r.slo_attainment
    assert met is not None and met == pytest.approx(0.5, abs=0.02)  # half beat the median
    assert r.goodput_requests_per_s == pytest.approx(met * r.requests_per_s)


def test_a_stream_whose_requests_never_fit_is_refused_whole() -> None:
    p = Predictor(RACK)
    huge = [Arrival(0, 0, 10**7, 10)]
    with pytest.raises(InvalidRequest, match="no request could be served: request 0"):
        replay(p, StreamSetting("llama3.1-8b", 1), huge, MODELS)
    mixed = replay(p, StreamSetting("llama3.1-8b", 1), [*huge, Arrival(1, 1, 10, 2)], MODELS)
    assert (mixed.requests, mixed.refused) == (1, 1)
    assert "exceeds" in mixed.refusals[0]


def test_percentiles_are_numpys() -> None:
    q = Percentiles.of([float(x) for x in range(1, 101)])
    assert (q.p50, q.max, q.mean) == (50.5, 100.0, 50.5)
    assert q.p90 == pytest.approx(90.1)
    assert Percentiles.of([]) == Percentiles()
