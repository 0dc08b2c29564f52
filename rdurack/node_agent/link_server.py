"""One socket's end of its links: a rdurack.v1.LinkService server and clients to peers.

The data plane between emulated sockets. A transfer is one gRPC call: a unary `Deliver`
(header and payload in one message) for a timing-only transfer or a payload of at most
DELIVER_MAX_BYTES, else a client-streaming `Transfer` (a TransferHeader, then the payload
in CHUNK_BYTES slices); link.proto says why both exist. The receiving server checks both
alike and puts the transfer in the socket's Mailbox, where the socket's own thread takes
it by (collective tag, step, sender). The messages are the generated ones on the wire,
but written and read by link_wire: the payload is copied once on each side by Python
(and once more by gRPC itself), and arrives as views of the received chunks.

Emulated time never depends on the wire: the sender prices the transfer with its own
link model and stamps the arrival (ns) in the header; the receiver's clock moves to it
when the socket consumes the message. Wall time only bounds how long a call may take
(`timeout_s`).

Security: with a TlsConfig the server is mutual TLS and admits only rack members (a
client certificate of the rack CA naming the rack identity; security/tls.py), and the
channels to peers present this socket's member certificate and expect a member. Every
request passes the same guard as every rdurack server (security/guard.py): undecodable
messages and fields out of bounds are INVALID_ARGUMENT before the servicer runs.

Threads: the gRPC server runs its handlers on its own pool and touches only the
thread-safe Mailbox and the endpoint's lock-protected state. Sends are gRPC futures:
`start_all` puts transfers on the wire and returns, and `Sends.wait` collects their
acknowledgements, so a socket can take its incoming messages while its own are in
flight. Every failure the caller sees is a LinkFailure (link or peer trouble) or an
InvalidRequest (bad arguments), never a raw grpc.RpcError.
"""

from __future__ import annotations

import itertools
import threading
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent import futures
from dataclasses import dataclass
from typing import NoReturn

import grpc

from rdurack.errors import InvalidRequest, LinkFailure
from rdurack.node_agent import link_wire
from rdurack.node_agent.mailbox import Buffer, Mailbox, Message
from rdurack.security.guard import Bounds, RequestGuard
from rdurack.security.tls import TlsConfig
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
# messages. With link_wire's encoders (one copy of the payload per message) a unary
# message of up to a chunk costs less than the same bytes as header + chunk on a stream
# (separate processes, 2 cores under load, µs per call wall / sender CPU / receiver
# CPU, medians of 3 x 100 calls): 128 KiB unary 808/286/464 vs stream 1696/620/634;
# 1 MiB 1801/922/760 vs 2606/866/1065. A ring all-reduce of 16 MB over 16 sockets
# moves 1 MB per transfer, so it takes this path.
DELIVER_MAX_BYTES = CHUNK_BYTES
# Largest single gRPC message allowed on server and channels (64 MiB). Chunks stay far
# below it; the limit is raised above gRPC's 4 MB default anyway (DESIGN.md conventions)
# so a header with a long shape or a future larger chunk size is not refused.
MAX_MESSAGE_BYTES = 64 << 20
# Only the size limits: on loopback, none of grpc.http2.lookahead_bytes (16 MiB),
# grpc.http2.write_buffer_size (8 MiB), grpc.http2.max_frame_size (16 MiB),
# grpc.experimental.tcp_{min,max}_read_chunk_size (1/8 MiB) nor bdp_probe (on by default)
# moved the 64 MB cross-process throughput or the per-call cost beyond run-to-run noise
# (about +-20% on this machine), so none is set.
_SIZE_OPTIONS: tuple[tuple[str, int], ...] = (
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
)
# gRPC binds with SO_REUSEPORT by default: a second endpoint on an explicit port that is
# taken would silently share it and receive half of another socket's transfers. Off, the
# bind fails loudly instead.
_SERVER_OPTIONS: tuple[tuple[str, int], ...] = (*_SIZE_OPTIONS, ("grpc.so_reuseport", 0))
# Transfer ids remembered per receiver to refuse a duplicate (ALREADY_EXISTS, link.proto).
# Bounded so a long-running socket's memory does not grow; a duplicate only comes from a
# retry, which follows its original within far fewer transfers than this.
_RECENT_TRANSFER_IDS = 4096
# Per-field limits of link requests: ids, tags and dtype names are short; a shape has at
# most 64 dimensions. Data bytes are bounded by MAX_MESSAGE_BYTES alone (not read here:
# reading a bytes field copies it).
_BOUNDS = Bounds(max_chars=256, max_items=64)
# Full name of the service, as its method paths spell it.
SERVICE = link_pb2.DESCRIPTOR.services_by_name["LinkService"].full_name
# End of a request stream, for `next`'s default.
_END = object()
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


class LinkEndpoint:
    """A socket's link server plus lazily opened, reused channels to its peers."""

    def __init__(
        self,
        socket_id: str,
        host: str = "127.0.0.1",
        port: int = 0,
        clock_ns: Callable[[], int] = lambda: 0,
        workers: int = 16,
        tls: TlsConfig | None = None,
    ) -> None:
        """Start serving on `host:port` (port 0: a free port the OS picks).

        `clock_ns` reads the socket's emulated clock (ns) for Ping. `workers` bounds the
        concurrent incoming transfers (server threads; each streaming transfer holds one
        for its duration). `tls`: mutual TLS among rack members, both ways (module
        docstring); None: plaintext.
        """
        if workers < 1:
            raise InvalidRequest(f"{socket_id}: workers must be >= 1, got {workers}")
        if not 0 <= port <= 65535:
            raise InvalidRequest(f"{socket_id}: port must be in 0..65535, got {port}")
        # Files are read once, here: a bad certificate fails the endpoint's start.
        server_credentials = None if tls is None else tls.server_credentials(rack_peers=True)
        self._channel_credentials = None if tls is None else tls.channel_credentials()
        self._channel_options = [
            *_SIZE_OPTIONS,
            *([] if tls is None else tls.channel_options(rack=True)),
        ]
        self.socket_id = socket_id
        self.mailbox = Mailbox(socket_id)
        self._clock_ns = clock_ns
        # Guards peers, channels, link faults, the id counter and the closed flag: the
        # caller's thread and the link server's use them concurrently.
        self._lock = threading.Lock()
        self._peers: dict[str, str] = {}  # peer socket id -> "host:port"
        self._channels: dict[str, tuple[grpc.Channel, _LinkStub]] = {}
        self._down: set[str] = set()  # peers whose link from here is marked down
        # Transfer ids are unique per endpoint: a socket restarted after a fault counts
        # from 0 again, and its peers still remember its predecessor's ids.
        self._ids = itertools.count()
        self._id_prefix = f"{socket_id}-{uuid.uuid4().hex[:8]}"
        self._closed = False
        self._recent_lock = threading.Lock()
        self._recent_ids: OrderedDict[str, None] = OrderedDict()
        self._server_pool = futures.ThreadPoolExecutor(
            max_workers=workers, thread_name_prefix=f"{socket_id}-link"
        )
        guards: list[grpc.ServerInterceptor] = [] if tls is None else [tls.rack_peers()]
        self._server = grpc.server(
            self._server_pool,
            options=list(_SERVER_OPTIONS),
            interceptors=[*guards, RequestGuard(_BOUNDS, link_wire.messages_of)],
        )
        self._server.add_generic_rpc_handlers((_handlers(_LinkServicer(self)),))
        try:
            if server_credentials is None:
                bound = int(self._server.add_insecure_port(f"{host}:{port}"))
            else:
                bound = int(self._server.add_secure_port(f"{host}:{port}", server_credentials))
        except RuntimeError:  # grpc >= 1.5x raises; older versions return 0
            bound = 0
        if bound == 0:
            self._server_pool.shutdown(wait=False)
            raise LinkFailure(
                f"{socket_id}: cannot serve links on {host}:{port} "
                "(port taken, or the host is not an address of this machine)"
            )
        self.address = f"{host}:{bound}"
        self._server.start()

    # ------------------------------------------------------------------ peers, faults

    def connect(self, peers: Mapping[str, str]) -> None:
        """Learn (or update) peer socket id -> link address ("host:port").

        Channels open on first use and are reused; a peer whose address changed gets a
        fresh channel."""
        stale: list[grpc.Channel] = []
        with self._lock:
            for peer, address in peers.items():
                if not address:
                    raise InvalidRequest(f"{self.socket_id}: empty link address for {peer}")
                if self._peers.get(peer) != address and peer in self._channels:
                    stale.append(self._channels.pop(peer)[0])
                self._peers[peer] = address
        for channel in stale:
            channel.close()

    def peers(self) -> dict[str, str]:
        """The known peers: socket id -> link address."""
        with self._lock:
            return dict(self._peers)

    def set_link_down(self, dst: str, down: bool = True) -> None:
        """Fault hook: while down, every transfer and ping from here to `dst` fails at
        once with LinkFailure, and nothing reaches `dst`."""
        with self._lock:
            if down:
                self._down.add(dst)
            else:
                self._down.discard(dst)

    def link_down(self, dst: str) -> bool:
        with self._lock:
            return dst in self._down

    # ------------------------------------------------------------------ sending

    def send(
        self,
        dst: str,
        tag: str,
        step: int,
        send_ns: int,
        arrival_ns: int,
        nbytes: int,
        payload: bytes | memoryview | None,
        dtype: str = "",
        shape: tuple[int, ...] = (),
        timeout_s: float = 30.0,
    ) -> int:
        """Send one transfer to `dst` and wait for its acknowledgement.

        `payload` None is timing mode: only the header travels, declaring `nbytes`.
        Returns the payload bytes the receiver got (0 in timing mode). Raises LinkFailure
        when the link is down, `dst` is unknown or the call fails within `timeout_s`
        seconds (wall time)."""
        transfer = OutgoingTransfer(
            dst, tag, step, send_ns, arrival_ns, nbytes, payload, dtype, tuple(shape)
        )
        return self.send_all([transfer], timeout_s)[0]

    def send_all(self, sends: Sequence[OutgoingTransfer], timeout_s: float = 30.0) -> list[int]:
        """Send several transfers concurrently; return their received byte counts in order.

        Every argument is checked before anything goes out. All transfers run to
        completion or failure; then the first failure (in `sends` order) is raised."""
        return self.start_all(sends, timeout_s).wait()

    def start_all(self, sends: Sequence[OutgoingTransfer], timeout_s: float = 30.0) -> Sends:
        """Put several transfers on the wire and return without waiting for them.

        Every argument is checked before anything goes out (InvalidRequest). A payload of
        at most DELIVER_MAX_BYTES is copied into its message before this returns, so the
        caller may change it at once; a larger one streams from the caller's buffer until
        its acknowledgement (`Sends.reads_payload`). Failures (a link down, an unknown
        peer, the call itself) come from `Sends.wait`."""
        _check_timeout(self.socket_id, timeout_s)
        checked = [(t, self._check(t)) for t in sends]
        return Sends([self._start(t, d, timeout_s) for t, d in checked])

    def _check(self, t: OutgoingTransfer) -> memoryview | None:
        """Validate a transfer's arguments; return its payload as flat bytes, or None."""
        where = f"{self.socket_id} -> {t.dst}"
        if not t.dst:
            raise InvalidRequest(f"{self.socket_id}: a transfer needs a destination socket id")
        if not 0 <= t.step <= _MAX_STEP:
            raise InvalidRequest(f"{where}: step must be in 0..{_MAX_STEP}, got {t.step}")
        for name, value in (("send_ns", t.send_ns), ("arrival_ns", t.arrival_ns)):
            if not 0 <= value <= _MAX_U64:
                raise InvalidRequest(f"{where}: {name} must be a uint64 (ns), got {value}")
        if t.arrival_ns < t.send_ns:
            raise InvalidRequest(
                f"{where}: arrival_ns {t.arrival_ns} is before send_ns {t.send_ns}"
            )
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

    def _start(self, t: OutgoingTransfer, data: memoryview | None, timeout_s: float) -> _Pending:
        what = f"{self.socket_id} -> {t.dst}: transfer {t.tag!r} step {t.step}"
        with self._lock:
            if self._closed:
                why = LinkFailure(f"{what} failed: this link endpoint is closed")
                return _Pending(None, what, f"{t.dst} step {t.step}", "", 0.0, failure=why)
            if t.dst in self._down:
                why = LinkFailure(f"{what} dropped: the link is down (fault injected)")
                return _Pending(None, what, f"{t.dst} step {t.step}", "", 0.0, failure=why)
            try:
                stub = self._stub_locked(t.dst)
            except LinkFailure as e:
                return _Pending(None, what, f"{t.dst} step {t.step}", "", 0.0, failure=e)
            transfer_id = f"{self._id_prefix}-{next(self._ids)}"
            address = self._peers[t.dst]
        header = link_pb2.TransferHeader(
            transfer_id=transfer_id,
            src_socket_id=self.socket_id,
            dst_socket_id=t.dst,
            total_bytes=t.nbytes,
            emulated_send_ns=t.send_ns,
            collective_tag=t.tag,
            collective_step=t.step,
            dtype=t.dtype,
            shape=t.shape,
            timing_only=data is None,
            emulated_arrival_ns=t.arrival_ns,
        )
        streamed = data is not None and len(data) > DELIVER_MAX_BYTES
        call: grpc.Future[link_pb2.TransferAck]
        if data is not None and streamed:
            call = stub.transfer.future(_chunks(header, data), timeout=timeout_s)
        else:
            # One message, encoded (payload copied) now: the unary call, no
            # request-iterator thread (link.proto).
            call = stub.deliver.future(link_wire.encode_delivery(header, data), timeout=timeout_s)
        # A failed send wakes this socket's receive, which may be waiting on a reply that
        # now never comes (Socket._execute gives up on it).
        call.add_done_callback(self._wake_on_failure)
        return _Pending(call, what, f"{t.dst} step {t.step}", address, timeout_s, streamed)

    def _wake_on_failure(self, call: grpc.Future[link_pb2.TransferAck]) -> None:
        if call.cancelled() or call.exception() is not None:
            self.mailbox.wake()

    def _stub_locked(self, dst: str) -> _LinkStub:
        """The reused stub for `dst`; call with self._lock held."""
        entry = self._channels.get(dst)
        if entry is None:
            address = self._peers.get(dst)
            if address is None:
                known = ", ".join(sorted(self._peers)) or "none (call connect first)"
                raise LinkFailure(
                    f"{self.socket_id} -> {dst}: {dst!r} is not a connected peer; "
                    f"known peers: {known}"
                )
            if self._channel_credentials is None:
                channel = grpc.insecure_channel(address, options=self._channel_options)
            else:
                channel = grpc.secure_channel(
                    address, self._channel_credentials, options=self._channel_options
                )
            entry = (channel, _LinkStub(channel))
            self._channels[dst] = entry
        return entry[1]

    # ------------------------------------------------------------------ receiving, probing

    def receive(
        self,
        tag: str,
        step: int,
        src: str,
        timeout_s: float,
        give_up: Callable[[], BaseException | None] = lambda: None,
    ) -> Message:
        """The message (tag, step, src), waiting up to `timeout_s` seconds (wall time).
        `give_up` is asked whenever the wait wakes; what it returns is raised."""
        return self.mailbox.take(tag, step, src, timeout_s, give_up)

    def ping(self, dst: str, timeout_s: float = 5.0) -> tuple[str, int]:
        """(peer socket id, peer emulated clock in ns), over the link to `dst`."""
        _check_timeout(self.socket_id, timeout_s)
        what = f"{self.socket_id} -> {dst}: ping"
        with self._lock:
            if self._closed:
                raise LinkFailure(f"{what} failed: this link endpoint is closed")
            if dst in self._down:
                raise LinkFailure(f"{what} dropped: the link is down (fault injected)")
            stub = self._stub_locked(dst)
            address = self._peers[dst]
        try:
            reply = stub.ping(link_pb2.PingRequest(src_socket_id=self.socket_id), timeout=timeout_s)
        except grpc.RpcError as e:
            raise LinkFailure(_rpc_failure(what, e, dst, address, timeout_s)) from None
        return str(reply.socket_id), int(reply.emulated_clock_ns)

    # ------------------------------------------------------------------ lifecycle

    def close(self) -> None:
        """Stop serving at once (in-flight incoming transfers are cancelled), close the
        channels and the send pool. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            channels = [channel for channel, _ in self._channels.values()]
            self._channels.clear()
        self._server.stop(0).wait()
        for channel in channels:
            channel.close()  # cancels in-flight sends: they fail as LinkFailure
        self._server_pool.shutdown(wait=False, cancel_futures=True)

    def __enter__(self) -> LinkEndpoint:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ server side

    def _remember(self, transfer_id: str) -> bool:
        """Record `transfer_id`; False if it was seen recently (a duplicate)."""
        with self._recent_lock:
            if transfer_id in self._recent_ids:
                return False
            self._recent_ids[transfer_id] = None
            if len(self._recent_ids) > _RECENT_TRANSFER_IDS:
                self._recent_ids.popitem(last=False)
            return True


class _Pending:
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
                    _rpc_failure(self.what, e, dst, self.address, self.timeout_s)
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

    def __init__(self, pending: list[_Pending]) -> None:
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
        failed: list[tuple[_Pending, LinkFailure]] = []
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


class _LinkStub:
    """LinkService's calls, with requests encoded by link_wire (already bytes: no
    serializer) and the generated classes for everything small."""

    def __init__(self, channel: grpc.Channel) -> None:
        self.transfer: grpc.StreamUnaryMultiCallable[bytes, link_pb2.TransferAck]
        self.transfer = channel.stream_unary(
            f"/{SERVICE}/Transfer", response_deserializer=link_pb2.TransferAck.FromString
        )
        self.deliver: grpc.UnaryUnaryMultiCallable[bytes, link_pb2.TransferAck]
        self.deliver = channel.unary_unary(
            f"/{SERVICE}/Deliver", response_deserializer=link_pb2.TransferAck.FromString
        )
        self.ping = channel.unary_unary(
            f"/{SERVICE}/Ping",
            request_serializer=link_pb2.PingRequest.SerializeToString,
            response_deserializer=link_pb2.PingResponse.FromString,
        )


def _handlers(servicer: _LinkServicer) -> grpc.GenericRpcHandler:
    """The servicer's methods as a gRPC handler, requests decoded by link_wire."""
    ack = link_pb2.TransferAck.SerializeToString
    return grpc.method_handlers_generic_handler(
        SERVICE,
        {
            "Transfer": grpc.stream_unary_rpc_method_handler(
                servicer.Transfer,
                request_deserializer=link_wire.decode_chunk,
                response_serializer=ack,
            ),
            "Deliver": grpc.unary_unary_rpc_method_handler(
                servicer.Deliver,
                request_deserializer=link_wire.decode_delivery,
                response_serializer=ack,
            ),
            "Ping": grpc.unary_unary_rpc_method_handler(
                servicer.Ping,
                request_deserializer=link_pb2.PingRequest.FromString,
                response_serializer=link_pb2.PingResponse.SerializeToString,
            ),
        },
    )


class _LinkServicer:
    """LinkService of one endpoint; runs on the gRPC server's threads."""

    def __init__(self, endpoint: LinkEndpoint) -> None:
        self._endpoint = endpoint

    def Transfer(  # noqa: N802 (gRPC method name)
        self,
        request_iterator: Iterator[link_wire.Chunk],
        context: grpc.ServicerContext,
    ) -> link_pb2.TransferAck:
        me = self._endpoint.socket_id
        invalid = grpc.StatusCode.INVALID_ARGUMENT
        first = next(request_iterator, _END)
        if not isinstance(first, link_pb2.TransferHeader):
            got = (
                "an empty stream"
                if first is _END
                else "a data chunk"
                if first
                else "an empty chunk"
            )
            _abort(context, invalid, f"{me}: the first chunk must be a header, got {got}")
        h = first
        self._admit(h, context)
        total = h.total_bytes
        # The chunks are kept as gRPC handed them over (views, no copy): the consumer
        # reads them in order (Message.parts).
        parts: list[memoryview | bytes] = []
        received = 0
        for chunk in request_iterator:
            if isinstance(chunk, link_pb2.TransferHeader):
                _abort(context, invalid, f"{me}: a header repeated after the first chunk")
            if not chunk:  # an empty chunk
                continue
            n = len(chunk)
            if h.timing_only or received + n > total:
                self._check_size(h, received + n, context)  # aborts: data not declared
            parts.append(chunk)
            received += n
        if not h.timing_only:
            self._check_size(h, received, context)
        return self._store(h, None if h.timing_only else tuple(parts), received, context)

    def Deliver(  # noqa: N802 (gRPC method name)
        self, request: link_wire.Delivered, context: grpc.ServicerContext
    ) -> link_pb2.TransferAck:
        h = request.header
        self._admit(h, context)
        data = request.data
        self._check_size(h, len(data), context)
        # The request's bytes are the payload as they came (a view: no copy).
        return self._store(h, None if h.timing_only else (data,), len(data), context)

    # Shared by Transfer and Deliver: the checks before any data is accepted, the size
    # check after, and the hand-over to the mailbox with its acknowledgement.

    def _admit(self, h: link_pb2.TransferHeader, context: grpc.ServicerContext) -> None:
        """Refuse a transfer for another socket (INVALID_ARGUMENT) or a duplicate
        transfer id (ALREADY_EXISTS); checked before the data is read, so a misrouted
        transfer costs no copy."""
        me = self._endpoint.socket_id
        if h.dst_socket_id != me:
            _abort(
                context,
                grpc.StatusCode.INVALID_ARGUMENT,
                f"{me}: transfer {h.transfer_id} from {h.src_socket_id} is addressed to "
                f"{h.dst_socket_id!r} (header.dst_socket_id), not to this socket {me}",
            )
        if not self._endpoint._remember(h.transfer_id):
            _abort(
                context,
                grpc.StatusCode.ALREADY_EXISTS,
                f"{me}: transfer {h.transfer_id} from {h.src_socket_id} was already received",
            )

    def _check_size(
        self, h: link_pb2.TransferHeader, received: int, context: grpc.ServicerContext
    ) -> None:
        """INVALID_ARGUMENT unless `received` data bytes are what the header declares:
        none in timing mode, exactly total_bytes otherwise."""
        if h.timing_only:
            if received:
                _abort(
                    context,
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"{self._endpoint.socket_id}: timing-only transfer {h.transfer_id} from "
                    f"{h.src_socket_id} carries data",
                )
            return
        if received != h.total_bytes:
            more = received > h.total_bytes
            _abort(
                context,
                grpc.StatusCode.INVALID_ARGUMENT,
                f"{self._endpoint.socket_id}: transfer {h.transfer_id} from {h.src_socket_id} "
                + (
                    f"carries more than the {h.total_bytes:,} bytes its header.total_bytes declares"
                    if more
                    else f"carried {received:,} bytes, header.total_bytes declares "
                    f"{h.total_bytes:,}"
                ),
            )

    def _store(
        self,
        h: link_pb2.TransferHeader,
        parts: tuple[Buffer, ...] | None,
        received: int,
        context: grpc.ServicerContext,
    ) -> link_pb2.TransferAck:
        """Put the received transfer in the mailbox; its acknowledgement."""
        me = self._endpoint.socket_id
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
            self._endpoint.mailbox.put(message)
        except LinkFailure as e:  # the same (tag, step, src) twice: a protocol error
            _abort(context, grpc.StatusCode.ALREADY_EXISTS, str(e))
        return link_pb2.TransferAck(
            receiver_socket_id=me,
            transfer_id=h.transfer_id,
            emulated_arrival_ns=h.emulated_arrival_ns,
            bytes_received=received,
        )

    def Ping(  # noqa: N802 (gRPC method name)
        self, request: link_pb2.PingRequest, context: grpc.ServicerContext
    ) -> link_pb2.PingResponse:
        me = self._endpoint.socket_id
        try:
            now_ns = int(self._endpoint._clock_ns())
        except Exception as e:  # the clock belongs to the socket; report, never UNKNOWN
            _abort(context, grpc.StatusCode.INTERNAL, f"{me}: reading the clock failed: {e!r}")
        return link_pb2.PingResponse(socket_id=me, emulated_clock_ns=now_ns)


def _chunks(header: link_pb2.TransferHeader, data: memoryview) -> Iterator[bytes]:
    """The request stream, encoded: the header, then the payload in CHUNK_BYTES slices.

    Slicing the memoryview copies nothing; each chunk's encoding copies its slice once
    (1 MiB at a time), never the whole payload up front."""
    yield link_wire.encode_header_chunk(header)
    for offset in range(0, len(data), CHUNK_BYTES):
        yield link_wire.encode_data_chunk(data[offset : offset + CHUNK_BYTES])


def _rpc_failure(what: str, e: grpc.RpcError, dst: str, address: str, timeout_s: float) -> str:
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


def _check_timeout(socket_id: str, timeout_s: float) -> None:
    if not timeout_s > 0:  # also refuses NaN
        raise InvalidRequest(f"{socket_id}: timeout_s must be > 0, got {timeout_s}")


def _abort(context: grpc.ServicerContext, code: grpc.StatusCode, details: str) -> NoReturn:
    """End the call with `code`; context.abort raises, this says so to the type checker."""
    context.abort(code, details)
    raise AssertionError("unreachable: grpc.ServicerContext.abort raises")
