"""One trace per HTTP completion request (docs/tracing.md, "The tree of one request").

The trace's root is FastAPI's own SERVER span of the request (its native OpenTelemetry
support, set up by `telemetry`): named as the HTTP semantic conventions name it ("POST
/v1/chat/completions"), continuing a client's W3C `traceparent`, current while the app
serves the request (so the engine finds it), ended with the response's last byte.

`RequestTracing` hangs from an engine's hooks (endpoint/engine.py) and gives each
request's root its children, on the request's emulated timeline: `endpoint.queue`
(arrival to admission), `endpoint.prefill` (admission to the first token) and
`endpoint.decode` (to the last token). Each iteration the request took part in is an
event on its prefill or decode span: its index in the engine, batch, the token it gave
the request, its emulated start and duration. Events rather than a span per request
per iteration: Jaeger draws events as ticks on the span's bar and lists them in order,
where spans would add a row per token; and a span costs several times an event (a
16-token completion: 0.8 ms of CPU more with events and trace files, 1.4 ms with
spans; docs/tracing.md). The children are made when the request ends, from what the
hooks recorded: by then every time is final (a plan's iterations are retimed by the
sockets' answer). A phase holds at most MAX_ITERATIONS iterations a span (the SDK's
default bounds on a span's events and links); a longer one is several spans, one after
the other.

On a rack (an engine whose executor's calls cost wall time), each call of passes is a
trace of its own: an `endpoint.passes` span, linked to the spans of the requests it
served, and under it the RunPasses RPC down to each socket's `rdu.serve.pass` spans,
each linked to the requests its pass served (the `PassesServed` the call carries, put
in the call's context for the executor: endpoint/rack.py). A request's phase spans link
to the calls that ran their iterations.

Wall stamps: the root is wall time; its children are stamped at the root's start plus
the emulated time since the request's arrival, so their wall durations are their
emulated durations (at `--time-scale 0` they run past the root's end).
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import Token
from dataclasses import dataclass, field
from typing import NamedTuple, ParamSpec

from fastapi.telemetry import TelemetryConfig
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Link, Span, SpanContext, Status, StatusCode, Tracer, TracerProvider
from opentelemetry.util.types import AttributeValue

from rdurack.endpoint.engine import Engine, Handle
from rdurack.telemetry import names
from rdurack.telemetry.served import SERVED_KEY, PassesServed, ServedRequest, link_to
from rdurack.workloads.serving.stream.scheduler import Iteration, Running

log = logging.getLogger(__name__)
P = ParamSpec("P")

# Iterations a phase span holds at most: the SDK's default bounds on a span's events
# and links (OTEL_SPAN_EVENT_COUNT_LIMIT, OTEL_SPAN_LINK_COUNT_LIMIT) are 128 each.
MAX_ITERATIONS = 128
MAX_LINKS = 128  # requests an `endpoint.passes` span links to, at most


def telemetry(tracer_provider: TracerProvider | None) -> TelemetryConfig:
    """FastAPI's own OpenTelemetry set-up for the endpoint's app: the SERVER span of each
    completion request (the trace's root) from `tracer_provider`, and nothing else (no
    span at all without one). Its operation spans (dependencies, the endpoint function,
    serialization: five a request) would cost more than the request's own children, and
    say less; the endpoint's metrics are its own (`/metrics`); /health, /metrics and
    /v1/models are not traced, as the node agents' heartbeats are not."""
    if tracer_provider is None:
        return {"tracing": False, "metrics": False, "logs": False}
    return {
        "tracer_provider": tracer_provider,
        "operation_spans": False,
        "metrics": False,
        "logs": False,
        "exclude": lambda scope: scope.get("path") not in ROUTES,
    }


def watch(engines: Iterable[Engine], tracer: Tracer) -> None:
    """Give the requests of `engines` their children (after the metrics watch them:
    `on_done` calls theirs first)."""
    for engine in engines:
        RequestTracing(tracer, engine)


ROUTES = ("/v1/completions", "/v1/chat/completions")  # the routes traced


class Step(NamedTuple):
    """One iteration as a request saw it (emulated s)."""

    iteration: int
    batch: int
    start_s: float
    end_s: float
    token: int  # the output token it gave the request, or -1 (a chunk of its prompt)
    prefilled: int  # prompt tokens of the request it prefilled
    call: SpanContext | None  # the call of passes that ran it (on a rack)


@dataclass(eq=False)
class _Request:
    span: Span  # the root: the HTTP request's span
    parent: Context  # the root as the parent of its children
    served: ServedRequest  # the root as a pass's link target
    wall0_ns: int  # the root's start: the wall stamp of the request's emulated arrival
    arrival_s: float
    prefilled: int = 0
    tokens: int = 0
    prefill: list[Step] = field(default_factory=list)
    decode: list[Step] = field(default_factory=list)


class RequestTracing:
    """The spans of one engine's requests, from its hooks (the module docstring)."""

    def __init__(self, tracer: Tracer, engine: Engine) -> None:
        self.tracer = tracer
        self.engine = engine
        self.iterations = 0  # iterations the engine ran: the next one's index
        self._requests: dict[int, _Request] = {}  # by the engine's index of the request
        self._call: SpanContext | None = None  # the call of passes running now
        engine.on_submit = _guarded(self._submit)
        engine.on_iteration = _guarded(self._iteration)
        if engine.plans_ahead:  # its executor's calls cost wall time: a rack
            engine.on_call = self._call_span
        before, after = engine.on_done, _guarded(self._done)

        def done(h: Handle, r: Running | None) -> None:
            before(h, r)
            after(h)

        engine.on_done = done

    def _submit(self, h: Handle) -> None:
        """The request's root is the current span (FastAPI's); none recording (no HTTP
        span, or not sampled): the request is not traced."""
        span = trace.get_current_span()
        if not span.is_recording():
            return
        a = h.arrival
        wall0 = getattr(span, "start_time", None) or time.time_ns()  # an SDK span's start
        ctx = span.get_span_context()
        self._requests[a.index] = _Request(
            span,
            trace.set_span_in_context(span),
            ServedRequest.of(a.index, ctx),
            wall0,
            a.at_s,
        )

    def _iteration(self, it: Iteration, start_s: float, end_s: float) -> None:
        """An iteration ran from `start_s` to `end_s`: each traced request in it records
        the step (the token it got, counted here: a plan has already finished later
        iterations on the scheduler, so the requests' own counts run ahead)."""
        index, call, batch = self.iterations, self._call, it.batch
        self.iterations += 1
        for r, n in it.prefill:
            q = self._requests.get(r.arrival.index)
            if q is not None:
                q.prefilled += n
                token = -1
                if q.prefilled >= r.arrival.prompt_tokens:  # its last chunk: a first token
                    token, q.tokens = 0, 1
                q.prefill.append(Step(index, batch, start_s, end_s, token, n, call))
        for r in it.decode:
            q = self._requests.get(r.arrival.index)
            if q is not None:
                q.decode.append(Step(index, batch, start_s, end_s, q.tokens, 0, call))
                q.tokens += 1

    @contextmanager
    def _call_span(self, planned: Sequence[Iteration]) -> Iterator[object]:
        """A call of `planned`'s passes: its span (a trace of its own) current while the
        executor runs, with the requests each pass served in its context (SERVED_KEY);
        the iterations it ran (recorded after it) link to it."""
        self._call = None
        try:
            opened = self._open_call(planned)
        except Exception:
            log.exception("tracing: a call of passes got no span")
            opened = None
        if opened is None:  # nothing traced: nothing to join
            yield None
            return
        span, token = opened
        try:
            yield None
        except Exception as e:  # the rack did not run it (Unavailable)
            span.set_status(Status(StatusCode.ERROR, str(e)))
            raise
        finally:
            otel_context.detach(token)
            span.end()

    def _open_call(self, planned: Sequence[Iteration]) -> tuple[Span, Token[Context]] | None:
        """The call's span, current (the token to detach it), with what it served."""
        served = PassesServed.of(
            self.iterations,
            [
                [q.served for r in _members(it) if (q := self._requests.get(r.arrival.index))]
                for it in planned
            ],
        )
        if not served.requests:
            return None
        span = self.tracer.start_span(
            names.SPAN_ENDPOINT_PASSES,
            context=Context(),
            links=[link_to(r) for r in served.requests[:MAX_LINKS]],
            attributes={
                names.ATTR_JOB_MODEL: self.engine.model,
                names.ATTR_SERVE_FIRST_ITERATION: served.first_iteration,
                names.ATTR_STEPS: len(planned),
            },
        )
        token = otel_context.attach(
            otel_context.set_value(SERVED_KEY, served, trace.set_span_in_context(span))
        )
        self._call = span.get_span_context()
        return span, token

    def _done(self, h: Handle) -> None:
        """The request ended (its last token, cancelled, or failed): its children."""
        q = self._requests.pop(h.arrival.index, None)
        if q is None:
            return
        steps = q.prefill + q.decode
        admitted = steps[0].start_s if steps else max(q.arrival_s, self.engine.clock_s)
        self._span(q, names.SPAN_REQUEST_QUEUE, q.arrival_s, admitted, {}).end(_wall(q, admitted))
        self._phase(q, names.SPAN_REQUEST_PREFILL, q.prefill, admitted)
        if q.decode:
            self._phase(q, names.SPAN_REQUEST_DECODE, q.decode, q.prefill[-1].end_s)
        a = h.arrival
        root: dict[str, AttributeValue] = {  # set once: each call costs
            names.GEN_AI_REQUEST_MODEL: self.engine.model,
            names.ATTR_REQUEST: a.index,
            names.GEN_AI_USAGE_INPUT_TOKENS: a.prompt_tokens,
            names.GEN_AI_REQUEST_MAX_TOKENS: a.output_tokens,
            names.GEN_AI_USAGE_OUTPUT_TOKENS: q.tokens,
            names.GEN_AI_LATENCY_QUEUE: admitted - q.arrival_s,
        }
        if a.expert:  # a bundle's request: the expert the router or the caller chose
            root[names.ATTR_EXPERT] = a.expert
        if q.tokens:
            first = next(s.end_s for s in q.prefill if s.token == 0)
            root[names.GEN_AI_LATENCY_TTFT] = first - q.arrival_s
            root[names.GEN_AI_LATENCY_E2E] = steps[-1].end_s - q.arrival_s
        q.span.set_attributes(root)
        if h.error is not None:  # a stream already answered 200 ends with an error event
            q.span.set_status(Status(StatusCode.ERROR, str(h.error)))

    def _phase(self, q: _Request, name: str, steps: list[Step], start_s: float) -> None:
        """`steps` as spans of at most MAX_ITERATIONS events each, back to back from
        `start_s`, each linked to the calls of passes that ran its iterations."""
        for i in range(0, len(steps), MAX_ITERATIONS):
            part = steps[i : i + MAX_ITERATIONS]
            calls = {s.call.span_id: s.call for s in part if s.call is not None}
            attributes = {names.ATTR_STEPS: len(part)}
            span = self._span(q, name, start_s, part[-1].end_s, attributes, calls.values())
            for s in part:
                event: dict[str, AttributeValue] = {
                    names.ATTR_ITERATION: s.iteration,
                    names.ATTR_BATCH: s.batch,
                    names.ATTR_EMULATED_START_NS: round(s.start_s * 1e9),
                    names.ATTR_EMULATED_NS: round((s.end_s - s.start_s) * 1e9),
                }
                if s.token >= 0:
                    event[names.ATTR_TOKEN] = s.token
                if s.prefilled:
                    event[names.ATTR_PREFILL_TOKENS] = s.prefilled
                span.add_event(names.EVENT_ITERATION, event, _wall(q, s.end_s))
            span.end(_wall(q, part[-1].end_s))
            start_s = part[-1].end_s

    def _span(
        self,
        q: _Request,
        name: str,
        start_s: float,
        end_s: float,
        attributes: Mapping[str, AttributeValue],
        calls: Iterable[SpanContext] = (),
    ) -> Span:
        """A child of the request's root from `start_s` to `end_s`, emulated, linked to
        `calls`; started, for the caller to end."""
        span = self.tracer.start_span(
            name,
            context=q.parent,
            start_time=_wall(q, start_s),
            links=[Link(c) for c in calls],
            attributes={
                names.ATTR_JOB_MODEL: self.engine.model,
                names.ATTR_EMULATED_START_NS: round(start_s * 1e9),
                names.ATTR_EMULATED_NS: round((end_s - start_s) * 1e9),
                **attributes,
            },
        )
        return span


def _guarded(hook: Callable[P, None]) -> Callable[P, None]:
    """`hook`, logging its failure rather than raising it into the engine's loop: a bug
    in tracing must not stop the serving."""

    @functools.wraps(hook)
    def run(*args: P.args, **kwargs: P.kwargs) -> None:
        try:
            hook(*args, **kwargs)
        except Exception:
            log.exception("tracing: %s failed; a request's trace is incomplete", hook.__name__)

    return run


def _wall(q: _Request, t_s: float) -> int:
    """The wall stamp of emulated time `t_s` on the request's timeline, ns."""
    return q.wall0_ns + round((t_s - q.arrival_s) * 1e9)


def _members(it: Iteration) -> Iterator[Running]:
    """The requests an iteration runs (its padding computes no one's token)."""
    for r, _ in it.prefill:
        yield r
    yield from it.decode
