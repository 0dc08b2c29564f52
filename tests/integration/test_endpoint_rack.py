"""`rdu serve --rack` on the real cluster (Ray socket actors, node agents over gRPC, the
orchestrator's JobService): a model's endpoint job holds its sockets, the engine's
iterations run on them as passes, and its requests' emulated times are the predictor's
replay; the sockets' clocks and HBM show the work until the endpoint releases them."""

from __future__ import annotations

import asyncio

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from rdurack.api.server import channel
from rdurack.endpoint import tracing
from rdurack.endpoint.server import engines, on_rack
from rdurack.rack.models import builtin_models
from rdurack.rack.presets import platform
from rdurack.telemetry import names
from rdurack.v1 import common_pb2, rack_pb2
from rdurack.workloads.predictor import Predictor
from rdurack.workloads.serving.stream.arrivals import Arrival
from rdurack.workloads.serving.stream.replay import StreamSetting, replay
from rdurack.workloads.serving.stream.scheduler import Policy
from tests.support.control import PLATFORM, Control, wait_terminal
from tests.unit.endpoint.test_engine import _all
from tests.unit.endpoint.test_tracing import _served

MODEL = "llama3.1-8b"


def _sockets(control: Control, job_id: str) -> list[rack_pb2.SocketStatus]:
    rack = control.racks.GetRack(rack_pb2.GetRackRequest(), timeout=30).rack
    return [s for n in rack.nodes for s in n.sockets if s.current_job_id == job_id]


def test_an_endpoint_serves_on_the_racks_sockets(control: Control) -> None:
    p = Predictor(platform(PLATFORM))
    setting = StreamSetting(MODEL, 2, Policy.CONTINUOUS, max_batch=8)
    served = engines(p, [MODEL], setting, builtin_models(), 0.0, rack=control.channel)
    (model,) = on_rack(served)
    job_id = model.hold()
    before = {s.ref.id: s.emulated_clock_ns for s in _sockets(control, job_id)}
    assert len(before) == 2

    lengths = [(500, 16), (120, 30), (2000, 4), (64, 9)]
    got = asyncio.run(_all(served[MODEL], lengths))
    want = replay(p, setting, [Arrival(i, 0.0, a, b) for i, (a, b) in enumerate(lengths)],
                  builtin_models())  # fmt: skip
    e2e = sorted(t[-1].emulated_s for t in got)
    assert e2e[-1] == pytest.approx(want.e2e_s.max, rel=1e-6)
    assert sum(t[0].emulated_s for t in got) / 4 == pytest.approx(want.ttft_s.mean, rel=1e-6)

    after = _sockets(control, job_id)
    for s in after:  # each socket ran every pass: its clock moved by the whole stream
        assert s.emulated_clock_ns - before[s.ref.id] >= round(want.e2e_s.max * 1e9) - 100
        hbm = next(t for t in s.tiers if t.tier == common_pb2.TIER_HBM)
        assert hbm.used_bytes > p.platform.socket.hbm.capacity_bytes * 0.05  # weights, 1/2

    model.release()
    assert wait_terminal(control.jobs, [job_id])[job_id].state == common_pb2.JOB_STATE_CANCELLED


def test_a_traced_endpoints_calls_carry_the_requests_they_served(control: Control) -> None:
    """The requests each pass served cross the real orchestrator, node agents and Ray
    actors (PassesServed on the wire, then an actor call's argument): the passes run,
    and each call is a trace the requests' spans link to. (The sockets' own spans are
    in their actors' processes: tests/unit/endpoint/test_tracing_rack.py checks their
    links.)"""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("test")
    p = Predictor(platform(PLATFORM))
    setting = StreamSetting(MODEL, 2, Policy.CONTINUOUS, max_batch=8)
    with channel(control.server.address, provider) as ch:
        served = engines(p, [MODEL], setting, builtin_models(), 0.0, rack=ch)
        (model,) = on_rack(served)
        job_id = model.hold()
        tracing.watch(served.values(), tracer)
        got = asyncio.run(_served(served[MODEL], tracer, [(200, 6), (50, 9)]))
        model.release()
    assert [len(t) for t in got] == [6, 9]
    calls = [s for s in exporter.get_finished_spans() if s.name == names.SPAN_ENDPOINT_PASSES]
    rpcs = [s for s in exporter.get_finished_spans() if s.name.endswith("JobService/RunPasses")]
    assert len(calls) == len(rpcs) >= 9  # one iteration a call at time scale 0
    assert {s.parent.span_id for s in rpcs if s.parent} == {c.context.span_id for c in calls}
    decode = [s for s in exporter.get_finished_spans() if s.name == names.SPAN_REQUEST_DECODE]
    assert sorted(len(s.links) for s in decode) == [5, 8]  # a call per decode iteration
    assert wait_terminal(control.jobs, [job_id])[job_id].state == common_pb2.JOB_STATE_CANCELLED
