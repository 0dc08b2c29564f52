"""LinkService on the wire: its method paths, its message size limit, and its
messages written and read without protobuf's copies of the payload.

A link transfer's payload is a protobuf `bytes` field: `TransferChunk.data` or
`Delivery.data`. Going through the generated classes costs the payload several copies
per message (measured on 1 MiB, this machine: `bytes(view)` for the constructor, a copy
into the message, another on `SerializeToString`; on the receiver a copy on parsing and
another on each read of the field). gRPC Python itself copies once more each way
(into and out of its own buffers), and that cannot be avoided from Python.

The protobuf wire format of these messages is simple and stable (a field is a tag byte,
a varint length, the bytes), so this module writes and reads it directly:
- senders build each message from the header's serialized bytes and the payload view
  in one `b"".join` (one copy of the payload);
- receivers take the payload as a memoryview into the bytes gRPC handed over (no copy),
  when the message is in the canonical form these encoders write. Anything else (fields
  in another order, repeated or unknown fields, a peer using the generated classes)
  falls back to the generated parser, so every valid encoding is still accepted.

The messages are the ones link.proto declares; tests check both directions against the
generated classes. Both ends, the servicer and the senders, take the message size limit
and the service's name from here.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from google.protobuf.message import Message

from rdurack.v1 import link_pb2

# Largest single gRPC message allowed on server and channels (64 MiB). Chunks stay far
# below it; the limit is raised above gRPC's 4 MB default anyway (DESIGN.md conventions)
# so a header with a long shape or a future larger chunk size is not refused.
MAX_MESSAGE_BYTES = 64 << 20
# Only the size limits: on loopback, none of grpc.http2.lookahead_bytes (16 MiB),
# grpc.http2.write_buffer_size (8 MiB), grpc.http2.max_frame_size (16 MiB),
# grpc.experimental.tcp_{min,max}_read_chunk_size (1/8 MiB) nor bdp_probe (on by default)
# moved the 64 MB cross-process throughput or the per-call cost beyond run-to-run noise
# (about +-20% on this machine), so none is set.
SIZE_OPTIONS: tuple[tuple[str, int], ...] = (
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
)
# Full name of the service, as its method paths spell it.
SERVICE = link_pb2.DESCRIPTOR.services_by_name["LinkService"].full_name

# Field tags, (field number << 3) | wire type 2 (length-delimited), link.proto.
_TAG_HEADER = 0x0A  # TransferChunk.header = 1, Delivery.header = 1
_TAG_DATA = 0x12  # TransferChunk.data = 2, Delivery.data = 2
_TAG_WHOLE = 0x1A  # TransferChunk.whole = 3
_MAX_VARINT_BYTES = 10  # a uint64 takes at most ten 7-bit groups


@dataclass(frozen=True, slots=True)
class Delivered:
    """A decoded Delivery: its header and a view of its payload (empty if none)."""

    header: link_pb2.TransferHeader
    data: memoryview | bytes


# A decoded TransferChunk: the header message, a view of a data chunk's bytes (empty
# for a chunk with no field set: gRPC takes a deserializer's None for a failure), or a
# whole transfer.
Chunk = link_pb2.TransferHeader | memoryview | bytes | Delivered


def varint(value: int) -> bytes:
    """`value` (>= 0) as a protobuf base-128 varint."""
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _read_varint(raw: bytes | memoryview, pos: int) -> tuple[int, int] | None:
    """(value, position after it), or None when `raw` holds no complete varint there."""
    value = shift = 0
    for i in range(pos, min(len(raw), pos + _MAX_VARINT_BYTES)):
        byte = raw[i]
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, i + 1
        shift += 7
    return None


def _field(tag: int, data: bytes | memoryview) -> Iterable[bytes | memoryview]:
    return (bytes((tag,)), varint(len(data)), data)


# ------------------------------------------------------------------ sending


def encode_header_chunk(header: link_pb2.TransferHeader) -> bytes:
    """A TransferChunk carrying `header`."""
    return b"".join(_field(_TAG_HEADER, header.SerializeToString()))


def encode_data_chunk(data: memoryview) -> bytes:
    """A TransferChunk carrying `data` (flat bytes): one copy of the payload."""
    return b"".join(_field(_TAG_DATA, data))


def encode_delivery(header: link_pb2.TransferHeader, data: memoryview | None) -> bytes:
    """A Delivery of `header` and `data` (None or empty: no data field, as protobuf
    omits an empty proto3 bytes field)."""
    return b"".join(_delivery(header, data))


def encode_whole_chunk(header: link_pb2.TransferHeader, data: memoryview | None) -> bytes:
    """A TransferChunk carrying a whole transfer (a Delivery): one copy of the payload,
    as `encode_delivery`'s."""
    delivery = _delivery(header, data)
    size = sum(len(p) for p in delivery)
    return b"".join((bytes((_TAG_WHOLE,)), varint(size), *delivery))


def _delivery(header: link_pb2.TransferHeader, data: memoryview | None) -> list[bytes | memoryview]:
    """A Delivery's encoding in pieces, none of them a copy of the payload yet."""
    parts = [*_field(_TAG_HEADER, header.SerializeToString())]
    if data is not None and len(data):
        parts += _field(_TAG_DATA, data)
    return parts


# ------------------------------------------------------------------ receiving


def decode_chunk(raw: bytes) -> Chunk:
    """A TransferChunk: its header, its data as a view into `raw` (no copy), or its
    whole transfer, the data a view into `raw` when canonical.

    Raises google.protobuf.message.DecodeError for bytes that are no TransferChunk."""
    if raw[:1] in (bytes((_TAG_DATA,)), bytes((_TAG_WHOLE,))):
        read = _read_varint(raw, 1)
        if read is not None and read[0] == len(raw) - read[1]:
            if raw[0] == _TAG_DATA:
                return memoryview(raw)[read[1] :]
            return _delivery_at(raw, read[1])
    chunk = link_pb2.TransferChunk.FromString(raw)
    kind = chunk.WhichOneof("chunk")
    if kind is None:
        return b""
    if kind == "whole":
        return Delivered(chunk.whole.header, chunk.whole.data)
    return chunk.header if kind == "header" else chunk.data


def decode_delivery(raw: bytes) -> Delivered:
    """A Delivery, its data as a view into `raw` when canonical (no copy).

    Raises google.protobuf.message.DecodeError for bytes that are no Delivery."""
    return _delivery_at(raw, 0)


def _delivery_at(raw: bytes, pos: int) -> Delivered:
    """The Delivery that `raw` holds from `pos` to its end (decode_delivery)."""
    if raw[pos : pos + 1] == bytes((_TAG_HEADER,)):
        read = _read_varint(raw, pos + 1)
        if read is not None:
            size, start = read
            end = start + size
            if end == len(raw):  # a header and no data field
                return Delivered(link_pb2.TransferHeader.FromString(raw[start:end]), b"")
            if raw[end : end + 1] == bytes((_TAG_DATA,)):
                data = _read_varint(raw, end + 1)
                if data is not None and data[0] == len(raw) - data[1]:
                    header = link_pb2.TransferHeader.FromString(raw[start:end])
                    return Delivered(header, memoryview(raw)[data[1] :])
    delivery = link_pb2.Delivery.FromString(raw[pos:])
    return Delivered(delivery.header, delivery.data)


def messages_of(request: object) -> Iterable[Message]:
    """The protobuf messages inside a decoded LinkService request, for the request
    guard's field bounds: a chunk's or delivery's header, a Ping request as itself;
    payload bytes are none (bounded by the server's message size alone)."""
    if isinstance(request, Delivered):
        return (request.header,)
    if isinstance(request, Message):
        return (request,)
    return ()
