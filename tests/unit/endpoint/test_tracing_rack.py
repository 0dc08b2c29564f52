"""A request's trace joined to the socket lanes (`rdu serve --rack`, endpoint/tracing.py):
each call of passes is a trace from the endpoint's `endpoint.passes` span down the
RunPasses RPC to each socket's `rdu.serve.pass` spans; each pass span links to the
requests it served and names its iteration; each request's phase spans link to the
calls that ran its iterations. Sockets are real Socket objects behind a real gRPC
JobService, without Ray (tests/support/socket_rack.py); every span goes to the test's
own in-memory exporter."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from rdurack.api.job_service import JOB_SERVICE, JobService
from rdurack.api.server import Server, channel
from rdurack.endpoint import tracing
from rdurack.endpoint.server import engines, on_rack
from rdurack.errors import InvalidRequest
from rdurack.orchestrator.orchestrator import Orchestrator
from rdurack.orchestrator.store import JobStore
from rdurack.rack.models import builtin_models
from rdurack.telemetry import names
from rdurack.telemetry.served import PassesServed, ServedRequest
from rdurack.v1 import served_pb2
from rdurack.wire.served import served_from_proto, served_to_proto
from rdurack.workloads.predictor import Predictor
from rdurack.workloads.serving.stream.replay import StreamSetting
from rdurack.workloads.serving.stream.scheduler import Policy
from tests.support.fake_rack import RACK
from tests.support.socket_rack import SocketGateway
from tests.unit.endpoint.test_tracing import _children, _named, _served

MODEL = "llama3.1-70b"
SETTING = StreamSetting(MODEL, 8, Policy.CONTINUOUS, max_batch=4)
Spans = tuple[TracerProvider, InMemorySpanExporter]


@dataclass
class Rack:
    orchestrator: Orchestrator
    channel: grpc.Channel


@pytest.fixture
def rack(tmp_path: Path, spans: Spans) -> Iterator[Rack]:
    """An orchestrator on Socket objects, its JobService on a free port, every span of
    them (RPCs, sockets) to the test's provider."""
    provider = spans[0]
    gateway = SocketGateway(tracer_provider=provider)
    o = Orchestrator(
        JobStore(tmp_path / "jobs.sqlite"), gateway, RACK, heartbeat_s=None,
        tracer_provider=provider,
    )  # fmt: skip
    o.start()
    server = Server([(JOB_SERVICE, JobService(o).add_to)], tracer_provider=provider)
    ch = channel(server.address, provider)
    try:
        yield Rack(o, ch)
    finally:
        ch.close()
        server.stop(0)
        o.stop()
        gateway.close()
        o.store.close()


def _links(s: ReadableSpan) -> set[tuple[int, int]]:
    return {(link.context.trace_id, link.context.span_id) for link in s.links}


def _id(s: ReadableSpan) -> tuple[int, int]:
    return s.context.trace_id, s.context.span_id


def test_each_pass_links_to_the_requests_it_served_and_they_to_its_call(
    rack: Rack, spans: Spans
) -> None:
    provider, exporter = spans
    tracer = provider.get_tracer("test")
    # At a time scale where a call to the rack lasts longer than an iteration, calls
    # carry several planned iterations: passes[i] is the engine's iteration first + i.
    served = engines(Predictor(RACK), [MODEL], SETTING, builtin_models(), 0.02, rack=rack.channel)
    (model,) = on_rack(served)
    model.hold()
    engine = served[MODEL]
    tracing.watch([engine], tracer)
    lengths = [(300, 30), (1200, 12), (64, 40), (700, 20)]
    got = asyncio.run(_served(engine, tracer, lengths))
    assert [len(t) for t in got] == [o for _, o in lengths]
    model.release()

    roots = {_id(r): r for r in _named(exporter, "request")}
    assert len(roots) == 4
    # What each request's trace says: (iteration, request) it took part in, with the
    # iteration's batch, and the calls its phase spans link to.
    took: dict[tuple[int, int], int] = {}
    linked_calls: dict[tuple[int, int], set[tuple[int, int]]] = {}
    for key, root in roots.items():
        request = int(str((root.attributes or {})[names.ATTR_REQUEST]))
        phases = [s for group in _children(exporter, root).values() for s in group]
        for s in phases:
            for e in s.events:
                a = e.attributes or {}
                took[(int(str(a[names.ATTR_ITERATION])), request)] = int(str(a[names.ATTR_BATCH]))
        linked_calls[key] = set().union(*(_links(s) for s in phases))

    calls = _named(exporter, names.SPAN_ENDPOINT_PASSES)
    assert max(int(str((c.attributes or {})[names.ATTR_STEPS])) for c in calls) > 1
    passes = _named(exporter, names.SPAN_PASS)
    assert passes
    on_lanes: set[tuple[int, int]] = set()
    for p in passes:
        a = p.attributes or {}
        iteration = int(str(a[names.ATTR_ITERATION]))
        assert p.links, f"pass of iteration {iteration} links to no request"
        for link in p.links:
            root = roots[(link.context.trace_id, link.context.span_id)]
            index = (link.attributes or {})[names.ATTR_REQUEST]
            assert index == (root.attributes or {})[names.ATTR_REQUEST]
            assert took[(iteration, int(str(index)))] == a[names.ATTR_BATCH]
            on_lanes.add((iteration, int(str(index))))
    # Every iteration of every request is a pass on the lanes that links back to it.
    assert on_lanes == set(took)

    # Each call is a trace: the endpoint's span, the RPC it made under it, the passes.
    by_trace = {c.context.trace_id: c for c in calls}
    for c in calls:
        assert c.parent is None and c.kind is SpanKind.INTERNAL
    rpc = [s for s in exporter.get_finished_spans() if s.name == "rdurack.v1.JobService/RunPasses"]
    clients = [s for s in rpc if s.kind is SpanKind.CLIENT]
    assert {s.context.trace_id for s in clients} == set(by_trace)
    for s in clients:
        assert (
            s.parent is not None
            and s.parent.span_id == by_trace[s.context.trace_id].context.span_id
        )
    assert {p.context.trace_id for p in passes} <= set(by_trace)
    # A call links to the requests it served; a request's phases link to those calls.
    for key in roots:
        serving = {_id(c) for c in calls if key in _links(c)}
        assert serving and linked_calls[key] == serving


def test_what_a_call_served_crosses_the_wire_and_is_checked() -> None:
    served = PassesServed.of(
        7,
        [[ServedRequest(0, 1 << 100, 5)], [ServedRequest(0, 1 << 100, 5), ServedRequest(3, 9, 2)]],
    )
    assert served.requests == (ServedRequest(0, 1 << 100, 5), ServedRequest(3, 9, 2))
    assert served.passes == ((0,), (0, 1))
    assert served_from_proto(served_to_proto(served), 2) == served
    assert served_from_proto(served_pb2.PassesServed(), 2) is None  # nothing traced
    links = served.links()
    assert [[link.context.span_id for link in p] for p in links] == [[5], [5, 2]]
    assert links[1][1].attributes == {names.ATTR_REQUEST: 3}

    def refused(m: served_pb2.PassesServed, passes: int, why: str) -> None:
        with pytest.raises(InvalidRequest, match=why):
            served_from_proto(m, passes)

    good = served_to_proto(served)
    refused(good, 3, r"served.passes: one per pass \(3\), got 2")
    short = served_pb2.PassesServed()
    short.CopyFrom(good)
    short.requests[1].span_id = b"\x01"
    refused(short, 2, r"served.requests\[1\]: a trace id of 16 bytes and a span id of 8")
    zero = served_pb2.PassesServed()
    zero.CopyFrom(good)
    zero.requests[0].trace_id = bytes(16)
    refused(zero, 2, r"served.requests\[0\]: all-zero ids")
    beyond = served_pb2.PassesServed()
    beyond.CopyFrom(good)
    beyond.passes[0].requests.append(2)
    refused(beyond, 2, r"served.passes\[0\].requests: indices of served.requests, which has 2")
