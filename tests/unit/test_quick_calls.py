"""api/quick_calls.py: the listed calls run on a small pool of their own, the others
on the server's, and a server whose own pool is taken still answers the quick ones."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import grpc
import pytest

from rdurack.api.job_service import QUICK_METHODS
from rdurack.api.server import Server
from rdurack.v1 import job_pb2

SERVICE = "test.Pools"
QUICK = f"/{SERVICE}/Quick"
DEADLINE_S = 30.0  # a call's timeout: generous, for a loaded machine


class Calls:
    """A service whose methods answer the name of the thread that ran them; `Hold`
    keeps its thread until `release` is set."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.holding = threading.Semaphore(0)

    def add_to(self, server: grpc.Server) -> None:
        def name(request: bytes, context: grpc.ServicerContext) -> bytes:
            return threading.current_thread().name.encode()

        def hold(request: bytes, context: grpc.ServicerContext) -> bytes:
            self.holding.release()
            self.release.wait(DEADLINE_S)
            return name(request, context)

        server.add_generic_rpc_handlers(
            (
                grpc.method_handlers_generic_handler(
                    SERVICE,
                    {
                        "Quick": grpc.unary_unary_rpc_method_handler(name),
                        "Other": grpc.unary_unary_rpc_method_handler(name),
                        "Hold": grpc.unary_unary_rpc_method_handler(hold),
                    },
                ),
            )
        )


@pytest.fixture
def served() -> Iterator[tuple[Calls, grpc.Channel]]:
    calls = Calls()
    server = Server([(SERVICE, calls.add_to)], workers=2, quick=[QUICK])
    try:
        with grpc.insecure_channel(server.address) as channel:
            yield calls, channel
    finally:
        calls.release.set()
        server.stop(0)


def stub(channel: grpc.Channel, method: str) -> Any:
    """`method` with no serializers: bytes as they are (typed Any: grpc's stubs type
    such a callable's request as Never)."""
    return channel.unary_unary(method)


def call(channel: grpc.Channel, method: str) -> str:
    answer: bytes = stub(channel, method)(b"", timeout=DEADLINE_S)
    return answer.decode()


def test_a_listed_call_runs_on_the_quick_pool_and_another_on_the_servers(
    served: tuple[Calls, grpc.Channel],
) -> None:
    _, channel = served
    assert call(channel, QUICK).startswith("quick")
    assert not call(channel, f"/{SERVICE}/Other").startswith("quick")


def test_quick_calls_are_answered_while_every_thread_of_the_server_is_held(
    served: tuple[Calls, grpc.Channel],
) -> None:
    calls, channel = served
    held = [stub(channel, f"/{SERVICE}/Hold").future(b"") for _ in range(2)]
    for _ in held:  # both of the server's threads are in Hold
        assert calls.holding.acquire(timeout=DEADLINE_S)
    other = stub(channel, f"/{SERVICE}/Other").future(b"")
    assert call(channel, QUICK).startswith("quick")
    assert not other.done()  # it waits for one of the server's threads
    calls.release.set()
    assert not other.result(timeout=DEADLINE_S).decode().startswith("quick")
    assert all(not f.result(timeout=DEADLINE_S).decode().startswith("quick") for f in held)


def test_the_job_services_quick_methods_are_its_own_unary_methods() -> None:
    service = job_pb2.DESCRIPTOR.services_by_name["JobService"]
    for path in QUICK_METHODS:
        full, _, name = path.lstrip("/").rpartition("/")
        method = service.methods_by_name[name]
        assert full == service.full_name
        assert not method.client_streaming and not method.server_streaming
    assert f"/{service.full_name}/SubmitJob" in QUICK_METHODS
    assert f"/{service.full_name}/WatchJob" not in QUICK_METHODS
