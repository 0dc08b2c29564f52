"""One socket's end of its links: LinkEndpoint, its link server plus channels to peers.

The endpoint is what a socket uses: it serves LinkService (servicer.py) into the
socket's Mailbox, learns its peers' addresses (`connect`), marks links down (the fault
hook), sends transfers (`send`, `send_all`, `start_all`; sending.py puts them on the
wire), takes what arrived (`receive`), probes a peer (`ping`) and closes it all.

Threads: the gRPC server runs its handlers on its own pool and touches only the
thread-safe Mailbox (and its own record of transfer ids); the peers, channels, link
faults, transfer-id counter and closed flag are shared under one lock by the socket's
threads (its calls, and its control thread: `connect`, `set_link_down`). Sends are gRPC
futures: `start_all` puts transfers on the wire and returns, and `Sends.wait` collects
their acknowledgements, so a socket can take its incoming messages while its own are
in flight; a failed send wakes the mailbox's waiters from gRPC's callback thread.
"""

from __future__ import annotations

import itertools
import threading
import uuid
from collections.abc import Callable, Mapping, Sequence

import grpc

from rdurack.errors import InvalidRequest, LinkFailure
from rdurack.node_agent.links import sending, wire
from rdurack.node_agent.links.mailbox import Mailbox, Message
from rdurack.node_agent.links.sending import (
    LinkStream,
    LinkStub,
    OutgoingTransfer,
    Pending,
    Sends,
)
from rdurack.node_agent.links.servicer import LinkServer, LinkServicer
from rdurack.security.tls import TlsConfig
from rdurack.v1 import link_pb2


class LinkEndpoint:
    """A socket's link server plus lazily opened, reused channels to its peers."""

    def __init__(
        self,
        socket_id: str,
        host: str = "127.0.0.1",
        port: int | range = 0,
        clock_ns: Callable[[], int] = lambda: 0,
        workers: int = 16,
        tls: TlsConfig | None = None,
    ) -> None:
        """Start serving on `host:port` (port 0: a free port the OS picks; a range: its
        first free port, for a firewall that admits only those).

        `clock_ns` reads the socket's emulated clock (ns) for Ping. `workers` bounds the
        concurrent incoming transfers (server threads; each streaming transfer holds one
        for its duration). `tls`: mutual TLS among rack members, both ways (the package
        docstring); None: plaintext.
        """
        if workers < 1:
            raise InvalidRequest(f"{socket_id}: workers must be >= 1, got {workers}")
        ports = [port] if isinstance(port, int) else [port.start, port.stop - 1]
        if (isinstance(port, range) and not port) or any(not 0 <= p <= 65535 for p in ports):
            raise InvalidRequest(f"{socket_id}: port must be in 0..65535, got {port}")
        # Files are read once, here: a bad certificate fails the endpoint's start.
        server_credentials = None if tls is None else tls.server_credentials(rack_peers=True)
        self._channel_credentials = None if tls is None else tls.channel_credentials()
        self._channel_options: list[tuple[str, int | str]] = [
            *wire.SIZE_OPTIONS,
            *([] if tls is None else tls.channel_options(rack=True)),
        ]
        self.socket_id = socket_id
        self.mailbox = Mailbox(socket_id)
        # Guards peers, channels, link faults, the id counter and the closed flag: the
        # socket's call thread and its control thread use them concurrently.
        self._lock = threading.Lock()
        self._peers: dict[str, str] = {}  # peer socket id -> "host:port"
        self._channels: dict[str, tuple[grpc.Channel, LinkStub]] = {}
        self._down: set[str] = set()  # peers whose link from here is marked down
        # Transfer ids are unique per endpoint: a socket restarted after a fault counts
        # from 0 again, and its peers still remember its predecessor's ids.
        self._ids = itertools.count()
        self._id_prefix = f"{socket_id}-{uuid.uuid4().hex[:8]}"
        self._closed = False
        servicer = LinkServicer(socket_id, self.mailbox, clock_ns)
        self._server = LinkServer(servicer, host, port, workers, tls, server_credentials)
        self.address = f"{host}:{self._server.port}"

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
        sending.check_timeout(self.socket_id, timeout_s)
        checked = [(t, sending.check(self.socket_id, t)) for t in sends]
        return Sends([self._start(t, d, timeout_s) for t, d in checked])

    def _start(self, t: OutgoingTransfer, data: memoryview | None, timeout_s: float) -> Pending:
        what = f"{self.socket_id} -> {t.dst}: transfer {t.tag!r} step {t.step}"
        label = f"{t.dst} step {t.step}"
        with self._lock:
            try:
                stub, address = self._open_locked(t.dst, what)
            except LinkFailure as e:
                return Pending(None, what, label, "", 0.0, failure=e)
            transfer_id = self._next_id_locked()
        call = stub.start(t.header(transfer_id, self.socket_id, data is None), data, timeout_s)
        # A failed send wakes this socket's receive, which may be waiting on a reply that
        # now never comes (Socket._execute gives up on it).
        call.add_done_callback(self._wake_on_failure)
        return Pending(call, what, label, address, timeout_s, sending.streams(data))

    def outbox(self, timeout_s: float) -> Outbox:
        """Sends of one collective: one stream per peer for all of them (Outbox)."""
        sending.check_timeout(self.socket_id, timeout_s)
        return Outbox(self, timeout_s)

    def _stream(self, dst: str, what: str, timeout_s: float) -> tuple[LinkStream | None, Pending]:
        """A new stream to `dst`, with the Pending that holds its call (or the failure
        that kept it home: the link down, `dst` unknown)."""
        label = f"{dst} stream"
        with self._lock:
            try:
                stub, address = self._open_locked(dst, what)
            except LinkFailure as e:
                return None, Pending(None, what, label, "", 0.0, failure=e)
        stream = LinkStream(stub, timeout_s)
        stream.call.add_done_callback(self._wake_on_failure)
        return stream, Pending(stream.call, what, label, address, timeout_s)

    def _next_id(self) -> str:
        with self._lock:
            return self._next_id_locked()

    def _next_id_locked(self) -> str:
        """A transfer id unique to this endpoint; call with self._lock held."""
        return f"{self._id_prefix}-{next(self._ids)}"

    def _check_link(self, dst: str, what: str) -> None:
        """LinkFailure, naming `what`, when a send to `dst` could not go out now (the
        endpoint closed, the link down, `dst` unknown): `_open_locked`'s checks."""
        with self._lock:
            self._open_locked(dst, what)

    def _wake_on_failure(self, call: grpc.Future[link_pb2.TransferAck]) -> None:
        if call.cancelled() or call.exception() is not None:
            self.mailbox.wake()

    def _open_locked(self, dst: str, what: str) -> tuple[LinkStub, str]:
        """The reused stub for `dst` and its address; call with self._lock held.
        LinkFailure, naming `what`, when the endpoint is closed, the link down or `dst`
        unknown."""
        if self._closed:
            raise LinkFailure(f"{what} failed: this link endpoint is closed")
        if dst in self._down:
            raise LinkFailure(f"{what} dropped: the link is down (fault injected)")
        address = self._peers.get(dst)
        if address is None:
            known = ", ".join(sorted(self._peers)) or "none (call connect first)"
            raise LinkFailure(
                f"{self.socket_id} -> {dst}: {dst!r} is not a connected peer; known peers: {known}"
            )
        entry = self._channels.get(dst)
        if entry is None:
            channel = sending.open_channel(
                address, self._channel_credentials, self._channel_options
            )
            entry = (channel, LinkStub(channel))
            self._channels[dst] = entry
        return entry[1], address

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
        sending.check_timeout(self.socket_id, timeout_s)
        what = f"{self.socket_id} -> {dst}: ping"
        with self._lock:
            stub, address = self._open_locked(dst, what)
        try:
            reply = stub.ping(link_pb2.PingRequest(src_socket_id=self.socket_id), timeout=timeout_s)
        except grpc.RpcError as e:
            raise LinkFailure(sending.rpc_failure(what, e, dst, address, timeout_s)) from None
        return str(reply.socket_id), int(reply.emulated_clock_ns)

    # ------------------------------------------------------------------ lifecycle

    def close(self) -> None:
        """Stop serving at once (in-flight incoming transfers are cancelled), close the
        channels and the server's pool. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            channels = [channel for channel, _ in self._channels.values()]
            self._channels.clear()
        self._server.stop()
        for channel in channels:
            channel.close()  # cancels in-flight sends: they fail as LinkFailure
        self._server.shutdown_pool()

    def __enter__(self) -> LinkEndpoint:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Outbox:
    """One collective's sends of at most DELIVER_MAX_BYTES each (timing-only ones too),
    on one Transfer stream per peer, opened at its first send and ended by `wait`.
    Payloads are copied when sent. A link marked down fails the sends after it, as
    `start_all` would; a stream that fails fails every transfer on it."""

    def __init__(self, endpoint: LinkEndpoint, timeout_s: float) -> None:
        self._endpoint = endpoint
        self._timeout_s = timeout_s
        self._streams: dict[str, LinkStream | None] = {}  # peer -> its stream
        self._pending: list[Pending] = []  # every stream's call, or the failure instead

    def send(self, t: OutgoingTransfer) -> None:
        """Check `t` (InvalidRequest) and put it on its peer's stream."""
        me = self._endpoint.socket_id
        data = sending.check(me, t)
        what = f"{me} -> {t.dst}: transfers of {t.tag!r}"
        if t.dst in self._streams:  # a new stream's opening makes the same checks
            try:
                self._endpoint._check_link(t.dst, what)
            except LinkFailure as e:
                self._pending.append(Pending(None, what, t.dst, "", 0.0, failure=e))
                return
        else:
            stream, pending = self._endpoint._stream(t.dst, what, self._timeout_s)
            self._streams[t.dst] = stream
            self._pending.append(pending)
        stream = self._streams[t.dst]
        if stream is not None:
            stream.put(t.header(self._endpoint._next_id(), me, data is None), data)

    def failure(self) -> LinkFailure | None:
        """The first failure among the streams that have ended; never waits."""
        return Sends(self._pending).failure()

    def wait(self) -> None:
        """End every stream and wait until each peer has all of its transfers; raise
        the first failure."""
        self._close()
        Sends(self._pending).wait()

    def cancel(self) -> None:
        """Give up: end and cancel every stream."""
        self._close()
        Sends(self._pending).cancel()

    def _close(self) -> None:
        for stream in self._streams.values():
            if stream is not None:
                stream.close()
