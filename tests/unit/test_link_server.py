"""The link server and mailbox: real gRPC endpoints on 127.0.0.1 in one process."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Any, cast

import grpc  # type: ignore[import-untyped, unused-ignore]
import numpy as np
import pytest

from rdurack.errors import InvalidRequest, LinkFailure
from rdurack.node_agent.links import endpoint as endpoint_module
from rdurack.node_agent.links.endpoint import LinkEndpoint
from rdurack.node_agent.links.mailbox import Mailbox, Message, Parts
from rdurack.node_agent.links.sending import (
    CHUNK_BYTES,
    DELIVER_MAX_BYTES,
    LinkStream,
    OutgoingTransfer,
)
from rdurack.v1 import link_pb2, link_pb2_grpc

A, B, C = "rdu-n0-s0", "rdu-n0-s1", "rdu-n1-s0"


@pytest.fixture
def trio() -> Iterator[tuple[LinkEndpoint, LinkEndpoint, LinkEndpoint]]:
    """Three connected endpoints; B's clock reads 1234 ns."""
    eps = (
        LinkEndpoint(A),
        LinkEndpoint(B, clock_ns=lambda: 1234),
        LinkEndpoint(C),
    )
    try:
        addresses = {e.socket_id: e.address for e in eps}
        for e in eps:
            e.connect({p: a for p, a in addresses.items() if p != e.socket_id})
        yield eps
    finally:
        for e in eps:
            e.close()


@contextmanager
def _raw_stub(
    endpoint: LinkEndpoint,
) -> Iterator[link_pb2_grpc.LinkServiceStub]:
    with grpc.insecure_channel(endpoint.address) as channel:
        yield link_pb2_grpc.LinkServiceStub(channel)


# ---------------------------------------------------------------------- transfers


def test_functional_payload_arrives_intact_in_chunks(trio: tuple[LinkEndpoint, ...]) -> None:
    a, b, _ = trio
    array = np.arange(5 * (1 << 20) // 4, dtype=np.float32).reshape(1280, 1024)  # 5 MiB
    assert array.nbytes > 4 * CHUNK_BYTES  # several chunks, above gRPC's 4 MB default
    got = a.send(
        B, "ar-1", 3, send_ns=100, arrival_ns=5_000, nbytes=array.nbytes,
        payload=array.data, dtype=str(array.dtype), shape=array.shape,
    )  # fmt: skip
    assert got == array.nbytes
    msg = b.receive("ar-1", 3, A, timeout_s=1.0)
    assert (msg.src, msg.tag, msg.step) == (A, "ar-1", 3)
    assert (msg.arrival_ns, msg.nbytes, msg.dtype, msg.shape) == (
        5_000, array.nbytes, "float32", (1280, 1024),
    )  # fmt: skip
    payload = msg.payload(1.0)
    assert payload is not None
    back = np.frombuffer(payload, dtype=msg.dtype).reshape(msg.shape)
    np.testing.assert_array_equal(back, array)
    assert b.mailbox.pending() == 0


@pytest.mark.parametrize("nbytes", [1, DELIVER_MAX_BYTES, DELIVER_MAX_BYTES + 1])
def test_payload_arrives_intact_either_side_of_the_unary_cut(
    trio: tuple[LinkEndpoint, ...], nbytes: int
) -> None:
    """Up to DELIVER_MAX_BYTES a payload goes as one unary Deliver, above it streams."""
    a, b, _ = trio
    data = np.random.default_rng(nbytes).integers(0, 256, nbytes, dtype=np.uint8)
    got = a.send(B, "cut", 0, 0, 1, nbytes, data.data, "uint8", (nbytes,))
    assert got == nbytes
    msg = b.receive("cut", 0, A, timeout_s=1.0)
    payload = msg.payload(1.0)
    assert payload is not None and len(payload) == nbytes
    np.testing.assert_array_equal(np.frombuffer(payload, dtype=np.uint8), data)


def test_timing_only_transfer_carries_no_payload(trio: tuple[LinkEndpoint, ...]) -> None:
    a, b, _ = trio
    got = a.send(B, "t", 0, send_ns=0, arrival_ns=10**9, nbytes=10**9, payload=None)
    assert got == 0
    msg = b.receive("t", 0, A, timeout_s=1.0)
    assert msg.nbytes == 10**9
    assert msg.payload(1.0) is None
    assert msg.arrival_ns == 10**9


def test_send_all_delivers_to_two_peers_concurrently(trio: tuple[LinkEndpoint, ...]) -> None:
    a, b, c = trio
    sends = [
        OutgoingTransfer(B, "bc", 1, 0, 10, 8, b"\x01" * 8, "uint8", (8,)),
        OutgoingTransfer(C, "bc", 1, 0, 20, 0, None),
    ]
    assert a.send_all(sends, timeout_s=2.0) == [8, 0]
    assert b.receive("bc", 1, A, 1.0).payload(1.0) == b"\x01" * 8
    assert c.receive("bc", 1, A, 1.0).arrival_ns == 20


def test_send_all_checks_every_argument_before_sending(trio: tuple[LinkEndpoint, ...]) -> None:
    a, b, _ = trio
    sends = [
        OutgoingTransfer(B, "x", 0, 0, 1, 4, b"abcd"),
        OutgoingTransfer(C, "x", 0, 0, 1, 5, b"abcd"),  # payload size disagrees
    ]
    with pytest.raises(InvalidRequest, match="4 bytes but nbytes says 5"):
        a.send_all(sends)
    assert b.mailbox.pending() == 0


def test_receive_times_out_naming_both_ends(trio: tuple[LinkEndpoint, ...]) -> None:
    _, b, _ = trio
    t0 = time.monotonic()
    with pytest.raises(LinkFailure) as info:
        b.receive("ar-7", 4, A, timeout_s=0.2)
    assert 0.15 < time.monotonic() - t0 < 1.0
    text = str(info.value)
    for part in (B, A, "'ar-7'", "step 4", "0.2 s"):
        assert part in text


# ---------------------------------------------------------------------- faults


def test_link_down_fails_at_once_and_recovers(trio: tuple[LinkEndpoint, ...]) -> None:
    a, b, _ = trio
    a.set_link_down(B)
    assert a.link_down(B)
    t0 = time.monotonic()
    with pytest.raises(LinkFailure, match=r"link is down") as info:
        a.send(B, "d", 0, 0, 1, 0, None)
    assert time.monotonic() - t0 < 0.1
    assert A in str(info.value) and B in str(info.value)
    with pytest.raises(LinkFailure, match=r"link is down"):
        a.ping(B)
    time.sleep(0.05)
    assert b.mailbox.pending() == 0
    a.set_link_down(B, down=False)
    assert not a.link_down(B)
    assert a.send(B, "d", 0, 0, 1, 3, b"abc") == 3
    assert b.receive("d", 0, A, 1.0).payload(1.0) == b"abc"


def test_send_to_closed_peer_is_a_link_failure(trio: tuple[LinkEndpoint, ...]) -> None:
    a, b, _ = trio
    assert a.send(B, "c", 0, 0, 1, 1, b"x") == 1  # the channel is open and used
    b.close()
    b.close()  # idempotent
    t0 = time.monotonic()
    with pytest.raises(LinkFailure) as info:
        a.send(B, "c", 1, 0, 1, 1, b"x", timeout_s=2)
    assert time.monotonic() - t0 < 2.5
    assert not isinstance(info.value, grpc.RpcError)
    text = str(info.value)
    assert A in text and B in text
    assert "UNAVAILABLE" in text or "DEADLINE_EXCEEDED" in text


def test_send_all_raises_after_all_finished(trio: tuple[LinkEndpoint, ...]) -> None:
    a, _, c = trio
    a.set_link_down(B)
    sends = [OutgoingTransfer(B, "f", 0, 0, 1, 0, None), OutgoingTransfer(C, "f", 0, 0, 1, 0, None)]
    with pytest.raises(LinkFailure, match=B):
        a.send_all(sends)
    assert c.receive("f", 0, A, 1.0).nbytes == 0  # the healthy link still delivered


def test_unknown_peer_lists_known_peers(trio: tuple[LinkEndpoint, ...]) -> None:
    a, _, _ = trio
    with pytest.raises(LinkFailure, match=r"not a connected peer") as info:
        a.send("rdu-n1-s7", "u", 0, 0, 1, 0, None)
    assert f"known peers: {B}, {C}" in str(info.value)


def test_bad_arguments_are_invalid_requests(trio: tuple[LinkEndpoint, ...]) -> None:
    a, _, _ = trio
    with pytest.raises(InvalidRequest, match="before send_ns"):
        a.send(B, "x", 0, send_ns=10, arrival_ns=5, nbytes=0, payload=None)
    with pytest.raises(InvalidRequest, match="step"):
        a.send(B, "x", -1, 0, 1, 0, None)
    with pytest.raises(InvalidRequest, match="timeout_s"):
        a.send(B, "x", 0, 0, 1, 0, None, timeout_s=0)


def test_link_servers_bind_the_first_free_ports_of_a_range() -> None:
    """A firewall between hosts admits a range (`--link-ports`): each endpoint takes the
    first free port of it, and once none is left says so, naming the range."""
    blocker = LinkEndpoint(C)  # a port taken: the range starts there
    taken = int(blocker.address.rsplit(":", 1)[1])
    ports = range(taken, taken + 4)
    endpoints: list[LinkEndpoint] = []
    try:
        with pytest.raises(LinkFailure, match=f"127.0.0.1:{taken}-{taken + 3}.*every port taken"):
            for i in range(len(ports) + 1):
                endpoints.append(LinkEndpoint(f"rdu-n1-s{i + 1}", port=ports))
        bound = [int(e.address.rsplit(":", 1)[1]) for e in endpoints]
        # Not the blocker's; every one in the range, each its own (other processes may
        # hold some of the range's ports, so not necessarily all three others).
        assert bound and all(p in ports and p != taken for p in bound)
        assert len(set(bound)) == len(bound)
    finally:
        for e in [blocker, *endpoints]:
            e.close()


@pytest.mark.parametrize("bad", [range(0), range(65535, 65537), range(-1, 3)])
def test_an_empty_or_impossible_range_is_an_invalid_request(bad: range) -> None:
    with pytest.raises(InvalidRequest, match=r"port must be in 0\.\.65535"):
        LinkEndpoint(A, port=bad)


# ---------------------------------------------------------------------- wire contract


def test_stream_without_header_is_invalid_argument(trio: tuple[LinkEndpoint, ...]) -> None:
    _, b, _ = trio
    with _raw_stub(b) as stub:
        with pytest.raises(grpc.RpcError) as info:
            stub.Transfer(iter([link_pb2.TransferChunk(data=b"abc")]), timeout=2)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "header" in str(info.value.details())


def test_header_for_another_socket_is_invalid_argument(trio: tuple[LinkEndpoint, ...]) -> None:
    _, b, _ = trio
    header = link_pb2.TransferHeader(
        transfer_id="t-1", src_socket_id=A, dst_socket_id=C, total_bytes=0, timing_only=True
    )
    with _raw_stub(b) as stub:
        with pytest.raises(grpc.RpcError) as info:
            stub.Transfer(iter([link_pb2.TransferChunk(header=header)]), timeout=2)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        details = str(info.value.details())
        assert B in details and C in details
    assert b.mailbox.pending() == 0


def test_more_bytes_than_declared_is_invalid_argument(trio: tuple[LinkEndpoint, ...]) -> None:
    _, b, _ = trio
    header = link_pb2.TransferHeader(
        transfer_id="t-2", src_socket_id=A, dst_socket_id=B, total_bytes=2
    )
    chunks = [link_pb2.TransferChunk(header=header), link_pb2.TransferChunk(data=b"abc")]
    with _raw_stub(b) as stub:
        with pytest.raises(grpc.RpcError) as info:
            stub.Transfer(iter(chunks), timeout=2)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    # The socket had the transfer at its header; reading it says why it failed.
    with pytest.raises(LinkFailure, match="carries more than the 2 bytes"):
        b.receive("", 0, A, timeout_s=1).payload(1.0)


def test_a_stream_that_breaks_off_fails_the_socket_reading_it(
    trio: tuple[LinkEndpoint, ...],
) -> None:
    """The sender gives up mid-transfer (its call cancelled): the receiving socket,
    already reading, fails at once instead of waiting out its timeout."""
    _, b, _ = trio
    more = threading.Event()

    def chunks() -> Iterator[link_pb2.TransferChunk]:
        yield _header("cut-0", 0, 4)
        yield link_pb2.TransferChunk(data=b"ab")
        more.wait(timeout=10)  # never set: the call is cancelled while it waits

    with _raw_stub(b) as stub:
        call = stub.Transfer.future(chunks(), timeout=20)
        msg = b.receive("s", 0, A, timeout_s=10)
        assert msg.parts is not None
        pieces = msg.parts.read(timeout_s=30)
        assert bytes(next(pieces)) == b"ab"
        started = time.monotonic()
        call.cancel()
        # gRPC ends the server's request stream on a cancel, or breaks it: either way
        # the reader is told, with the transfer and where it stopped.
        stopped = r"transfer cut-0 from rdu-n0-s0 (broke off after 2 of 4 bytes|carried 2 bytes)"
        with pytest.raises(LinkFailure, match=stopped):
            next(pieces)
        assert time.monotonic() - started < 10  # the failure, not the 30 s timeout
        more.set()


def test_duplicate_transfer_id_is_already_exists(trio: tuple[LinkEndpoint, ...]) -> None:
    _, b, _ = trio
    header = link_pb2.TransferHeader(
        transfer_id="t-3", src_socket_id=A, dst_socket_id=B, timing_only=True
    )
    with _raw_stub(b) as stub:
        stub.Transfer(iter([link_pb2.TransferChunk(header=header)]), timeout=2)
        with pytest.raises(grpc.RpcError) as info:
            stub.Transfer(iter([link_pb2.TransferChunk(header=header)]), timeout=2)
        assert info.value.code() == grpc.StatusCode.ALREADY_EXISTS
    assert b.mailbox.pending() == 1


_DELIVERY_IDS = itertools.count()


def _delivery(dst: str, data: bytes, total: int, timing_only: bool = False) -> link_pb2.Delivery:
    header = link_pb2.TransferHeader(
        transfer_id=f"d-{next(_DELIVERY_IDS)}",
        src_socket_id=A,
        dst_socket_id=dst,
        total_bytes=total,
        collective_tag="u",
        timing_only=timing_only,
    )
    return link_pb2.Delivery(header=header, data=data)


def test_deliver_checks_like_transfer(trio: tuple[LinkEndpoint, ...]) -> None:
    _, b, _ = trio
    invalid = grpc.StatusCode.INVALID_ARGUMENT
    with _raw_stub(b) as stub:
        for request, code, words in [
            (_delivery(C, b"", 0, timing_only=True), invalid, (B, C)),  # another socket
            (_delivery(B, b"abc", 2), invalid, ("more than",)),  # more than declared
            (_delivery(B, b"a", 2), invalid, ("carried 1",)),  # fewer than declared
            (_delivery(B, b"a", 1, timing_only=True), invalid, ("timing-only",)),
        ]:
            with pytest.raises(grpc.RpcError) as info:
                stub.Deliver(request, timeout=2)
            assert info.value.code() == code
            assert all(w in str(info.value.details()) for w in words)
    assert b.mailbox.pending() == 0


def test_deliver_and_transfer_share_the_duplicate_check(
    trio: tuple[LinkEndpoint, ...],
) -> None:
    _, b, _ = trio
    request = _delivery(B, b"ab", 2)
    with _raw_stub(b) as stub:
        ack = stub.Deliver(request, timeout=2)
        assert (ack.receiver_socket_id, ack.bytes_received) == (B, 2)
        with pytest.raises(grpc.RpcError) as info:  # the same id again, streamed
            stub.Transfer(iter([link_pb2.TransferChunk(header=request.header)]), timeout=2)
        assert info.value.code() == grpc.StatusCode.ALREADY_EXISTS
    assert b.receive("u", 0, A, 1.0).payload(1.0) == b"ab"


def test_ping_returns_peer_id_and_clock(trio: tuple[LinkEndpoint, ...]) -> None:
    a, _, _ = trio
    assert a.ping(B) == (B, 1234)
    assert a.ping(C) == (C, 0)


def test_explicit_port_taken_is_a_link_failure(trio: tuple[LinkEndpoint, ...]) -> None:
    a, _, _ = trio
    port = int(a.address.rsplit(":", 1)[1])
    with pytest.raises(LinkFailure, match=f"127.0.0.1:{port}"):
        LinkEndpoint("rdu-n1-s1", port=port)


# ---------------------------------------------------------------------- mailbox


def _msg(src: str = A, tag: str = "t", step: int = 0) -> Message:
    return Message(src, tag, step, arrival_ns=1, nbytes=0, parts=None, dtype="", shape=())


def test_mailbox_refuses_a_duplicate_key() -> None:
    box = Mailbox(B)
    box.put(_msg())
    with pytest.raises(LinkFailure, match="duplicate"):
        box.put(_msg())
    box.put(_msg(step=1))  # another step is another key
    box.put(_msg(src=C))  # another sender is another key
    assert box.pending() == 3


def test_mailbox_discard_drops_one_tag() -> None:
    box = Mailbox(B)
    for step in range(3):
        box.put(_msg(tag="failed", step=step))
    box.put(_msg(tag="kept"))
    assert box.discard("failed") == 3
    assert box.pending() == 1
    assert box.take("kept", 0, A, 0.1).tag == "kept"
    with pytest.raises(LinkFailure):
        box.take("failed", 0, A, 0.01)


def test_mailbox_take_is_independent_of_arrival_order() -> None:
    box = Mailbox(B)
    for step in (2, 0, 1):
        box.put(_msg(step=step))
    assert [box.take("t", s, A, 0.1).step for s in (0, 1, 2)] == [0, 1, 2]
    assert box.pending() == 0


def test_mailbox_take_wakes_when_the_message_arrives() -> None:
    box = Mailbox(B)
    timer = threading.Timer(0.05, box.put, args=(_msg(step=5),))
    timer.start()
    try:
        box.put(_msg(step=4))  # a different key must not end the wait
        assert box.take("t", 5, A, timeout_s=2.0).step == 5
    finally:
        timer.cancel()
    assert box.take("t", 4, A, 0.1).step == 4


def test_mailbox_abort_fails_waits_until_reset() -> None:
    box = Mailbox("rdu-n0-s0")
    box.abort("rdu-n0-s1 died")
    with pytest.raises(LinkFailure, match=r"stopped waiting for rdu-n0-s1.*rdu-n0-s1 died"):
        box.take("t", 0, "rdu-n0-s1", timeout_s=30)
    box.reset()
    box.put(Message("rdu-n0-s1", "t", 0, 1, 0, None, "", ()))
    assert box.take("t", 0, "rdu-n0-s1", timeout_s=1).arrival_ns == 1


def test_parts_are_read_as_they_arrive_and_end_with_the_last() -> None:
    parts = Parts(complete=False)
    parts.add(b"ab")
    pieces = parts.read(timeout_s=10)
    assert next(pieces) == b"ab"  # before the rest is in

    def rest() -> None:
        parts.add(b"cd")
        parts.finish()

    threading.Timer(0.05, rest).start()
    assert list(pieces) == [b"cd"]  # waits for it, then ends
    assert parts.join(1.0) == b"abcd"  # read again, whole


def test_parts_reading_fails_with_the_transfer_or_after_a_silence() -> None:
    parts = Parts(complete=False)
    parts.add(b"ab")
    parts.fail("the stream broke")
    with pytest.raises(LinkFailure, match="the stream broke"):
        list(parts.read(timeout_s=10))
    silent = Parts(complete=False)
    with pytest.raises(LinkFailure, match=r"nothing more within 0.05 s after 0 chunks"):
        list(silent.read(timeout_s=0.05))


@pytest.mark.parametrize("cuts", [(0, 16, 40), (0, 6, 40), (0, 6, 7, 9, 40), (0, 1, 2, 3, 40)])
def test_parts_read_in_whole_elements_however_they_were_cut(cuts: tuple[int, ...]) -> None:
    """A foreign sender may cut inside an element: the element's bytes are joined."""
    raw = np.arange(10, dtype=np.float32).tobytes()
    parts = Parts(raw[lo:hi] for lo, hi in itertools.pairwise(cuts))
    pieces = [bytes(p) for p in parts.read(timeout_s=1, multiple=4)]
    assert all(len(p) % 4 == 0 and p for p in pieces)
    assert b"".join(pieces) == raw


def test_streamed_payload_is_kept_in_the_chunks_it_came_in(
    trio: tuple[LinkEndpoint, ...],
) -> None:
    """No copy into one buffer on receipt: the consumer gets the chunks, in order."""
    a, b, _ = trio
    data = np.arange(3 * CHUNK_BYTES // 4 + 5, dtype=np.float32)
    a.send(B, "parts", 0, 0, 1, data.nbytes, data.data, dtype="float32")
    msg = b.receive("parts", 0, A, 2.0)
    assert msg.parts is not None and [len(p) for p in msg.parts.read(2.0)] == [
        CHUNK_BYTES,
        CHUNK_BYTES,
        CHUNK_BYTES,
        20,
    ]
    assert msg.payload(1.0) == data.tobytes()  # joined on demand


def test_start_all_copies_a_unary_payload_before_it_returns(
    trio: tuple[LinkEndpoint, ...],
) -> None:
    """The caller may change its buffer as soon as start_all returns (one chunk or less)."""
    a, b, _ = trio
    buffer = bytearray(b"before!!")
    sends = a.start_all([OutgoingTransfer(B, "copy", 0, 0, 1, 8, memoryview(buffer))])
    assert not sends.reads_payload
    buffer[:] = b"changed!"
    assert sends.wait() == [8]
    assert b.receive("copy", 0, A, 2.0).payload(1.0) == b"before!!"


def test_a_streamed_payload_is_read_until_acknowledged(trio: tuple[LinkEndpoint, ...]) -> None:
    a, b, _ = trio
    data = np.ones(2 * CHUNK_BYTES, dtype=np.uint8)
    sends = a.start_all([OutgoingTransfer(B, "big", 0, 0, 1, data.nbytes, data.data)])
    assert sends.wait() == [data.nbytes]
    assert not sends.reads_payload  # acknowledged: the buffer is the caller's again
    assert b.receive("big", 0, A, 2.0).nbytes == data.nbytes


def test_a_failed_send_ends_the_wait_for_a_reply(trio: tuple[LinkEndpoint, ...]) -> None:
    """A socket waiting for its peer's message gives up as soon as its own send to a dead
    peer fails, rather than after the whole receive timeout."""
    a, b, _ = trio
    b.close()
    sends = a.start_all([OutgoingTransfer(B, "gone", 0, 0, 1, 1, b"x")], timeout_s=20.0)
    t0 = time.monotonic()
    with pytest.raises(LinkFailure, match=B):
        a.receive("gone", 0, B, timeout_s=20.0, give_up=sends.failure)
    assert time.monotonic() - t0 < 10.0  # woken by the failure, not timed out
    with pytest.raises(LinkFailure):
        sends.wait()


def test_mailbox_take_raises_what_give_up_returns() -> None:
    box = Mailbox(B)
    with pytest.raises(LinkFailure, match="peer gone"):
        box.take("t", 0, A, 5.0, give_up=lambda: LinkFailure("peer gone"))
    box.put(_msg())
    assert box.take("t", 0, A, 1.0, give_up=lambda: None).step == 0


# ---------------------------------------------------------------------- several on a stream


def _header(
    transfer_id: str, step: int, total: int, timing_only: bool = False
) -> link_pb2.TransferChunk:
    return link_pb2.TransferChunk(
        header=link_pb2.TransferHeader(
            transfer_id=transfer_id, src_socket_id=A, dst_socket_id=B, total_bytes=total,
            collective_tag="s", collective_step=step, timing_only=timing_only,
        )
    )  # fmt: skip


def test_a_stream_carries_several_transfers_each_handed_over_at_its_header(
    trio: tuple[LinkEndpoint, ...],
) -> None:
    _, b, _ = trio
    taken = threading.Event()

    def chunks() -> Iterator[link_pb2.TransferChunk]:
        yield _header("m-0", 0, 3)
        yield link_pb2.TransferChunk(data=b"ab")
        # The rest waits until the socket has the first transfer: it reads the chunks
        # while the others are on the wire, not after the last one.
        taken.wait(timeout=10)
        yield link_pb2.TransferChunk(data=b"c")
        yield _header("m-1", 1, 0, timing_only=True)
        yield _header("m-2", 2, 2)
        yield link_pb2.TransferChunk(data=b"de")

    with _raw_stub(b) as stub:
        ack = stub.Transfer.future(chunks(), timeout=20)
        first = b.receive("s", 0, A, timeout_s=10)
        assert first.parts is not None
        pieces = first.parts.read(timeout_s=10)
        assert bytes(next(pieces)) == b"ab"  # in before the stream goes on
        taken.set()
        assert [bytes(p) for p in pieces] == [b"c"]
        assert ack.result().bytes_received == 5  # every data byte of the stream
    assert b.receive("s", 1, A, timeout_s=1).parts is None  # timing-only
    assert b.receive("s", 2, A, timeout_s=1).payload(1.0) == b"de"


def _whole(transfer_id: str, step: int, data: bytes | None) -> link_pb2.TransferChunk:
    """A whole transfer in one chunk (None: timing-only)."""
    header = _header(transfer_id, step, len(data or b""), timing_only=data is None).header
    return link_pb2.TransferChunk(whole=link_pb2.Delivery(header=header, data=data or b""))


def test_a_stream_carries_whole_transfers_among_chunked_ones(
    trio: tuple[LinkEndpoint, ...],
) -> None:
    _, b, _ = trio
    chunks = [
        _whole("w-0", 0, b"abc"),
        _whole("w-1", 1, None),
        _header("w-2", 2, 2),
        link_pb2.TransferChunk(data=b"de"),
        _whole("w-3", 3, b"f"),
    ]
    with _raw_stub(b) as stub:
        assert stub.Transfer(iter(chunks), timeout=10).bytes_received == 6
    assert b.receive("s", 0, A, timeout_s=1).payload(1.0) == b"abc"
    assert b.receive("s", 1, A, timeout_s=1).parts is None  # timing-only
    assert b.receive("s", 2, A, timeout_s=1).payload(1.0) == b"de"
    assert b.receive("s", 3, A, timeout_s=1).payload(1.0) == b"f"


def _whole_of(total: int, data: bytes) -> link_pb2.TransferChunk:
    """A whole chunk whose header declares `total` bytes, carrying `data`."""
    header = _header("x-0", 0, total).header
    return link_pb2.TransferChunk(whole=link_pb2.Delivery(header=header, data=data))


@pytest.mark.parametrize(
    ("chunks", "says"),
    [
        ([_header("h-0", 0, 3), link_pb2.TransferChunk(data=b"ab"), _header("h-1", 1, 0)],
         "a header came before"),
        ([_header("h-0", 0, 0, timing_only=True), link_pb2.TransferChunk(data=b"x")],
         "carries data"),
        ([_header("h-0", 0, 2), link_pb2.TransferChunk(data=b"ab"),
          link_pb2.TransferChunk(data=b"c")], "carries more than"),
        ([_whole_of(3, b"ab")], "carried 2 bytes, header.total_bytes declares 3"),
        ([_whole("x-0", 0, b"ab"), link_pb2.TransferChunk(data=b"c")], "carries more than"),
        ([_header("x-0", 0, 3), link_pb2.TransferChunk(data=b"a"), _whole("x-1", 1, b"b")],
         "a header came before"),
        ([link_pb2.TransferChunk(data=b"a"), _whole("x-0", 0, b"b")], "must be a header"),
    ],
    ids=["header-too-early", "data-after-timing-only", "data-beyond-total", "whole-short",
         "data-after-whole", "whole-too-early", "data-first"],
)  # fmt: skip
def test_a_stream_whose_transfers_do_not_add_up_is_invalid_argument(
    trio: tuple[LinkEndpoint, ...], chunks: list[link_pb2.TransferChunk], says: str
) -> None:
    _, b, _ = trio
    with _raw_stub(b) as stub, pytest.raises(grpc.RpcError) as info:
        stub.Transfer(iter(chunks), timeout=2)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert says in str(info.value.details())


def test_an_outbox_sends_each_peers_transfers_on_one_stream(
    trio: tuple[LinkEndpoint, ...], monkeypatch: pytest.MonkeyPatch
) -> None:
    a, b, c = trio
    opened: list[LinkStream] = []

    class Counted(LinkStream):
        def __init__(self, *args: Any) -> None:
            super().__init__(*args)
            opened.append(self)

    monkeypatch.setattr(endpoint_module, "LinkStream", Counted)
    outbox = a.outbox(timeout_s=10)
    data = np.arange(300_000, dtype=np.float32)  # 1.2 MB: two chunks on the stream
    for step in range(3):
        for dst in (B, C):
            outbox.send(OutgoingTransfer(dst, "o", step, 0, 1, data.nbytes, data.data, "float32"))
    data[:] = -1  # copied when sent: what arrives is what was sent
    outbox.wait()
    assert len(opened) == 2  # one for B, one for C
    for endpoint in (b, c):
        for step in range(3):
            got = endpoint.receive("o", step, A, timeout_s=5)
            payload = got.payload(5.0)
            assert payload is not None and np.frombuffer(payload, np.float32)[-1] == 299_999


def test_a_link_stream_sends_a_transfer_of_up_to_a_chunk_whole() -> None:
    class Transfer:  # the stub's call: keeps the request stream it is given
        requests: Iterator[bytes]

        def future(self, requests: Iterator[bytes], timeout: float) -> None:
            self.requests = requests

    transfer = Transfer()
    stream = LinkStream(cast(Any, SimpleNamespace(transfer=transfer)), 5.0)
    header = link_pb2.TransferHeader(transfer_id="t", src_socket_id=A, dst_socket_id=B)
    stream.put(header, memoryview(bytes(CHUNK_BYTES)))
    stream.put(header, None)  # timing-only
    stream.put(header, memoryview(bytes(CHUNK_BYTES + 1)))
    stream.close()
    sent = [link_pb2.TransferChunk.FromString(m) for m in transfer.requests]
    assert [m.WhichOneof("chunk") for m in sent] == ["whole", "whole", "header", "data", "data"]
    assert len(sent[0].whole.data) == CHUNK_BYTES and sent[1].whole.data == b""


def test_an_outbox_fails_the_sends_after_a_link_goes_down(trio: tuple[LinkEndpoint, ...]) -> None:
    a, b, _ = trio
    outbox = a.outbox(timeout_s=10)
    outbox.send(OutgoingTransfer(B, "d", 0, 0, 1, 0))
    a.set_link_down(B)
    outbox.send(OutgoingTransfer(B, "d", 1, 0, 1, 0))
    failure = outbox.failure()
    assert failure is not None and "link is down" in str(failure)
    with pytest.raises(LinkFailure, match="link is down"):
        outbox.wait()
    assert b.receive("d", 0, A, timeout_s=5).step == 0  # what went before it arrived
