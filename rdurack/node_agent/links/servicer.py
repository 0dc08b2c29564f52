"""The receiving side of a socket's links: its rdurack.v1.LinkService server.

LinkServer binds and runs the gRPC server (its own thread pool, the request guard and,
with TLS, the rack-member check in front). LinkServicer answers on the server's threads:
`Transfer` (a header, then data chunks, or a whole transfer in one chunk; several in
turn) and `Deliver` (one message) pass the same admission (addressed to this socket, a
transfer id not seen recently), the same size check (exactly the bytes the header
declares, none for a timing-only transfer) and are handed alike to the socket through
its thread-safe Mailbox, the data kept as views of what gRPC received (no copy), a
chunked one's as soon as its header is in (the socket reads the chunks while the rest
arrive, mailbox.Parts); `Ping` answers with the socket's emulated clock. Every refusal
is a gRPC status with a message naming the socket (and the transfer, once its header is
read), never UNKNOWN.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from concurrent import futures
from typing import NoReturn

import grpc

from rdurack.errors import LinkFailure
from rdurack.node_agent.links import wire
from rdurack.node_agent.links.mailbox import Mailbox, Message, Parts
from rdurack.security.guard import Bounds, RequestGuard
from rdurack.security.per_method import PerMethod
from rdurack.security.tls import TlsConfig
from rdurack.v1 import link_pb2

# gRPC binds with SO_REUSEPORT by default: a second endpoint on an explicit port that is
# taken would silently share it and receive half of another socket's transfers. Off, the
# bind fails loudly instead.
_SERVER_OPTIONS: tuple[tuple[str, int], ...] = (*wire.SIZE_OPTIONS, ("grpc.so_reuseport", 0))
# Transfer ids remembered per receiver to refuse a duplicate (ALREADY_EXISTS, link.proto).
# Bounded so a long-running socket's memory does not grow; a duplicate only comes from a
# retry, which follows its original within far fewer transfers than this.
_RECENT_TRANSFER_IDS = 4096
# Per-field limits of link requests: ids, tags and dtype names are short; a shape has at
# most 64 dimensions. Data bytes are bounded by MAX_MESSAGE_BYTES alone (not read here:
# reading a bytes field copies it).
_BOUNDS = Bounds(max_chars=256, max_items=64)
# End of a request stream, for `next`'s default.
_END = object()


class LinkServicer:
    """LinkService of one socket; runs on the gRPC server's threads."""

    def __init__(self, socket_id: str, mailbox: Mailbox, clock_ns: Callable[[], int]) -> None:
        """`clock_ns` reads the socket's emulated clock (ns) for Ping."""
        self.socket_id = socket_id
        self._mailbox = mailbox
        self._clock_ns = clock_ns
        # Ids of the transfers received lately, oldest first (server threads share them).
        self._recent_lock = threading.Lock()
        self._recent_ids: OrderedDict[str, None] = OrderedDict()

    def Transfer(  # noqa: N802 (gRPC method name)
        self,
        request_iterator: Iterator[wire.Chunk],
        context: grpc.ServicerContext,
    ) -> link_pb2.TransferAck:
        """One transfer, or several in turn (a collective's messages to this socket on
        one stream): each a header, then its data, or whole in one chunk; each stored as
        soon as its data is all in. The acknowledgement is the last transfer's, with
        every byte received."""
        me = self.socket_id
        invalid = grpc.StatusCode.INVALID_ARGUMENT
        first = next(request_iterator, _END)
        if not isinstance(first, link_pb2.TransferHeader | wire.Delivered):
            got = (
                "an empty stream"
                if first is _END
                else "a data chunk"
                if first
                else "an empty chunk"
            )
            _abort(context, invalid, f"{me}: the first chunk must be a header, got {got}")
        chunk = first
        total_received = 0
        while True:
            if isinstance(chunk, wire.Delivered):
                h = chunk.header
                received = self._deliver(chunk, context)
            else:
                h = chunk
                self._admit(h, context)
                received = self._receive(h, request_iterator, context)
            total_received += received
            following = next((c for c in request_iterator if c), None)  # empty: nothing
            if following is None:
                break
            if not isinstance(following, link_pb2.TransferHeader | wire.Delivered):
                # Data beyond what the header declared: the size check ends the call.
                self._check_size(h, received + len(following), context)
                break
            chunk = following
        return self._ack(h, total_received)

    def Deliver(  # noqa: N802 (gRPC method name)
        self, request: wire.Delivered, context: grpc.ServicerContext
    ) -> link_pb2.TransferAck:
        return self._ack(request.header, self._deliver(request, context))

    def _deliver(self, delivered: wire.Delivered, context: grpc.ServicerContext) -> int:
        """A whole transfer (a Deliver, or a stream's whole chunk) admitted, checked and
        handed over; the bytes received."""
        h = delivered.header
        self._admit(h, context)
        data = delivered.data
        self._check_size(h, len(data), context)
        # The request's bytes are the payload as they came (a view: no copy).
        self._put(h, None if h.timing_only else Parts((data,)), context)
        return len(data)

    def _receive(
        self,
        h: link_pb2.TransferHeader,
        request_iterator: Iterator[wire.Chunk],
        context: grpc.ServicerContext,
    ) -> int:
        """One transfer's data off a Transfer stream (its header read); the bytes
        received. The socket gets the message at once, its data still arriving: the
        chunks are added as gRPC hands them over (views, no copy), and a stream that
        ends short, carries too much or breaks fails what the socket reads."""
        if h.timing_only:
            self._put(h, None, context)
            return 0
        parts = Parts(complete=False)
        self._put(h, parts, context)
        received = 0
        error: str | None = None
        try:
            while received < h.total_bytes:
                chunk = _data(request_iterator, context, self.socket_id)
                if chunk is None or received + len(chunk) > h.total_bytes:
                    error = self._size_error(h, received + (0 if chunk is None else len(chunk)))
                    break
                parts.add(chunk)
                received += len(chunk)
        except BaseException as e:  # the stream broke or was refused: the reader must know
            parts.fail(
                f"{self.socket_id}: transfer {h.transfer_id} from {h.src_socket_id} broke off "
                f"after {received:,} of {h.total_bytes:,} bytes" + (f": {e}" if str(e) else "")
            )
            raise
        if error is not None:
            parts.fail(error)
            _abort(context, grpc.StatusCode.INVALID_ARGUMENT, error)
        parts.finish()
        return received

    def Ping(  # noqa: N802 (gRPC method name)
        self, request: link_pb2.PingRequest, context: grpc.ServicerContext
    ) -> link_pb2.PingResponse:
        me = self.socket_id
        try:
            now_ns = int(self._clock_ns())
        except Exception as e:  # the clock belongs to the socket; report, never UNKNOWN
            _abort(context, grpc.StatusCode.INTERNAL, f"{me}: reading the clock failed: {e!r}")
        return link_pb2.PingResponse(socket_id=me, emulated_clock_ns=now_ns)

    # Shared by Transfer and Deliver: the checks before any data is accepted, the size
    # check after, and the hand-over to the mailbox with its acknowledgement.

    def _admit(self, h: link_pb2.TransferHeader, context: grpc.ServicerContext) -> None:
        """Refuse a transfer for another socket (INVALID_ARGUMENT) or a duplicate
        transfer id (ALREADY_EXISTS); checked before the data is read, so a misrouted
        transfer costs no copy."""
        me = self.socket_id
        if h.dst_socket_id != me:
            _abort(
                context,
                grpc.StatusCode.INVALID_ARGUMENT,
                f"{me}: transfer {h.transfer_id} from {h.src_socket_id} is addressed to "
                f"{h.dst_socket_id!r} (header.dst_socket_id), not to this socket {me}",
            )
        if not self._remember(h.transfer_id):
            _abort(
                context,
                grpc.StatusCode.ALREADY_EXISTS,
                f"{me}: transfer {h.transfer_id} from {h.src_socket_id} was already received",
            )

    def _remember(self, transfer_id: str) -> bool:
        """Record `transfer_id`; False if it was seen recently (a duplicate)."""
        with self._recent_lock:
            if transfer_id in self._recent_ids:
                return False
            self._recent_ids[transfer_id] = None
            if len(self._recent_ids) > _RECENT_TRANSFER_IDS:
                self._recent_ids.popitem(last=False)
            return True

    def _check_size(
        self, h: link_pb2.TransferHeader, received: int, context: grpc.ServicerContext
    ) -> None:
        """INVALID_ARGUMENT unless `received` data bytes are what the header declares."""
        if (error := self._size_error(h, received)) is not None:
            _abort(context, grpc.StatusCode.INVALID_ARGUMENT, error)

    def _size_error(self, h: link_pb2.TransferHeader, received: int) -> str | None:
        """Why `received` data bytes are not what the header declares (none in timing
        mode, exactly total_bytes otherwise); None when they are."""
        where = f"{self.socket_id}: "
        of = f"{h.transfer_id} from {h.src_socket_id}"
        if h.timing_only:
            return f"{where}timing-only transfer {of} carries data" if received else None
        if received == h.total_bytes:
            return None
        if received > h.total_bytes:
            declared = f"the {h.total_bytes:,} bytes its header.total_bytes declares"
            return f"{where}transfer {of} carries more than {declared}"
        return (
            f"{where}transfer {of} carried {received:,} bytes, header.total_bytes declares "
            f"{h.total_bytes:,}"
        )

    def _put(
        self, h: link_pb2.TransferHeader, parts: Parts | None, context: grpc.ServicerContext
    ) -> None:
        """Hand the transfer to the socket through its mailbox (ALREADY_EXISTS for a
        second message with the same tag, step and sender)."""
        message = Message(
            src=h.src_socket_id,
            tag=h.collective_tag,
            step=h.collective_step,
            arrival_ns=h.emulated_arrival_ns,
            nbytes=h.total_bytes,
            parts=parts,
            dtype=h.dtype,
            shape=tuple(h.shape),
        )
        try:
            self._mailbox.put(message)
        except LinkFailure as e:  # the same (tag, step, src) twice: a protocol error
            _abort(context, grpc.StatusCode.ALREADY_EXISTS, str(e))

    def _ack(self, h: link_pb2.TransferHeader, received: int) -> link_pb2.TransferAck:
        """The acknowledgement of the call whose last transfer is `h`, `received` data
        bytes in all."""
        return link_pb2.TransferAck(
            receiver_socket_id=self.socket_id,
            transfer_id=h.transfer_id,
            emulated_arrival_ns=h.emulated_arrival_ns,
            bytes_received=received,
        )


class LinkServer:
    """A running LinkService server for one servicer, on its own thread pool."""

    def __init__(
        self,
        servicer: LinkServicer,
        host: str,
        port: int | range,
        workers: int,
        tls: TlsConfig | None,
        credentials: grpc.ServerCredentials | None,
    ) -> None:
        """Bind `host:port` (0: a free port; a range: its first free port) and start
        serving; LinkFailure if no port can be had. `workers` bounds the concurrent
        incoming transfers (server threads; each streaming transfer holds one for its
        duration). `credentials`: `tls`'s server credentials, read by the caller (None:
        plaintext)."""
        socket_id = servicer.socket_id
        self._pool = futures.ThreadPoolExecutor(
            max_workers=workers, thread_name_prefix=f"{socket_id}-link"
        )
        guards: list[grpc.ServerInterceptor] = [] if tls is None else [tls.rack_peers()]
        self._server = grpc.server(
            self._pool,
            options=list(_SERVER_OPTIONS),
            interceptors=[PerMethod([*guards, RequestGuard(_BOUNDS, wire.messages_of)])],
        )
        self._server.add_generic_rpc_handlers((_handlers(servicer),))
        bound = 0
        for candidate in [port] if isinstance(port, int) else port:
            try:
                if credentials is None:
                    bound = int(self._server.add_insecure_port(f"{host}:{candidate}"))
                else:
                    bound = int(self._server.add_secure_port(f"{host}:{candidate}", credentials))
            except RuntimeError:  # grpc >= 1.5x raises; older versions return 0
                bound = 0
            if bound:
                break
        if bound == 0:
            self._pool.shutdown(wait=False)
            which = port if isinstance(port, int) else f"{port.start}-{port.stop - 1}"
            raise LinkFailure(
                f"{socket_id}: cannot serve links on {host}:{which} "
                "(every port taken, or the host is not an address of this machine)"
            )
        self.port = bound
        self._server.start()

    def stop(self) -> None:
        """Stop at once: in-flight incoming transfers are cancelled."""
        self._server.stop(0).wait()

    def shutdown_pool(self) -> None:
        """Let the handler threads go (after `stop`, once the endpoint's channels are
        closed); queued handlers are dropped."""
        self._pool.shutdown(wait=False, cancel_futures=True)


def _handlers(servicer: LinkServicer) -> grpc.GenericRpcHandler:
    """The servicer's methods as a gRPC handler, requests decoded by the wire module."""
    ack = link_pb2.TransferAck.SerializeToString
    return grpc.method_handlers_generic_handler(
        wire.SERVICE,
        {
            "Transfer": grpc.stream_unary_rpc_method_handler(
                servicer.Transfer,
                request_deserializer=wire.decode_chunk,
                response_serializer=ack,
            ),
            "Deliver": grpc.unary_unary_rpc_method_handler(
                servicer.Deliver,
                request_deserializer=wire.decode_delivery,
                response_serializer=ack,
            ),
            "Ping": grpc.unary_unary_rpc_method_handler(
                servicer.Ping,
                request_deserializer=link_pb2.PingRequest.FromString,
                response_serializer=link_pb2.PingResponse.SerializeToString,
            ),
        },
    )


def _data(
    request_iterator: Iterator[wire.Chunk], context: grpc.ServicerContext, me: str
) -> memoryview | bytes | None:
    """The next non-empty data chunk of a transfer, None at the stream's end; a header
    before the transfer's data is all in is INVALID_ARGUMENT."""
    for chunk in request_iterator:
        if isinstance(chunk, link_pb2.TransferHeader | wire.Delivered):
            _abort(
                context,
                grpc.StatusCode.INVALID_ARGUMENT,
                f"{me}: a header came before transfer data declared by the previous header "
                "was all in",
            )
        if chunk:
            return chunk
    return None


def _abort(context: grpc.ServicerContext, code: grpc.StatusCode, details: str) -> NoReturn:
    """End the call with `code`; context.abort raises, this says so to the type checker."""
    context.abort(code, details)
    raise AssertionError("unreachable: grpc.ServicerContext.abort raises")
