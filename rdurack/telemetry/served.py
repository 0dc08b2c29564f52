"""Which requests an endpoint's passes served: what joins a request's trace to the
sockets' lanes (docs/tracing.md, "The tree of one request").

The endpoint's engine sends a call of passes (consecutive iterations) to a rack; with
it goes a `PassesServed`, which each socket turns into span links from its pass's
`rdu.serve.pass` span to the spans of the requests the pass served, and the engine's
iteration index on it. It travels as plain ints (the span ids), so that it crosses gRPC
and Ray calls cheaply; `links` builds the OpenTelemetry links where a span is made.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from opentelemetry.context import create_key
from opentelemetry.trace import Link, SpanContext, TraceFlags

from rdurack.telemetry import names

# Where a call's PassesServed rides in the OpenTelemetry context, from the endpoint's
# tracing (endpoint/tracing.py) to its executor (endpoint/rack.py), as the call's trace
# context does to the gRPC interceptor: the executor's signature stays the engine's.
SERVED_KEY = create_key("rdurack.passes_served")


@dataclass(frozen=True, slots=True)
class ServedRequest:
    """A request's span: its trace and span ids, and the engine's index of it."""

    request: int
    trace_id: int
    span_id: int

    @classmethod
    def of(cls, request: int, context: SpanContext) -> ServedRequest:
        return cls(request, context.trace_id, context.span_id)


@dataclass(frozen=True, slots=True)
class PassesServed:
    """The requests each pass of a call served: `passes[i]` indexes `requests`; pass i
    is the engine's iteration `first_iteration + i`."""

    first_iteration: int
    requests: tuple[ServedRequest, ...]
    passes: tuple[tuple[int, ...], ...]

    def links(self) -> list[list[Link]]:
        """Each pass's links to its requests' spans (one Link object per request, shared
        by the passes that served it)."""
        every = [link_to(r) for r in self.requests]
        return [[every[j] for j in served] for served in self.passes]

    @classmethod
    def of(cls, first_iteration: int, passes: Sequence[Sequence[ServedRequest]]) -> PassesServed:
        """From each pass's requests, every request listed once."""
        index: dict[ServedRequest, int] = {}
        served = tuple(tuple(index.setdefault(r, len(index)) for r in p) for p in passes)
        return cls(first_iteration, tuple(index), served)


def link_to(r: ServedRequest) -> Link:
    """A link to a request's span, naming the request."""
    context = SpanContext(r.trace_id, r.span_id, True, TraceFlags(TraceFlags.SAMPLED))
    return Link(context, {names.ATTR_REQUEST: r.request})
