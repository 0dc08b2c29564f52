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
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import grpc
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from rdurack.errors import InvalidRequest

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


_SKIP, _MESSAGE, _STRING, _BYTES, _FLOAT, _ENUM, _MAP = range(7)
_FLOATS = (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT)


@dataclass(frozen=True)
class _Rule:
    """How one field is checked (compiled once per message type)."""

    name: str
    kind: int
    repeated: bool
    items: int  # most entries (repeated fields)
    limit: int  # most characters (strings) or bytes (bytes)
    message: Any = None  # the message type (_MESSAGE) or map entry type (_MAP)
    enum: Any = None  # the enum type (_ENUM)


@dataclass(frozen=True)
class Bounds:
    """Limits on every field of a request. Defaults apply to every field; `chars`,
    `items` and `bytes_` override them per field, keyed by the field's full proto name
    ("rdurack.v1.CoeInferenceJob.prompts"). For a repeated string field, `items` bounds
    the count and `chars` each string. A bytes field without an entry in `bytes_` is
    bounded only by the server's message size limit (reading it would copy it).
    Integers and bools are bounded by their proto types; the servicers check what they
    mean. The rules for a message type are compiled on first use and kept."""

    max_chars: int = 256
    max_items: int = 1024
    chars: Mapping[str, int] = field(default_factory=dict)
    items: Mapping[str, int] = field(default_factory=dict)
    bytes_: Mapping[str, int] = field(default_factory=dict)
    _rules: dict[str, tuple[_Rule, ...]] = field(default_factory=dict, repr=False, compare=False)

    def check(self, message: Message, path: str = "") -> None:
        self._check(message, message.DESCRIPTOR, path)

    def _compile(self, descriptor: Any) -> tuple[_Rule, ...]:
        rules = self._rules.get(descriptor.full_name)
        if rules is not None:
            return rules
        out = []
        for f in descriptor.fields:
            t, name = f.type, f.full_name
            if f.message_type is not None and f.message_type.GetOptions().map_entry:
                kind = _MAP
            elif t == FieldDescriptor.TYPE_MESSAGE:
                kind = _MESSAGE
            elif t == FieldDescriptor.TYPE_STRING:
                kind = _STRING
            elif t == FieldDescriptor.TYPE_BYTES:
                kind = _BYTES if name in self.bytes_ else _SKIP  # reading it would copy it
            elif t in _FLOATS:
                kind = _FLOAT
            elif t == FieldDescriptor.TYPE_ENUM:
                kind = _ENUM
            else:
                kind = _SKIP  # integers and bools: their proto type bounds them
            if kind == _SKIP and not f.is_repeated:
                continue
            limit = (
                self.chars.get(name, self.max_chars)
                if kind == _STRING
                else self.bytes_.get(name, 0)
            )
            out.append(
                _Rule(
                    f.name,
                    kind,
                    f.is_repeated,
                    self.items.get(name, self.max_items),
                    limit,
                    f.message_type,
                    f.enum_type,
                )
            )
        rules = tuple(out)
        self._rules[descriptor.full_name] = rules  # a cache: same input, same rules
        return rules

    def _check(self, message: Any, descriptor: Any, path: str) -> None:
        for r in self._compile(descriptor):
            if r.repeated:
                values = getattr(message, r.name)
                if len(values) > r.items:
                    raise InvalidRequest(
                        f"{_at(path, r.name)}: more than {r.items} entries ({len(values)})"
                    )
                if r.kind == _MAP:
                    key_rule, value_rule = self._compile(r.message)  # key, then value
                    for key in values:
                        where = f"{_at(path, r.name)}[{key!r:.40}]"
                        self._value(key_rule, key, where)
                        self._value(value_rule, values[key], where)
                elif r.kind != _SKIP:
                    for i, value in enumerate(values):
                        self._value(r, value, path, r.name, i)
            elif r.kind == _MESSAGE:
                if message.HasField(r.name):
                    self._check(getattr(message, r.name), r.message, _at(path, r.name))
            else:
                self._value(r, getattr(message, r.name), path, r.name)

    def _value(
        self, r: _Rule, value: Any, path: str, name: str = "", index: int | None = None
    ) -> None:
        """Check one value; the field's path (`path`.`name`[`index`]) is built only for
        an error: most requests pass, and building it for every field would cost more
        than the checks."""
        kind = r.kind
        if kind == _STRING:
            if len(value) > r.limit:
                where = _at(path, name, index)
                raise InvalidRequest(f"{where}: longer than {r.limit} characters ({len(value)})")
        elif kind == _FLOAT:
            if not math.isfinite(value):
                where = _at(path, name, index)
                raise InvalidRequest(f"{where}: must be a finite number, got {value}")
        elif kind == _ENUM:
            if value not in r.enum.values_by_number:
                accepted = ", ".join(v.name for v in r.enum.values)
                where = _at(path, name, index)
                raise InvalidRequest(f"{where}: {value} is not a {r.enum.name} ({accepted})")
        elif kind == _MESSAGE:
            self._check(value, r.message, _at(path, name, index))
        elif kind == _BYTES and len(value) > r.limit:
            where = _at(path, name, index)
            raise InvalidRequest(f"{where}: more than {r.limit:,} bytes ({len(value):,})")


def _at(path: str, name: str = "", index: int | None = None) -> str:
    """A field's path: "spec.coe_inference.prompts[3]"."""
    where = f"{path}.{name}" if path and name else path or name
    return where if index is None else f"{where}[{index}]"


class _Undecodable:
    """Stands for a request message that could not be decoded."""


_UNDECODABLE = _Undecodable()


class RequestGuard(grpc.ServerInterceptor):
    """INVALID_ARGUMENT for a request that does not decode as the method's message or
    has a field out of `bounds` (module docstring). gRPC decodes requests before any
    servicer code could refuse them, so decoding is wrapped here too.

    `messages_of` names the protobuf messages in a decoded request whose fields are
    bounded: by default the request itself. A service with its own decoders (the links'
    zero-copy wire format, node_agent/links/wire.py) says where its messages are.
    The handler it builds depends on the method only (security/per_method.py)."""

    def __init__(
        self,
        bounds: Bounds,
        messages_of: Callable[[Any], Iterable[Message]] = lambda request: (request,),
    ) -> None:
        self.bounds = bounds
        self.messages_of = messages_of

    def intercept_service(self, continuation: Any, details: Any) -> Any:
        handler = continuation(details)
        if handler is None or handler.request_deserializer is None:
            return handler
        decode = handler.request_deserializer
        method = details.method
        bounds, messages_of = self.bounds, self.messages_of

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
                for message in messages_of(request):
                    bounds.check(message)
            except InvalidRequest as e:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
            return request

        return wrap_handler(handler, on_request=check, request_deserializer=safe)
