"""The sending side of a socket's links: transfers, their checks, their calls on the wire.

An OutgoingTransfer is checked (`check`) before anything goes out, then put on the wire
by a LinkStub as one unary `Deliver` (at most DELIVER_MAX_BYTES of payload) or one
client-streaming `Transfer` (a header, then the payload in CHUNK_BYTES slices). Calls are
gRPC futures: a Pending holds one of them (or the failure that kept the transfer home),
and Sends collects a batch's acknowledgements, so a socket can take its incoming
messages while its own are in flight. A failed call becomes a LinkFailure naming the
link, the status code and a hint (`rpc_failure`).
"""

from __future__ import annotations

import queue
from collections.abc import Iterator
from dataclasses import dataclass

import grpc

from rdurack.errors import InvalidRequest, LinkFailure
from rdurack.node_agent.links import wire
from rdurack.v1 import link_pb2

# Data bytes per stream message (1 MiB). Streaming in chunks bounds the memory each
# in-flight message needs on both ends (one chunk, not the whole tensor, per protobuf
# message) and lets the receiver copy chunk k while chunk k+1 is on the wire. It never
# changes emulated time: the sender computes the arrival from the whole size. 1 MiB
# measured best for a 64 MB transfer between two processes (2 cores, GB/s over runs):
# 256 KiB 0.55-0.74, 512 KiB 0.56-0.77, 1 MiB 0.56-0.84, 2 MiB 0.39-0.60, 4 MiB 0.48-0.66.
CHUNK_BYTES = 1 << 20
# Largest payload sent as one unary Deliver (one chunk, 1 MiB); timing-only transfers
# always go that way, larger payloads stream through Transfer. Unary saves the
# request-iterator thread a client stream costs per call and the stream's extra
# messages. With the wire module's encoders (one copy of the payload per message) a
# unary message of up to a chunk costs less than the same bytes as header + chunk on a
# stream (separate processes, 2 cores under load, µs per call wall / sender CPU /
# receiver CPU, medians of 3 x 100 calls): 128 KiB unary 808/286/464 vs stream
# 1696/620/634; 1 MiB 1801/922/760 vs 2606/866/1065. A ring all-reduce of 16 MB over 16
# sockets moves 1 MB per transfer, so it takes this path.
DELIVER_MAX_BYTES = CHUNK_BYTES
# Largest collective_step the header's uint32 field holds.
_MAX_STEP = (1 << 32) - 1
# Largest value the header's uint64 fields (bytes, ns) hold.
_MAX_U64 = (1 << 64) - 1


@dataclass(frozen=True, slots=True)
class OutgoingTransfer:
    """One transfer for `LinkEndpoint.start_all`; the fields are `send`'s arguments."""

    dst: str  # receiving socket id
    tag: str  # collective tag; "" for point-to-point
    step: int  # step within the collective (uint32)
    send_ns: int  # sender's emulated clock at issue, ns
    arrival_ns: int  # emulated arrival from the sender's link model, ns
    nbytes: int  # size the link model charged, bytes; equals the payload's size if any
    payload: bytes | memoryview | None = None  # None: timing mode, nothing travels
    dtype: str = ""  # numpy dtype name of the payload
    shape: tuple[int, ...] = ()  # elements per dimension of the payload

    def header(self, transfer_id: str, src: str, timing_only: bool) -> link_pb2.TransferHeader:
        """Its header on the wire, as socket `src` sends it under `transfer_id`."""
        return link_pb2.TransferHeader(
            transfer_id=transfer_id,
            src_socket_id=src,
            dst_socket_id=self.dst,
            total_bytes=self.nbytes,
            emulated_send_ns=self.send_ns,
            collective_tag=self.tag,
            collective_step=self.step,
            dtype=self.dtype,
            shape=self.shape,
            timing_only=timing_only,
            emulated_arrival_ns=self.arrival_ns,
        )


def check(socket_id: str, t: OutgoingTransfer) -> memoryview | None:
    """Validate a transfer's arguments (InvalidRequest); its payload as flat bytes, or
    None in timing mode."""
    where = f"{socket_id} -> {t.dst}"
    if not t.dst:
        raise InvalidRequest(f"{socket_id}: a transfer needs a destination socket id")
    if not 0 <= t.step <= _MAX_STEP:
        raise InvalidRequest(f"{where}: step must be in 0..{_MAX_STEP}, got {t.step}")
    for name, value in (("send_ns", t.send_ns), ("arrival_ns", t.arrival_ns)):
        if not 0 <= value <= _MAX_U64:
            raise InvalidRequest(f"{where}: {name} must be a uint64 (ns), got {value}")
    if t.arrival_ns < t.send_ns:
        raise InvalidRequest(f"{where}: arrival_ns {t.arrival_ns} is before send_ns {t.send_ns}")
    if not 0 <= t.nbytes <= _MAX_U64:
        raise InvalidRequest(f"{where}: nbytes must be >= 0, got {t.nbytes}")
    if any(d < 0 for d in t.shape):
        raise InvalidRequest(f"{where}: shape {t.shape} has a negative dimension")
    if t.payload is None:
        return None
    view = memoryview(t.payload)
    if not view.c_contiguous:
        raise InvalidRequest(f"{where}: payload must be C-contiguous")
    # Flat bytes without copying, whatever the exporter's format (e.g. float32).
    flat = view.cast("B") if view.ndim != 1 or view.format != "B" else view
    if flat.nbytes != t.nbytes:
        raise InvalidRequest(
            f"{where}: payload is {flat.nbytes:,} bytes but nbytes says {t.nbytes:,}"
        )
    return flat


def check_timeout(socket_id: str, timeout_s: float) -> None:
    if not timeout_s > 0:  # also refuses NaN
        raise InvalidRequest(f"{socket_id}: timeout_s must be > 0, got {timeout_s}")


def streams(data: memoryview | None) -> bool:
    """Whether a payload goes as a Transfer stream (read from the caller's buffer until
    acknowledged) rather than one Deliver message."""
    return data is not None and len(data) > DELIVER_MAX_BYTES


class LinkStub:
    """LinkService's calls on one channel, with requests encoded by the wire module
    (already bytes: no serializer) and the generated classes for everything small."""

    def __init__(self, channel: grpc.Channel) -> None:
        self.transfer: grpc.StreamUnaryMultiCallable[bytes, link_pb2.TransferAck]
        self.transfer = channel.stream_unary(
            f"/{wire.SERVICE}/Transfer", response_deserializer=link_pb2.TransferAck.FromString
        )
        self.deliver: grpc.UnaryUnaryMultiCallable[bytes, link_pb2.TransferAck]
        self.deliver = channel.unary_unary(
            f"/{wire.SERVICE}/Deliver", response_deserializer=link_pb2.TransferAck.FromString
        )
        self.ping = channel.unary_unary(
            f"/{wire.SERVICE}/Ping",
            request_serializer=link_pb2.PingRequest.SerializeToString,
            response_deserializer=link_pb2.PingResponse.FromString,
        )

    def start(
        self, header: link_pb2.TransferHeader, data: memoryview | None, timeout_s: float
    ) -> grpc.Future[link_pb2.TransferAck]:
        """Put one transfer on the wire (`streams` says which call); its future."""
        if data is not None and streams(data):
            return self.transfer.future(_chunks(header, data), timeout=timeout_s)
        # One message, encoded (payload copied) now: the unary call, no request-iterator
        # thread (link.proto).
        return self.deliver.future(wire.encode_delivery(header, data), timeout=timeout_s)


class LinkStream:
    """Several transfers to one peer on one Transfer call, in turn, each copied into its
    messages when it is put (the caller may change its buffer at once): one of at most a
    chunk whole in one message, a larger one a header and then its data in chunks. A
    collective's steps to one peer share a stream: as a unary Deliver each, every step
    paid a call's setup on both ends (the client's future and the channel's thread, the
    server's dispatch): a 16-socket ring all-reduce of 16 MB cost the sockets 1.78-1.96 s
    of CPU, on streams 1.46-1.63 s (docs/data-plane.md). As a header and a data chunk,
    each of its 1 MiB transfers cost both ends a second message."""

    def __init__(self, stub: LinkStub, timeout_s: float) -> None:
        self._queue: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
        # gRPC's thread for this call takes the chunks from the queue as they come.
        self.call = stub.transfer.future(iter(self._queue.get, None), timeout=timeout_s)

    def put(self, header: link_pb2.TransferHeader, data: memoryview | None) -> None:
        if data is None or len(data) <= CHUNK_BYTES:
            self._queue.put(wire.encode_whole_chunk(header, data))
            return
        for message in _chunks(header, data):
            self._queue.put(message)

    def close(self) -> None:
        """No more transfers: the call ends once the peer has the last one."""
        self._queue.put(None)


def open_channel(
    address: str,
    credentials: grpc.ChannelCredentials | None,
    options: list[tuple[str, int | str]],
) -> grpc.Channel:
    """A channel to a peer's link server: plaintext without `credentials`."""
    if credentials is None:
        return grpc.insecure_channel(address, options=options)
    return grpc.secure_channel(address, credentials, options=options)


class Pending:
    """One transfer on the wire: its gRPC future, or the failure that kept it home."""

    def __init__(
        self,
        call: grpc.Future[link_pb2.TransferAck] | None,
        what: str,  # "src -> dst: transfer 'tag' step n", for messages
        label: str,  # "dst step n", for a list of failures
        address: str,  # the peer's link address
        timeout_s: float,
        streamed: bool = False,  # reads the caller's buffer until acknowledged
        failure: LinkFailure | None = None,
    ) -> None:
        self.call, self.what, self.label, self.address = call, what, label, address
        self.timeout_s, self.streamed = timeout_s, streamed
        self._failure = failure

    def done(self) -> bool:
        return self.call is None or self.call.done()

    def failure(self) -> LinkFailure | None:
        """Its failure once it has ended (None: acknowledged, or still on the wire)."""
        if self._failure is None and self.call is not None and self.call.done():
            try:
                self.call.result()
            except grpc.RpcError as e:
                dst = self.label.split(" ", 1)[0]
                self._failure = LinkFailure(
                    rpc_failure(self.what, e, dst, self.address, self.timeout_s)
                )
            except grpc.FutureCancelledError:
                self._failure = LinkFailure(f"{self.what} failed: cancelled")
        return self._failure

    def result(self) -> int:
        """Wait for the acknowledgement; the payload bytes the receiver got."""
        if self.call is not None:
            try:
                ack = self.call.result()
            except (grpc.RpcError, grpc.FutureCancelledError):
                pass
            else:
                return int(ack.bytes_received)
        failure = self.failure()
        assert failure is not None
        raise failure


class Sends:
    """Transfers put on the wire by `LinkEndpoint.start_all`, in their order."""

    def __init__(self, pending: list[Pending]) -> None:
        self._pending = pending

    @property
    def reads_payload(self) -> bool:
        """Whether a streamed payload is still being read from the caller's buffer."""
        return any(p.streamed and not p.done() for p in self._pending)

    def failure(self) -> LinkFailure | None:
        """The first failure among the transfers that have ended; never waits."""
        for p in self._pending:
            if p.done() and (failure := p.failure()) is not None:
                return failure
        return None

    def wait(self) -> list[int]:
        """Wait for every transfer; their received byte counts, in order. Raises the
        first failure (in order), naming the others that failed too."""
        results: list[int] = []
        failed: list[tuple[Pending, LinkFailure]] = []
        for p in self._pending:
            try:
                results.append(p.result())
            except LinkFailure as e:
                failed.append((p, e))
        if not failed:
            return results
        first = failed[0][1]
        if len(failed) == 1:
            raise first
        others = ", ".join(p.label for p, _ in failed[1:])
        raise LinkFailure(f"{first} (also failed: {others})") from first

    def cancel(self) -> None:
        """Cancel what is still on the wire (after the caller gave up on the collective)."""
        for p in self._pending:
            if p.call is not None:
                p.call.cancel()


def _chunks(header: link_pb2.TransferHeader, data: memoryview) -> Iterator[bytes]:
    """The request stream, encoded: the header, then the payload in CHUNK_BYTES slices.

    Slicing the memoryview copies nothing; each chunk's encoding copies its slice once
    (1 MiB at a time), never the whole payload up front."""
    yield wire.encode_header_chunk(header)
    for offset in range(0, len(data), CHUNK_BYTES):
        yield wire.encode_data_chunk(data[offset : offset + CHUNK_BYTES])


def rpc_failure(what: str, e: grpc.RpcError, dst: str, address: str, timeout_s: float) -> str:
    """A one-line cause for a failed link call, with the status code name."""
    code = e.code() if isinstance(e, grpc.Call) else None
    details = e.details() if isinstance(e, grpc.Call) else str(e)
    name = code.name if code is not None else "RPC error"
    if code == grpc.StatusCode.UNAVAILABLE:
        hint = f"; is {dst}'s link server at {address} running?"
    elif code == grpc.StatusCode.DEADLINE_EXCEEDED:
        hint = f"; no acknowledgement within {timeout_s} s"
    else:
        hint = ""
    return f"{what} failed: {name}: {details}{hint}"
