"""One way to build a gRPC server: health checking, reflection and message-size limits."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent import futures

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

# Messages above gRPC's 4 MB default must be allowed on both ends (tensors, results).
MAX_MESSAGE_BYTES = 64 << 20
OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
]


class Server:
    """A started gRPC server and its health servicer."""

    def __init__(
        self,
        services: Sequence[tuple[str, Callable[[grpc.Server], None]]],
        host: str = "127.0.0.1",
        port: int = 0,
        workers: int = 16,
    ) -> None:
        """`services`: (full service name, a function adding its servicer to a server)."""
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=workers), options=OPTIONS)
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
        bound = self.server.add_insecure_port(f"{host}:{port}")
        if bound == 0:
            raise OSError(f"cannot bind {host}:{port}")
        self.address = f"{host}:{bound}"
        self.server.start()
        for name in ["", *names]:
            self.health.set(name, health_pb2.HealthCheckResponse.SERVING)

    def stop(self, grace_s: float = 1.0) -> None:
        self.health.enter_graceful_shutdown()
        self.server.stop(grace_s).wait()

    def wait(self) -> None:
        self.server.wait_for_termination()


def channel(address: str) -> grpc.Channel:
    return grpc.insecure_channel(address, options=OPTIONS)
