"""One way to build a gRPC server: health checking, reflection, message-size limits,
request guards, TLS, bearer tokens and tracing; and one way to open a channel to one
(tracing, tokens, TLS, and gRPC's own retries of the calls api/retry.py names).

A server is plaintext unless it is given a TlsConfig. With one, `rack_peers=True` makes
it an in-rack server (mutual TLS: only rack members may call; node agents), else a
public one (TLS, any client; the orchestrator's API, where bearer tokens say who calls).
`health_port` adds a second, plaintext listener serving grpc.health.v1 and nothing
else: Kubernetes' gRPC probes present no client certificate, so they cannot reach a
TLS port, and this one opens nothing of the API.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Sequence
from concurrent import futures
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from opentelemetry import trace

from rdurack.api.quick_calls import QuickCalls
from rdurack.api.retry import IDEMPOTENT, service_config
from rdurack.security.auth import Authenticator
from rdurack.security.guard import Bounds, RequestGuard
from rdurack.security.per_method import PerMethod
from rdurack.security.tls import TlsConfig
from rdurack.telemetry.propagation import CallDetails, ClientCalls, ClientTracing, ServerTracing

# Messages above gRPC's 4 MB default must be allowed on both ends (tensors, results).
MAX_MESSAGE_BYTES = 64 << 20
OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
]
# In-rack servers (node agents) take what the orchestrator sends: ids, programs, a
# pickled training loop. Generous per-field limits; the message size is the real bound.
RACK_BOUNDS = Bounds(max_chars=4096, max_items=1 << 20)


class Server:
    """A started gRPC server and its health servicer."""

    def __init__(
        self,
        services: Sequence[tuple[str, Callable[[grpc.Server], None]]],
        host: str = "127.0.0.1",
        port: int = 0,
        workers: int = 16,
        tracer_provider: trace.TracerProvider | None = None,
        *,
        tls: TlsConfig | None = None,
        rack_peers: bool = False,
        auth: Authenticator | None = None,
        bounds: Bounds = RACK_BOUNDS,
        max_receive_bytes: int = MAX_MESSAGE_BYTES,
        health_port: int | None = None,
        quick: Collection[str] = (),
    ) -> None:
        """`services`: (full service name, a function adding its servicer to a server).
        `tracer_provider`: where RPC spans go (default: the process's global one).
        `tls`, `rack_peers`, `health_port`: the module docstring. `auth`: bearer tokens
        required by every service but health (None or open: no tokens). `bounds`: the
        limits every request's fields must keep; `max_receive_bytes`: the largest request
        message (gRPC answers RESOURCE_EXHAUSTED above it). `quick`: the methods
        ('/package.Service/Method') run on a small pool of their own (quick_calls.py);
        `workers` threads run every other call."""
        if rack_peers and tls is None:
            raise ValueError("rack_peers needs TLS: mutual TLS is how peers are known")
        # Tracing outermost: its span also covers requests the guards refuse. Then who
        # calls (certificate, token), then what they sent (decoding, bounds).
        interceptors: list[grpc.ServerInterceptor] = [ServerTracing(tracer_provider)]
        # Before it: gRPC picks a call's pool on the outermost interceptor's handler.
        self._quick = QuickCalls(quick) if quick else None
        if self._quick is not None:
            interceptors.insert(0, self._quick)
        if rack_peers and tls is not None:
            interceptors.append(tls.rack_peers())
        token_check = auth.interceptor() if auth is not None else None
        if token_check is not None:
            interceptors.append(token_check)
        interceptors.append(RequestGuard(bounds))
        credentials = None if tls is None else tls.server_credentials(rack_peers)
        self.server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=workers),
            options=[
                ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                ("grpc.max_receive_message_length", max_receive_bytes),
            ],
            interceptors=[PerMethod(interceptors)],
        )
        for _, add in services:
            add(self.server)
        self.health = health.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        names = [name for name, _ in services]
        reflection.enable_server_reflection(
            [
                *names,
                health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
                reflection.SERVICE_NAME,
            ],
            self.server,
        )
        self.tls = tls is not None
        self.address = f"{host}:{_bind(self.server, host, port, credentials)}"
        self.health_address: str | None = None
        self._health_server: grpc.Server | None = None
        if health_port is not None:
            # Its own small server: the health servicer alone, shared with the main one
            # so both report the same status. No reflection, no other service.
            self._health_server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
            health_pb2_grpc.add_HealthServicer_to_server(self.health, self._health_server)
            bound = _bind(self._health_server, host, health_port, None)
            self.health_address = f"{host}:{bound}"
        self.server.start()
        if self._health_server is not None:
            self._health_server.start()
        for name in ["", *names]:
            self.health.set(name, health_pb2.HealthCheckResponse.SERVING)

    def stop(self, grace_s: float = 1.0) -> None:
        self.health.enter_graceful_shutdown()
        self.server.stop(grace_s).wait()
        if self._quick is not None:
            self._quick.close()
        if self._health_server is not None:
            self._health_server.stop(0).wait()

    def wait(self) -> None:
        self.server.wait_for_termination()


def _bind(
    server: grpc.Server, host: str, port: int, credentials: grpc.ServerCredentials | None
) -> int:
    address = f"{host}:{port}"
    try:
        if credentials is None:
            bound = server.add_insecure_port(address)
        else:
            bound = server.add_secure_port(address, credentials)
    except RuntimeError:  # newer grpc raises where older returned 0
        bound = 0
    if bound == 0:
        raise OSError(f"cannot bind {address}")
    return int(bound)


class BearerToken(ClientCalls):
    """Adds `authorization: Bearer TOKEN` to every call's metadata. Metadata rather than
    gRPC call credentials, which refuse plaintext channels: a token over loopback
    without TLS is the local rack's case."""

    def __init__(self, token: str) -> None:
        self._pair: tuple[str, str | bytes] = ("authorization", f"Bearer {token}")

    def _call(self, continuation: Any, details: grpc.ClientCallDetails, request: Any) -> Any:
        metadata = [(k, v) for k, v in (details.metadata or ()) if k != "authorization"]
        return continuation(CallDetails(details, [*metadata, self._pair]), request)


def channel(
    address: str,
    tracer_provider: trace.TracerProvider | None = None,
    *,
    tls: TlsConfig | None = None,
    rack: bool = False,
    token: str | None = None,
    options: Sequence[tuple[str, Any]] = (),
    retried: Iterable[str] = IDEMPOTENT,
) -> grpc.Channel:
    """A channel whose calls carry the caller's trace context (and get CLIENT spans),
    and which gRPC retries after UNAVAILABLE where that is safe (api/retry.py).

    `tls`: TLS trusting its CA (plaintext without). `rack`: an in-rack channel, which
    presents the member certificate and expects a rack member at `address`. `token`:
    a bearer token sent with every call. `options`: channel arguments beyond the
    message-size limits. `retried`: the methods gRPC may send again, each
    "package.Service/Method" (default: the reads, retry.IDEMPOTENT)."""
    every = [*OPTIONS, ("grpc.service_config", service_config(retried)), *options]
    if tls is None:
        base = grpc.insecure_channel(address, options=every)
    else:
        base = grpc.secure_channel(
            address, tls.channel_credentials(), options=[*every, *tls.channel_options(rack)]
        )
    interceptors: list[Any] = [ClientTracing(tracer_provider)]
    if token:
        interceptors.append(BearerToken(token))
    return grpc.intercept_channel(base, *interceptors)


def security_notice(host: str, tls: bool, auth: Authenticator) -> str:
    """One line saying how a public server is protected, and what follows when it is not."""
    loopback = host in ("127.0.0.1", "localhost", "::1") or host.startswith("127.")
    transport = "TLS" if tls else "plaintext"
    if auth.is_open:
        who = "unauthenticated: anyone who reaches it may submit and cancel any job"
    else:
        assert auth.tokens is not None
        who = f"bearer tokens required ({len(auth.tokens.tenants)} tenants)"
    where = (
        "loopback only, this machine"
        if loopback
        else "reachable from the network"
        + ("" if tls else ": traffic and tokens travel in the clear, use --tls-*")
    )
    return f"{transport}, {who} ({where})"
