"""One way to build a gRPC server: health checking, reflection, message-size limits and
tracing; and one way to open a channel to one."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent import futures
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from opentelemetry import trace

from rdurack.telemetry.propagation import ClientTracing, ServerTracing

# Messages above gRPC's 4 MB default must be allowed on both ends (tensors, results).
MAX_MESSAGE_BYTES = 64 << 20
OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
]


class _Undecodable:
    """Stands for a request message that could not be decoded."""


_UNDECODABLE = _Undecodable()


class DecodeGuard(grpc.ServerInterceptor):
    """Answer INVALID_ARGUMENT, not INTERNAL, for a request that is not the message the
    method takes: gRPC decodes requests before any servicer code could refuse them."""

    def intercept_service(self, continuation: Any, details: Any) -> Any:
        handler = continuation(details)
        if handler is None or handler.request_deserializer is None:
            return handler
        decode = handler.request_deserializer
        method = details.method

        def safe(data: bytes) -> Any:
            try:
                return decode(data)
            except Exception:
                return _UNDECODABLE

        def check(request: Any, context: grpc.ServicerContext) -> Any:
            if request is _UNDECODABLE:
                context.abort(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"{method}: the request is not a valid message of this method",
                )
            return request

        kind = ("unary_unary", "unary_stream", "stream_unary", "stream_stream")
        behavior = next(getattr(handler, k) for k in kind if getattr(handler, k))
        wrapped: Callable[[Any, grpc.ServicerContext], Any]
        make: Callable[..., Any]
        if handler.unary_unary:

            def unary(request: Any, context: grpc.ServicerContext) -> Any:
                return behavior(check(request, context), context)

            wrapped, make = unary, grpc.unary_unary_rpc_method_handler
        elif handler.unary_stream:

            def unary_stream(request: Any, context: grpc.ServicerContext) -> Any:
                yield from behavior(check(request, context), context)

            wrapped, make = unary_stream, grpc.unary_stream_rpc_method_handler
        else:

            def streamed(requests: Any, context: grpc.ServicerContext) -> Any:
                return behavior((check(r, context) for r in requests), context)

            wrapped = streamed
            make = (
                grpc.stream_unary_rpc_method_handler
                if handler.stream_unary
                else grpc.stream_stream_rpc_method_handler
            )
        return make(
            wrapped, request_deserializer=safe, response_serializer=handler.response_serializer
        )


class Server:
    """A started gRPC server and its health servicer."""

    def __init__(
        self,
        services: Sequence[tuple[str, Callable[[grpc.Server], None]]],
        host: str = "127.0.0.1",
        port: int = 0,
        workers: int = 16,
        tracer_provider: trace.TracerProvider | None = None,
    ) -> None:
        """`services`: (full service name, a function adding its servicer to a server).
        `tracer_provider`: where RPC spans go (default: the process's global one)."""
        self.server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=workers),
            options=OPTIONS,
            # Tracing outermost: its span also covers requests DecodeGuard refuses.
            interceptors=[ServerTracing(tracer_provider), DecodeGuard()],
        )
        for _, add in services:
            add(self.server)
        self.health = health.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        names = [name for name, _ in services]
        reflection.enable_server_reflection(
            [
                *names,
                health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
                reflection.SERVICE_NAME,
            ],
            self.server,
        )
        bound = self.server.add_insecure_port(f"{host}:{port}")
        if bound == 0:
            raise OSError(f"cannot bind {host}:{port}")
        self.address = f"{host}:{bound}"
        self.server.start()
        for name in ["", *names]:
            self.health.set(name, health_pb2.HealthCheckResponse.SERVING)

    def stop(self, grace_s: float = 1.0) -> None:
        self.health.enter_graceful_shutdown()
        self.server.stop(grace_s).wait()

    def wait(self) -> None:
        self.server.wait_for_termination()


def channel(
    address: str,
    tracer_provider: trace.TracerProvider | None = None,
    options: Sequence[tuple[str, Any]] = (),
) -> grpc.Channel:
    """A channel whose calls carry the caller's trace context (and get CLIENT spans);
    `options`: channel arguments beyond the message-size limits."""
    return grpc.intercept_channel(
        grpc.insecure_channel(address, options=[*OPTIONS, *options]),
        ClientTracing(tracer_provider),
    )
