"""Trace context across process boundaries: W3C trace-context carriers for Ray actor
calls, and gRPC interceptors that carry it in metadata (with the two pieces every client
interceptor of rdurack builds on: `CallDetails`, `ClientCalls`).

Ray's own tracing hook is unmaintained, so actor calls take an explicit
`carrier: dict[str, str]` (`inject()` on the caller, `extract()` in the actor).

Why not opentelemetry-instrumentation-grpc (0.66b2, the release of SDK 1.45.2): its
spans are named with a leading slash ("/rdurack.v1.JobService/SubmitJob", not
names.py's "rdurack.v1.JobService/SubmitJob") under its own scope; its server spans add
net.peer.* and rpc.user_agent, and keep status code 0 and no error when a handler
raises; its client hands back a server stream as a bare generator (no `cancel()`, no
status), whose span ends only once the generator is exhausted or collected.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import grpc
from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

from rdurack.telemetry import names


def inject(ctx: otel_context.Context | None = None) -> dict[str, str]:
    """The current (or `ctx`'s) trace context as a carrier: `traceparent`, ..."""
    carrier: dict[str, str] = {}
    propagate.inject(carrier, context=ctx)
    return carrier


def extract(carrier: Mapping[str, str] | None) -> otel_context.Context:
    """The context a carrier from `inject` describes (an empty one for None)."""
    return propagate.extract(dict(carrier or {}))


def _current(span: Span) -> Any:
    """Make `span` current; the caller ends it, with the gRPC status."""
    return trace.use_span(span, record_exception=False, set_status_on_exception=False)


def _split(method: str) -> tuple[str, str]:
    """'/rdurack.v1.JobService/SubmitJob' -> ('rdurack.v1.JobService', 'SubmitJob')."""
    service, _, name = method.lstrip("/").rpartition("/")
    return service, name


def _rpc_attributes(method: str) -> dict[str, str]:
    service, name = _split(method)
    return {names.RPC_SYSTEM: "grpc", names.RPC_SERVICE: service, names.RPC_METHOD: name}


# Server spans: per the RPC semantic conventions only these codes are the server's error.
_SERVER_ERRORS = {
    grpc.StatusCode.UNKNOWN,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.UNIMPLEMENTED,
    grpc.StatusCode.INTERNAL,
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.DATA_LOSS,
}


def _finish(span: Span, code: grpc.StatusCode | None, details: str, server: bool) -> None:
    code = code or grpc.StatusCode.OK
    span.set_attribute(names.RPC_GRPC_STATUS_CODE, code.value[0])
    if code is not grpc.StatusCode.OK and (not server or code in _SERVER_ERRORS):
        span.set_status(Status(StatusCode.ERROR, f"{code.name}: {details}"))
    span.end()


class ServerTracing(grpc.ServerInterceptor):
    """A SERVER span per RPC, named 'rdurack.v1.Service/Method', continuing the trace
    the client put in the invocation metadata; current while the handler runs. The
    handler it builds depends on the method only (the metadata is read from the call's
    context), so that security/per_method.py can build it once per method."""

    def __init__(self, tracer_provider: trace.TracerProvider | None = None) -> None:
        self._tracer = trace.get_tracer(names.TRACER_GRPC, tracer_provider=tracer_provider)

    def intercept_service(self, continuation: Any, details: Any) -> Any:
        handler = continuation(details)
        if handler is None or details.method in names.UNTRACED_METHODS:
            return handler
        method: str = details.method
        name, attributes = method.lstrip("/"), _rpc_attributes(method)
        tracer = self._tracer

        def outcome(context: grpc.ServicerContext, error: BaseException | None) -> tuple[Any, str]:
            # code() and details() exist on grpc's contexts, not in the typing stubs.
            code = getattr(context, "code", lambda: None)()
            if code is None and error is not None:
                code = grpc.StatusCode.UNKNOWN
            return code, str(getattr(context, "details", lambda: "")() or error or "")

        @contextmanager
        def serving(context: grpc.ServicerContext) -> Iterator[None]:
            """The request's span, current while the handler runs (a stream's handler:
            until its last message), ended with the status the handler left."""
            metadata = context.invocation_metadata() or ()
            span = tracer.start_span(
                name,
                context=extract({k: v for k, v in metadata if isinstance(v, str)}),
                kind=SpanKind.SERVER,
                attributes=attributes,
            )
            error: BaseException | None = None
            try:
                with _current(span):
                    yield
            except BaseException as e:
                error = e
                raise
            finally:
                _finish(span, *outcome(context, error), server=True)

        def traced(
            behavior: Callable[[Any, grpc.ServicerContext], Any],
        ) -> Callable[[Any, grpc.ServicerContext], Any]:
            def run(request: Any, context: grpc.ServicerContext) -> Any:
                with serving(context):
                    return behavior(request, context)

            return run

        def traced_stream(
            behavior: Callable[[Any, grpc.ServicerContext], Iterator[Any]],
        ) -> Callable[[Any, grpc.ServicerContext], Iterator[Any]]:
            def run(request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
                with serving(context):
                    yield from behavior(request, context)

            return run

        if handler.unary_unary:
            wrap, make = traced(handler.unary_unary), grpc.unary_unary_rpc_method_handler
        elif handler.stream_unary:
            wrap, make = traced(handler.stream_unary), grpc.stream_unary_rpc_method_handler
        elif handler.unary_stream:
            wrap, make = traced_stream(handler.unary_stream), grpc.unary_stream_rpc_method_handler
        else:
            wrap = traced_stream(handler.stream_stream)
            make = grpc.stream_stream_rpc_method_handler
        return make(
            wrap,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )


class CallDetails(grpc.ClientCallDetails):
    """A call's details with other metadata (what client interceptors hand on)."""

    def __init__(
        self, base: grpc.ClientCallDetails, metadata: list[tuple[str, str | bytes]]
    ) -> None:
        self.method = base.method
        self.timeout = base.timeout
        self.metadata = tuple(metadata)
        self.credentials = base.credentials
        self.wait_for_ready = getattr(base, "wait_for_ready", None)
        self.compression = getattr(base, "compression", None)


class ClientCalls(
    grpc.UnaryUnaryClientInterceptor,
    grpc.UnaryStreamClientInterceptor,
    grpc.StreamUnaryClientInterceptor,
    grpc.StreamStreamClientInterceptor,
):
    """A client interceptor that treats calls of every shape alike: a subclass writes
    `_call(continuation, details, request_or_requests)` once."""

    def _call(self, continuation: Any, details: grpc.ClientCallDetails, request: Any) -> Any:
        raise NotImplementedError

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return self._call(continuation, details, request)

    def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return self._call(continuation, details, request)

    def intercept_stream_unary(self, continuation: Any, details: Any, requests: Any) -> Any:
        return self._call(continuation, details, requests)

    def intercept_stream_stream(self, continuation: Any, details: Any, requests: Any) -> Any:
        return self._call(continuation, details, requests)


class ClientTracing(ClientCalls):
    """A CLIENT span per outgoing RPC, child of the current span, whose context goes
    out in the call's metadata (W3C `traceparent`); it ends when the call does."""

    def __init__(self, tracer_provider: trace.TracerProvider | None = None) -> None:
        self._tracer = trace.get_tracer(names.TRACER_GRPC, tracer_provider=tracer_provider)

    def _call(self, continuation: Any, details: grpc.ClientCallDetails, request: Any) -> Any:
        method = str(details.method)
        if method in names.UNTRACED_METHODS:
            return continuation(details, request)
        span = self._tracer.start_span(
            method.lstrip("/"), kind=SpanKind.CLIENT, attributes=_rpc_attributes(method)
        )
        carrier = inject(trace.set_span_in_context(span))
        metadata = [(k, v) for k, v in (details.metadata or ()) if k not in carrier] + list(
            carrier.items()
        )
        try:
            call = continuation(CallDetails(details, metadata), request)
        except grpc.RpcError as e:
            code = e.code() if isinstance(e, grpc.Call) else grpc.StatusCode.UNKNOWN
            _finish(span, code, str(e), server=False)
            raise
        except BaseException as e:
            _finish(span, grpc.StatusCode.UNKNOWN, str(e), server=False)
            raise

        def done(c: Any) -> None:
            try:
                code, text = c.code(), c.details()
            except Exception:  # a call that never started has no status
                code, text = grpc.StatusCode.UNKNOWN, ""
            _finish(span, code, str(text or ""), server=False)

        call.add_done_callback(done)
        return call
