"""Hypothesis strategies for hostile gRPC requests, built from the proto descriptors.

For any method: random bytes, a well-formed message of the method cut short, a message
of another method (type confusion), and well-typed messages whose values are absurd
(extreme integers, NaN and infinities, unknown enum numbers, long strings, many
entries). Shared by the unit fuzz suite (orchestrator API, links, health) and the
integration one (node agents).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from google.protobuf import message_factory
from google.protobuf.descriptor import FieldDescriptor, MethodDescriptor
from google.protobuf.message import Message
from hypothesis import strategies as st

T = FieldDescriptor
INT_RANGES = {
    T.TYPE_INT32: (-(1 << 31), (1 << 31) - 1),
    T.TYPE_SINT32: (-(1 << 31), (1 << 31) - 1),
    T.TYPE_SFIXED32: (-(1 << 31), (1 << 31) - 1),
    T.TYPE_UINT32: (0, (1 << 32) - 1),
    T.TYPE_FIXED32: (0, (1 << 32) - 1),
    T.TYPE_INT64: (-(1 << 63), (1 << 63) - 1),
    T.TYPE_SINT64: (-(1 << 63), (1 << 63) - 1),
    T.TYPE_SFIXED64: (-(1 << 63), (1 << 63) - 1),
    T.TYPE_UINT64: (0, (1 << 64) - 1),
    T.TYPE_FIXED64: (0, (1 << 64) - 1),
}
MAX_DEPTH = 4


def _int(lo: int, hi: int) -> st.SearchStrategy[int]:
    # The edges and small numbers matter most; uniform draws over 2^64 rarely hit them.
    edges = [lo, hi, 0, 1, -1, 2, 7, 8, 16, 17, 1 << 20, (1 << 31) - 1, 1 << 32]
    return st.one_of(
        st.sampled_from([e for e in edges if lo <= e <= hi]),
        st.integers(max(lo, -1000), min(hi, 1000)),
        st.integers(lo, hi),
    )


_TEXT = st.one_of(
    st.text(max_size=24),
    st.sampled_from(["", "llama2-7b", "tiny-lm", "rdu-n0-s0", "rdu-n9-s99", "../../etc"]),
    st.builds(
        lambda n, c: c * n, st.sampled_from([201, 257, 5000, 70_000]), st.sampled_from("xé\x00")
    ),
)


def _scalar(f: Any) -> st.SearchStrategy[Any]:
    t = f.type
    if t in INT_RANGES:
        return _int(*INT_RANGES[t])
    if t == T.TYPE_DOUBLE:
        return st.floats(allow_nan=True, allow_infinity=True)
    if t == T.TYPE_FLOAT:
        return st.floats(width=32, allow_nan=True, allow_infinity=True)
    if t == T.TYPE_BOOL:
        return st.booleans()
    if t == T.TYPE_STRING:
        return _TEXT
    if t == T.TYPE_BYTES:
        return st.binary(max_size=64)
    if t == T.TYPE_ENUM:
        return st.integers(-3, 40)  # known numbers and unknown ones
    raise AssertionError(f"no strategy for field type {t}")


@st.composite
def message(draw: st.DrawFn, descriptor: Any, depth: int = 0) -> Message:
    """A message of `descriptor` with some of its fields set to absurd values."""
    msg = message_factory.GetMessageClass(descriptor)()
    fields = [f for f in descriptor.fields if not (f.message_type and depth >= MAX_DEPTH)]
    chosen = draw(st.lists(st.sampled_from(fields), unique=True)) if fields else []
    for f in chosen:
        entry = f.message_type is not None and f.message_type.GetOptions().map_entry
        if entry:
            continue  # no request of rdurack.v1 has a map field
        if f.is_repeated:
            many = draw(st.sampled_from([0, 1, 2, 5, 1025]))  # 1025: over the usual bound
            if f.message_type is not None:
                count = min(many, 3)  # nested lists stay small: the message must build
                for _ in range(count):
                    getattr(msg, f.name).add().CopyFrom(draw(message(f.message_type, depth + 1)))
            else:
                value = draw(_scalar(f))
                values = [value] * many if many > 5 else [draw(_scalar(f)) for _ in range(many)]
                getattr(msg, f.name).extend(values)
        elif f.message_type is not None:
            getattr(msg, f.name).CopyFrom(draw(message(f.message_type, depth + 1)))
        else:
            setattr(msg, f.name, draw(_scalar(f)))
    return msg


def hostile(method: MethodDescriptor, others: Sequence[Any]) -> st.SearchStrategy[bytes]:
    """Bytes for one request of `method`: random, truncated, type-confused or absurd."""
    own = message(method.input_type).map(lambda m: m.SerializeToString())
    truncated = st.tuples(own, st.floats(0, 1)).map(lambda t: t[0][: int(len(t[0]) * t[1])])
    confused = st.sampled_from(others).flatmap(message).map(lambda m: m.SerializeToString())
    return st.one_of(st.binary(max_size=512), truncated, confused, own)
