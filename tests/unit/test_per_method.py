"""security/per_method.py: a server's interceptors run on a method's first call only,
and what depends on the call (its trace context) is still read for every call."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent import futures
from typing import Any

import grpc
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from rdurack.api.server import Server
from rdurack.security.guard import wrap_handler
from rdurack.security.per_method import PerMethod

SERVICE = "test.Echo"
DEADLINE_S = 30.0  # a call's timeout: generous, for a loaded machine


class Counting(grpc.ServerInterceptor):
    """Counts its runs per method; the handler it builds notes `name` in `seen` on
    every call, so the order of the chain shows."""

    def __init__(self, name: str, seen: list[str]) -> None:
        self.name, self.seen = name, seen
        self.runs: dict[str, int] = {}

    def intercept_service(self, continuation: Any, details: Any) -> Any:
        self.runs[details.method] = self.runs.get(details.method, 0) + 1
        handler = continuation(details)
        if handler is None:
            return None
        return wrap_handler(handler, on_call=lambda context: self.seen.append(self.name))


def add_echo(server: grpc.Server) -> None:
    def echo(request: bytes, context: grpc.ServicerContext) -> bytes:
        return request

    handlers: dict[str, grpc.RpcMethodHandler[bytes, bytes]] = {
        m: grpc.unary_unary_rpc_method_handler(echo) for m in ("A", "B")
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))


def call(channel: grpc.Channel, method: str, metadata: Any = None) -> bytes:
    echo: Any = channel.unary_unary(f"/{SERVICE}/{method}")  # bytes in, bytes out
    answer: bytes = echo(b"hi", timeout=DEADLINE_S, metadata=metadata)
    return answer


@pytest.fixture
def chain() -> Iterator[tuple[Counting, Counting, list[str], grpc.Channel]]:
    seen: list[str] = []
    outer, inner = Counting("outer", seen), Counting("inner", seen)
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=2),
        interceptors=[PerMethod([outer, inner])],
    )
    add_echo(server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            yield outer, inner, seen, channel
    finally:
        server.stop(0)


def test_the_chain_runs_once_per_method_and_its_handler_on_every_call(
    chain: tuple[Counting, Counting, list[str], grpc.Channel],
) -> None:
    outer, inner, seen, channel = chain
    for method in ("A", "A", "A", "B", "B"):
        assert call(channel, method) == b"hi"
    runs = {f"/{SERVICE}/A": 1, f"/{SERVICE}/B": 1}
    assert outer.runs == runs and inner.runs == runs
    # Five calls, each through both wrappers, the outer one first.
    assert seen == ["outer", "inner"] * 5


def test_a_method_no_service_has_is_unimplemented_every_time(
    chain: tuple[Counting, Counting, list[str], grpc.Channel],
) -> None:
    outer, _, _, channel = chain
    for _ in range(2):
        with pytest.raises(grpc.RpcError) as raised:
            call(channel, "Missing")
        assert raised.value.code() == grpc.StatusCode.UNIMPLEMENTED
    assert outer.runs == {f"/{SERVICE}/Missing": 2}  # not kept: asked again


def test_each_call_of_a_method_continues_its_own_clients_trace() -> None:
    spans = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    server = Server([(SERVICE, add_echo)], tracer_provider=provider)
    traces = [f"{n:032x}" for n in (0xA1, 0xB2, 0xC3)]
    try:
        with grpc.insecure_channel(server.address) as channel:
            for trace_id in traces:
                parent = [("traceparent", f"00-{trace_id}-{0xF1:016x}-01")]
                assert call(channel, "A", metadata=parent) == b"hi"
    finally:
        server.stop(0)
    served = [s for s in spans.get_finished_spans() if s.name == f"{SERVICE}/A"]
    assert [f"{s.context.trace_id:032x}" for s in served if s.context] == traces
    assert all(s.parent is not None and s.parent.span_id == 0xF1 for s in served)
