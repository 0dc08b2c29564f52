"""Call any method of any service by its descriptor, with raw bytes: what the security
and fuzz tests send, whatever the method's message."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import grpc
from google.protobuf import message_factory
from google.protobuf.descriptor import MethodDescriptor, ServiceDescriptor
from google.protobuf.message import Message

# What a server may answer to a hostile request. UNKNOWN, INTERNAL and DATA_LOSS mean a
# crash or a bug (a traceback somewhere), never a proper refusal.
PROPER = frozenset(grpc.StatusCode) - {
    grpc.StatusCode.UNKNOWN,
    grpc.StatusCode.INTERNAL,
    grpc.StatusCode.DATA_LOSS,
}


def methods(service: ServiceDescriptor) -> list[MethodDescriptor]:
    return list(service.methods)


def request_class(method: MethodDescriptor) -> type[Message]:
    return message_factory.GetMessageClass(method.input_type)


def call(
    ch: grpc.Channel,
    method: MethodDescriptor,
    payload: bytes | Sequence[bytes],
    *,
    timeout_s: float = 5.0,
    metadata: Sequence[tuple[str, str]] = (),
) -> tuple[grpc.StatusCode, str]:
    """Send `payload` (for a client-streaming method, a sequence of messages) as the
    request bytes; (status code, details). A server stream is read to its end."""
    path = f"/{method.containing_service.full_name}/{method.name}"
    raw: Any = dict(request_serializer=None, response_deserializer=None)
    md: Any = tuple(metadata)
    try:
        if method.client_streaming:
            chunks = [payload] if isinstance(payload, bytes) else list(payload)
            if method.server_streaming:
                for _ in ch.stream_stream(path, **raw)(
                    iter(chunks), timeout=timeout_s, metadata=md
                ):
                    pass
            else:
                ch.stream_unary(path, **raw)(iter(chunks), timeout=timeout_s, metadata=md)
        else:
            assert isinstance(payload, bytes)
            if method.server_streaming:
                for _ in ch.unary_stream(path, **raw)(payload, timeout=timeout_s, metadata=md):
                    pass
            else:
                ch.unary_unary(path, **raw)(payload, timeout=timeout_s, metadata=md)
    except grpc.RpcError as e:
        assert isinstance(e, grpc.Call)
        return e.code(), e.details() or ""
    return grpc.StatusCode.OK, ""
