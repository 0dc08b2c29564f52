"""One trace per completion request (endpoint/tracing.py): the root FastAPI makes, its
queue, prefill and decode spans on the request's emulated timeline, and an event per
iteration the request took part in; requests batched together share their iterations.
Spans go to an in-memory exporter of the test's own provider (never the global one)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import httpx
import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode, Tracer

from rdurack.endpoint import tracing
from rdurack.endpoint.app import create_app
from rdurack.endpoint.engine import Engine, Handle, Token, Unavailable
from rdurack.endpoint.server import engines
from rdurack.rack.models import builtin_models
from rdurack.rack.presets import platform
from rdurack.telemetry import names
from rdurack.workloads.predictor import Predictor
from rdurack.workloads.serving.stream.bundle import BUNDLE_NAME, BundleSetting
from rdurack.workloads.serving.stream.pricing import Pass
from rdurack.workloads.serving.stream.replay import StreamSetting, prepare
from rdurack.workloads.serving.stream.scheduler import Policy
from tests.support.endpoint import in_thread
from tests.support.fake_rack import until
from tests.support.ports import free_port

MODEL = "llama3.1-8b"
RACK = platform("sn40l-rack16")
Spans = tuple[TracerProvider, InMemorySpanExporter]


def _engine(policy: Policy = Policy.CONTINUOUS, chunk_tokens: int = 512) -> Engine:
    setting = StreamSetting(MODEL, 1, policy, max_batch=4, chunk_tokens=chunk_tokens)
    return engines(Predictor(RACK), [MODEL], setting, builtin_models(), 0.0)[MODEL]


def _named(exporter: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.name == name]


def _children(exporter: InMemorySpanExporter, root: ReadableSpan) -> dict[str, list[ReadableSpan]]:
    """The root's children by name, each list in start order."""
    out: dict[str, list[ReadableSpan]] = {}
    for s in sorted(exporter.get_finished_spans(), key=lambda s: s.start_time or 0):
        if s.parent is not None and s.parent.span_id == root.context.span_id:
            out.setdefault(s.name, []).append(s)
    return out


def _iterations(spans: Sequence[ReadableSpan]) -> list[dict[str, object]]:
    """The iteration events of `spans`, in order, as dicts."""
    return [dict(e.attributes or {}) for s in spans for e in s.events]


def _wall_ns(s: ReadableSpan) -> int:
    assert s.start_time is not None and s.end_time is not None
    return s.end_time - s.start_time


async def _served(
    engine: Engine, tracer: Tracer, lengths: list[tuple[int, int]], timeout_s: float = 120
) -> list[list[Token]]:
    """`lengths` submitted at once, each inside a request span of its own (as FastAPI's
    is current while a route submits), served to the end (a stuck engine fails after
    `timeout_s`); the spans ended after."""
    roots, handles = [], []
    for p, o in lengths:
        with tracer.start_as_current_span("request", end_on_exit=False) as root:
            handles.append(engine.submit(p, o))
        roots.append(root)

    async def tokens(h: Handle) -> list[Token]:
        out = []
        while (t := await h.tokens.get()) is not None:
            out.append(t)
        return out

    engine.start()
    try:
        async with asyncio.timeout(timeout_s):
            return await asyncio.gather(*(tokens(h) for h in handles))
    finally:
        await engine.stop()
        for root in roots:
            root.end()


def test_a_request_is_one_trace_of_its_queue_prefill_and_decode(spans: Spans) -> None:
    provider, exporter = spans
    served = engines(Predictor(RACK), [MODEL], StreamSetting(MODEL, 1), builtin_models(), 0.0)
    body = {"model": MODEL, "prompt": "how long is a decode step?", "max_tokens": 7}
    with (
        in_thread(create_app(served, tracer_provider=provider), free_port()) as url,
        httpx.Client(base_url=url, timeout=30) as client,
    ):
        assert client.get("/v1/models").status_code == 200  # not a completion: no trace
        assert client.get("/health").status_code == 200
        reply = client.post("/v1/completions", json=body)
        assert reply.status_code == 200, reply.text
        # The root ends once the response's last byte is sent, just after the client
        # has it.
        until(lambda: _named(exporter, names.SPAN_HTTP_COMPLETIONS), "the request's root")
    usage = reply.json()["usage"]
    (root,) = _named(exporter, names.SPAN_HTTP_COMPLETIONS)
    assert root.kind is SpanKind.SERVER and root.parent is None
    assert {s.context.trace_id for s in exporter.get_finished_spans()} == {root.context.trace_id}
    a = root.attributes or {}
    assert a[names.HTTP_ROUTE] == "/v1/completions"
    assert a[names.HTTP_RESPONSE_STATUS_CODE] == 200
    assert a[names.GEN_AI_REQUEST_MODEL] == MODEL
    assert a[names.GEN_AI_USAGE_INPUT_TOKENS] == usage["prompt_tokens"]
    assert a[names.GEN_AI_USAGE_OUTPUT_TOKENS] == usage["completion_tokens"] == 7
    assert a[names.GEN_AI_LATENCY_TTFT] == pytest.approx(usage["time_to_first_token"])
    assert a[names.GEN_AI_LATENCY_E2E] == pytest.approx(usage["total_latency"])

    children = _children(exporter, root)
    assert sorted(children) == sorted(
        [names.SPAN_REQUEST_QUEUE, names.SPAN_REQUEST_PREFILL, names.SPAN_REQUEST_DECODE]
    )
    (queue,), (prefill,), (decode,) = (
        children[names.SPAN_REQUEST_QUEUE],
        children[names.SPAN_REQUEST_PREFILL],
        children[names.SPAN_REQUEST_DECODE],
    )
    for s in (queue, prefill, decode):  # on the emulated timeline: wall = emulated
        attributes = s.attributes or {}
        assert attributes[names.ATTR_JOB_MODEL] == MODEL
        assert abs(_wall_ns(s) - int(str(attributes[names.ATTR_EMULATED_NS]))) <= 1
    # Back to back on the request's timeline, from its arrival.
    assert queue.end_time == prefill.start_time and prefill.end_time == decode.start_time
    assert queue.start_time == root.start_time
    ttft_ns = round(usage["time_to_first_token"] * 1e9)
    assert abs(_wall_ns(queue) + _wall_ns(prefill) - ttft_ns) <= 2

    (first,) = _iterations([prefill])
    assert first[names.ATTR_TOKEN] == 0 and first[names.ATTR_BATCH] == 1
    assert first[names.ATTR_PREFILL_TOKENS] == usage["prompt_tokens"]
    steps = _iterations([decode])
    assert len(steps) == usage["completion_tokens"] - 1  # one decode iteration per token
    assert [e[names.ATTR_TOKEN] for e in steps] == list(range(1, 7))
    assert [e[names.ATTR_ITERATION] for e in [first, *steps]] == list(range(7))
    assert all(e[names.ATTR_BATCH] == 1 for e in steps)
    ends = [int(str(e[names.ATTR_EMULATED_START_NS])) + int(str(e[names.ATTR_EMULATED_NS]))
            for e in steps]  # fmt: skip
    assert abs(ends[-1] - round(usage["total_latency"] * 1e9)) <= 2  # arrival at 0
    assert (decode.events[-1].timestamp or 0) == decode.end_time  # the last token's time


def test_requests_batched_together_share_their_iterations(spans: Spans) -> None:
    provider, exporter = spans
    tracer = provider.get_tracer("test")
    engine = _engine()
    tracing.watch([engine], tracer)
    got = asyncio.run(_served(engine, tracer, [(100, 5), (300, 8)]))
    assert [len(t) for t in got] == [5, 8]
    roots = _named(exporter, "request")
    assert len(roots) == 2 and len({r.context.trace_id for r in roots}) == 2  # a trace each
    short, long = (_children(exporter, r) for r in roots)
    a = _iterations(short[names.SPAN_REQUEST_PREFILL] + short[names.SPAN_REQUEST_DECODE])
    b = _iterations(long[names.SPAN_REQUEST_PREFILL] + long[names.SPAN_REQUEST_DECODE])
    # Both arrived together: one prefill of the two, then decode steps of the two until
    # the short one is done; the long one decodes on alone.
    shared = [e[names.ATTR_ITERATION] for e in a]
    assert shared == [e[names.ATTR_ITERATION] for e in b[:5]] == list(range(5))
    assert all(e[names.ATTR_BATCH] == 2 for e in a + b[:5])
    assert all(e[names.ATTR_BATCH] == 1 for e in b[5:])
    assert [e[names.ATTR_ITERATION] for e in b[5:]] == [5, 6, 7]
    assert [e.get(names.ATTR_TOKEN) for e in b] == list(range(8))
    # A shared iteration is the same on both: the same emulated start and duration.
    for x, y in zip(a, b, strict=False):
        assert x[names.ATTR_EMULATED_START_NS] == y[names.ATTR_EMULATED_START_NS]
        assert x[names.ATTR_EMULATED_NS] == y[names.ATTR_EMULATED_NS]


def test_chunked_prefill_is_an_event_a_chunk_and_long_decodes_split(spans: Spans) -> None:
    provider, exporter = spans
    tracer = provider.get_tracer("test")
    engine = _engine(Policy.CHUNKED, chunk_tokens=256)
    tracing.watch([engine], tracer)
    out = tracing.MAX_ITERATIONS * 2 + 10
    asyncio.run(_served(engine, tracer, [(1000, out)]))
    (root,) = _named(exporter, "request")
    children = _children(exporter, root)
    (prefill,) = children[names.SPAN_REQUEST_PREFILL]
    chunks = _iterations([prefill])
    assert [e[names.ATTR_PREFILL_TOKENS] for e in chunks] == [256, 256, 256, 232]
    assert [e.get(names.ATTR_TOKEN) for e in chunks] == [None, None, None, 0]
    decode = children[names.SPAN_REQUEST_DECODE]
    assert [len(s.events) for s in decode] == [tracing.MAX_ITERATIONS] * 2 + [9]
    assert [(s.attributes or {})[names.ATTR_STEPS] for s in decode] == [128, 128, 9]
    for before, after in zip([prefill, *decode], decode, strict=False):
        assert before.end_time == after.start_time  # back to back
    assert [e[names.ATTR_TOKEN] for e in _iterations(decode)] == list(range(1, out))


def test_a_request_the_rack_failed_ends_its_trace_in_error(spans: Spans) -> None:
    provider, exporter = spans
    tracer = provider.get_tracer("test")
    setting = StreamSetting(MODEL, 1, Policy.CONTINUOUS, max_batch=4)
    pricer, scheduler = prepare(Predictor(RACK), setting, builtin_models())
    calls = 0

    async def fails_third(passes: Sequence[Pass], start_s: float) -> list[float]:
        nonlocal calls
        calls += 1
        if calls == 3:
            raise Unavailable("the rack did not run its pass")
        return [pricer.seconds(p) for p in passes]

    engine = Engine(MODEL, scheduler, pricer, fails_third, 0.0)
    tracing.watch([engine], tracer)
    got = asyncio.run(_served(engine, tracer, [(100, 10)]))
    assert len(got[0]) == 2  # the prefill's token and one decode step's
    (root,) = _named(exporter, "request")
    assert root.status.status_code is StatusCode.ERROR
    assert "did not run" in (root.status.description or "")
    (decode,) = _children(exporter, root)[names.SPAN_REQUEST_DECODE]
    assert len(decode.events) == 1
    assert (root.attributes or {})[names.GEN_AI_USAGE_OUTPUT_TOKENS] == 2


def test_a_request_without_a_span_is_not_traced(spans: Spans) -> None:
    provider, exporter = spans
    engine = _engine()
    tracing.watch([engine], provider.get_tracer("test"))

    async def run() -> int:
        h = engine.submit(50, 3)  # no current span: nothing to hang a trace from
        engine.start()
        n = 0
        while await h.tokens.get() is not None:
            n += 1
        await engine.stop()
        return n

    assert asyncio.run(run()) == 3
    assert exporter.get_finished_spans() == ()


def test_a_bundles_request_names_its_expert(spans: Spans) -> None:
    provider, exporter = spans
    bundle = StreamSetting(BUNDLE_NAME, 8, bundle=BundleSetting(150))
    served = engines(Predictor(RACK), [], StreamSetting(MODEL, 1), builtin_models(), 0.0,
                     bundle=bundle)  # fmt: skip
    body = {"model": "math-algebra", "prompt": "what is a group?", "max_tokens": 2}
    with (
        in_thread(create_app(served, tracer_provider=provider), free_port()) as url,
        httpx.Client(base_url=url, timeout=30) as client,
    ):
        assert client.post("/v1/completions", json=body).status_code == 200
        until(lambda: _named(exporter, names.SPAN_HTTP_COMPLETIONS), "the request's root")
    (root,) = _named(exporter, names.SPAN_HTTP_COMPLETIONS)
    a = root.attributes or {}
    assert a[names.ATTR_EXPERT] == "math-algebra" and a[names.GEN_AI_REQUEST_MODEL] == BUNDLE_NAME
