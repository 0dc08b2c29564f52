"""Checks every request passes before any servicer code sees it.

`wrap_handler` puts checks around one gRPC method handler, whatever its kind: `on_call`
once per call (credentials), `on_request` on every request message (for client streams,
each one as it arrives). `RequestGuard`, on every rdurack server, uses it so that

- a request that is not the method's message at all is INVALID_ARGUMENT, not the
  INTERNAL that gRPC answers when its own decoding fails;
- every field of every request is within `Bounds` (string lengths, counts of repeated
  fields, bytes, finite floats, known enum values): INVALID_ARGUMENT naming the field
  path, e.g. "spec.coe_inference.prompts[3]: longer than 20000 characters".

The limits are one table per API (`Bounds`), not checks scattered over servicers;
servicers and the pydantic models still check what the values mean (ranges, names).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import grpc
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from rdurack.rack.errors import InvalidRequest

Check = Callable[[grpc.ServicerContext], None]
RequestCheck = Callable[[Any, grpc.ServicerContext], Any]


def wrap_handler(
    handler: Any,
    *,
    on_call: Check | None = None,
    on_request: RequestCheck | None = None,
    request_deserializer: Callable[[bytes], Any] | None = None,
) -> Any:
    """`handler` (a grpc.RpcMethodHandler) with `on_call(context)` run once before it
    and `on_request(request, context)` (which returns the request to use) on each
    request. Both end the call by `context.abort`. `request_deserializer` replaces the
    handler's own when given."""
    kind = ("unary_unary", "unary_stream", "stream_unary", "stream_stream")
    behavior = next(getattr(handler, k) for k in kind if getattr(handler, k))

    def one(request: Any, context: grpc.ServicerContext) -> Any:
        if on_call is not None:
            on_call(context)
        return request if on_request is None else on_request(request, context)

    def each(requests: Any, context: grpc.ServicerContext) -> Any:
        if on_call is not None:
            on_call(context)
        if on_request is None:
            return requests
        return (on_request(r, context) for r in requests)

    wrapped: Callable[[Any, grpc.ServicerContext], Any]
    make: Callable[..., Any]
    if handler.unary_unary:

        def unary(request: Any, context: grpc.ServicerContext) -> Any:
            return behavior(one(request, context), context)

        wrapped, make = unary, grpc.unary_unary_rpc_method_handler
    elif handler.unary_stream:

        def unary_stream(request: Any, context: grpc.ServicerContext) -> Any:
            request = one(request, context)  # before the first response, not lazily
            yield from behavior(request, context)

        wrapped, make = unary_stream, grpc.unary_stream_rpc_method_handler
    elif handler.stream_unary:

        def stream_unary(requests: Any, context: grpc.ServicerContext) -> Any:
            return behavior(each(requests, context), context)

        wrapped, make = stream_unary, grpc.stream_unary_rpc_method_handler
    else:

        def stream_stream(requests: Any, context: grpc.ServicerContext) -> Any:
            yield from behavior(each(requests, context), context)

        wrapped, make = stream_stream, grpc.stream_stream_rpc_method_handler
    return make(
        wrapped,
        request_deserializer=request_deserializer or handler.request_deserializer,
        response_serializer=handler.response_serializer,
    )


# ------------------------------------------------------------------ bounds


@dataclass(frozen=True)
class Bounds:
    """Limits on every field of a request. Defaults apply to every field; `chars`,
    `items` and `bytes_` override them per field, keyed by the field's full proto name
    ("rdurack.v1.CoeInferenceJob.prompts"). For a repeated string field, `items` bounds
    the count and `chars` each string. A bytes field without an entry in `bytes_` is
    bounded only by the server's message size limit (reading it would copy it)."""

    max_chars: int = 256
    max_items: int = 1024
    chars: Mapping[str, int] = field(default_factory=dict)
    items: Mapping[str, int] = field(default_factory=dict)
    bytes_: Mapping[str, int] = field(default_factory=dict)

    def check(self, message: Message, path: str = "") -> None:
        """Raise InvalidRequest naming the first field out of bounds."""
        self._check(message, message.DESCRIPTOR, path)

    # Descriptors are typed Any: the C (upb) and Python descriptor classes differ.
    def _check(self, message: Message, descriptor: Any, path: str) -> None:
        for f in descriptor.fields:
            where = f"{path}.{f.name}" if path else f.name
            if f.is_repeated:
                values = getattr(message, f.name)
                limit = self.items.get(f.full_name, self.max_items)
                if len(values) > limit:
                    raise InvalidRequest(f"{where}: more than {limit} entries ({len(values)})")
                if f.message_type is not None and f.message_type.GetOptions().map_entry:
                    self._map(f, values, where)
                    continue
                if f.type == FieldDescriptor.TYPE_BYTES and f.full_name not in self.bytes_:
                    continue
                for i, value in enumerate(values):
                    self._value(f, value, f"{where}[{i}]")
            elif f.type == FieldDescriptor.TYPE_MESSAGE:
                if message.HasField(f.name):
                    self._check(getattr(message, f.name), f.message_type, where)
            elif f.type == FieldDescriptor.TYPE_BYTES and f.full_name not in self.bytes_:
                continue
            else:
                self._value(f, getattr(message, f.name), where)

    def _map(self, f: Any, values: Any, where: str) -> None:
        entry = f.message_type.fields_by_name
        key_field, value_field = entry["key"], entry["value"]
        for key in values:
            self._value(key_field, key, f"{where}[{key!r:.40}]")
            self._value(value_field, values[key], f"{where}[{key!r:.40}]")

    def _value(self, f: Any, value: Any, where: str) -> None:
        t = f.type
        if t == FieldDescriptor.TYPE_MESSAGE:
            self._check(value, f.message_type, where)
        elif t == FieldDescriptor.TYPE_STRING:
            limit = self.chars.get(f.full_name, self.max_chars)
            if len(value) > limit:
                raise InvalidRequest(f"{where}: longer than {limit} characters ({len(value)})")
        elif t == FieldDescriptor.TYPE_BYTES:
            limit = self.bytes_[f.full_name]
            if len(value) > limit:
                raise InvalidRequest(f"{where}: more than {limit:,} bytes ({len(value):,})")
        elif t in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
            if not math.isfinite(value):
                raise InvalidRequest(f"{where}: must be a finite number, got {value}")
        elif t == FieldDescriptor.TYPE_ENUM and value not in f.enum_type.values_by_number:
            accepted = ", ".join(v.name for v in f.enum_type.values)
            raise InvalidRequest(f"{where}: {value} is not a {f.enum_type.name} ({accepted})")


class _Undecodable:
    """Stands for a request message that could not be decoded."""


_UNDECODABLE = _Undecodable()


class RequestGuard(grpc.ServerInterceptor):
    """INVALID_ARGUMENT for a request that does not decode as the method's message or
    has a field out of `bounds` (module docstring). gRPC decodes requests before any
    servicer code could refuse them, so decoding is wrapped here too."""

    def __init__(self, bounds: Bounds) -> None:
        self.bounds = bounds

    def intercept_service(self, continuation: Any, details: Any) -> Any:
        handler = continuation(details)
        if handler is None or handler.request_deserializer is None:
            return handler
        decode = handler.request_deserializer
        method = details.method
        bounds = self.bounds

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
            try:
                bounds.check(request)
            except InvalidRequest as e:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
            return request

        return wrap_handler(handler, on_request=check, request_deserializer=safe)
