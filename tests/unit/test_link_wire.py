"""links/wire.py writes what the generated classes read, and reads what they write."""

from __future__ import annotations

import platform

import pytest
from google.protobuf.message import DecodeError

from rdurack.node_agent import heap
from rdurack.node_agent.links import wire
from rdurack.v1 import link_pb2

HEADER = link_pb2.TransferHeader(
    transfer_id="rdu-n0-s0-7",
    src_socket_id="rdu-n0-s0",
    dst_socket_id="rdu-n0-s1",
    total_bytes=300,
    collective_tag="ar",
    collective_step=3,
    dtype="float32",
    shape=[75],
    emulated_arrival_ns=12345,
)


@pytest.mark.parametrize("value", [0, 1, 127, 128, 300, 1 << 20, (1 << 64) - 1])
def test_varint_is_protobufs(value: int) -> None:
    # A uint64 field 5 (total_bytes) is tag 0x28 then the varint.
    encoded = link_pb2.TransferHeader(total_bytes=value).SerializeToString()
    assert wire.varint(value) == (encoded[1:] if value else b"\x00")


@pytest.mark.parametrize("size", [0, 1, 127, 128, 1 << 20])
def test_data_chunk_reads_back_with_the_generated_class(size: int) -> None:
    data = bytes(range(256)) * (size // 256) + bytes(size % 256)
    raw = wire.encode_data_chunk(memoryview(data))
    parsed = link_pb2.TransferChunk.FromString(raw)
    assert parsed.WhichOneof("chunk") == "data" and parsed.data == data


def test_header_chunk_reads_back_with_the_generated_class() -> None:
    raw = wire.encode_header_chunk(HEADER)
    assert link_pb2.TransferChunk.FromString(raw).header == HEADER
    assert raw == link_pb2.TransferChunk(header=HEADER).SerializeToString()


def test_decode_chunk_takes_the_data_as_a_view_without_copying() -> None:
    data = b"\x01\x02" * 1000
    raw = link_pb2.TransferChunk(data=data).SerializeToString()
    got = wire.decode_chunk(raw)
    assert isinstance(got, memoryview) and got.obj is raw  # a view into gRPC's bytes
    assert bytes(got) == data


def test_decode_chunk_header_and_empty_chunk() -> None:
    assert wire.decode_chunk(link_pb2.TransferChunk(header=HEADER).SerializeToString()) == HEADER
    # Neither field set: no data (not None, which gRPC would take for a decoding failure).
    assert wire.decode_chunk(b"") == b""


def test_decode_chunk_falls_back_for_a_non_canonical_encoding() -> None:
    # The data field twice: protobuf keeps the last; the fast path must not take the first.
    assert _data(b"\x12\x02ab" + b"\x12\x03xyz") == b"xyz"
    # An unknown field after the data: still the data.
    assert _data(link_pb2.TransferChunk(data=b"abc").SerializeToString() + b"\x18\x01") == b"abc"


def _data(raw: bytes) -> bytes:
    got = wire.decode_chunk(raw)
    assert isinstance(got, memoryview | bytes)
    return bytes(got)


def test_decode_chunk_refuses_garbage() -> None:
    with pytest.raises(DecodeError):
        wire.decode_chunk(b"\x12\x05ab")  # a length longer than the message


@pytest.mark.parametrize("data", [None, b"", b"x", b"\x00" * 200_000])
def test_delivery_round_trips_both_ways(data: bytes | None) -> None:
    raw = wire.encode_delivery(HEADER, None if data is None else memoryview(data))
    parsed = link_pb2.Delivery.FromString(raw)
    assert parsed.header == HEADER and parsed.data == (data or b"")
    # And the generated class's own encoding decodes to the same.
    theirs = link_pb2.Delivery(header=HEADER, data=data or b"").SerializeToString()
    assert raw == theirs
    back = wire.decode_delivery(theirs)
    assert back.header == HEADER and bytes(back.data) == (data or b"")


def test_decode_delivery_views_the_data_and_falls_back_when_reordered() -> None:
    raw = link_pb2.Delivery(header=HEADER, data=b"payload").SerializeToString()
    got = wire.decode_delivery(raw)
    assert isinstance(got.data, memoryview) and got.data.obj is raw
    # Data first, then the header: valid protobuf, not the canonical order.
    header = HEADER.SerializeToString()
    reordered = b"\x12\x07payload" + b"\x0a" + wire.varint(len(header)) + header
    back = wire.decode_delivery(reordered)
    assert back.header == HEADER and bytes(back.data) == b"payload"


@pytest.mark.parametrize("data", [None, b"", b"x", b"\x00" * 200_000])
def test_whole_chunk_round_trips_both_ways(data: bytes | None) -> None:
    raw = wire.encode_whole_chunk(HEADER, None if data is None else memoryview(data))
    parsed = link_pb2.TransferChunk.FromString(raw)
    assert parsed.WhichOneof("chunk") == "whole"
    assert parsed.whole.header == HEADER and parsed.whole.data == (data or b"")
    theirs = link_pb2.TransferChunk(
        whole=link_pb2.Delivery(header=HEADER, data=data or b"")
    ).SerializeToString()
    assert raw == theirs
    back = wire.decode_chunk(theirs)
    assert isinstance(back, wire.Delivered)
    assert back.header == HEADER and bytes(back.data) == (data or b"")


def test_decode_chunk_views_a_whole_transfers_data_and_falls_back_when_not_canonical() -> None:
    raw = wire.encode_whole_chunk(HEADER, memoryview(b"payload"))
    got = wire.decode_chunk(raw)
    assert isinstance(got, wire.Delivered)
    assert isinstance(got.data, memoryview) and got.data.obj is raw  # no copy
    # An unknown field (4, varint) after the whole transfer: valid, not canonical.
    back = wire.decode_chunk(raw + b"\x20\x01")
    assert isinstance(back, wire.Delivered)
    assert back.header == HEADER and bytes(back.data) == b"payload"


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")
def test_keep_freed_buffers_takes_effect_on_glibc() -> None:
    assert heap.keep_freed_buffers() is True
