"""Tracing baseline: gRPC context propagation, hardware spans on the emulated timeline,
the orchestrator's spans, and the one-time SDK set-up. Every test has its own
TracerProvider; none touches the global one (configure() runs in a subprocess)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from rdurack.api.server import Server, channel
from rdurack.node_agent.socket import Socket
from rdurack.orchestrator.jobs import JobState
from rdurack.orchestrator.orchestrator import Orchestrator
from rdurack.orchestrator.store import JobStore
from rdurack.rack.kernels import FusionPlan, Phase
from rdurack.rack.models import model
from rdurack.rack.presets import platform
from rdurack.telemetry import names
from rdurack.telemetry.propagation import extract, inject
from tests.support.fake_rack import FakeGateway, spec

RACK = platform("sn40l-rack16")
JOB = "job-t"
HEALTH = "grpc.health.v1.Health"


def _one(exporter: InMemorySpanExporter, name: str) -> ReadableSpan:
    found = [s for s in exporter.get_finished_spans() if s.name == name]
    assert len(found) == 1, [s.name for s in exporter.get_finished_spans()]
    return found[0]


def _health(ch: grpc.Channel) -> Any:
    return health_pb2_grpc.HealthStub(ch)  # its stubs lack Check and Watch


def _wait_for(exporter: InMemorySpanExporter, name: str, timeout_s: float = 5) -> None:
    """Server spans end just after the reply is sent: wait for them."""
    deadline = time.monotonic() + timeout_s
    while not any(s.name == name for s in exporter.get_finished_spans()):
        assert time.monotonic() < deadline, f"no span {name!r}"
        time.sleep(0.01)


# ---------------------------------------------------------------- carriers


def test_a_carrier_round_trips_the_current_context(
    spans: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    provider, _ = spans
    with provider.get_tracer("t").start_as_current_span("parent") as parent:
        carrier = inject()
    assert set(carrier) >= {"traceparent"}
    restored = trace.get_current_span(extract(carrier)).get_span_context()
    assert restored.trace_id == parent.get_span_context().trace_id
    assert restored.span_id == parent.get_span_context().span_id
    assert not trace.get_current_span(extract(None)).get_span_context().is_valid


# ---------------------------------------------------------------- gRPC


@pytest.fixture
def served(
    spans: tuple[TracerProvider, InMemorySpanExporter],
) -> Iterator[tuple[Server, grpc.Channel]]:
    provider, _ = spans
    server = Server([], tracer_provider=provider)  # health and reflection only
    ch = channel(server.address, tracer_provider=provider)
    yield server, ch
    ch.close()
    server.stop(0)


def test_the_server_span_continues_the_clients_trace(
    spans: tuple[TracerProvider, InMemorySpanExporter], served: tuple[Server, grpc.Channel]
) -> None:
    provider, exporter = spans
    _, ch = served
    stub = _health(ch)
    with provider.get_tracer("t").start_as_current_span("caller") as caller:
        reply = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=5)
    assert reply.status == health_pb2.HealthCheckResponse.SERVING
    _wait_for(exporter, f"{HEALTH}/Check")
    spans_by_kind = {
        s.kind: s for s in exporter.get_finished_spans() if s.name == f"{HEALTH}/Check"
    }
    client, server = spans_by_kind[SpanKind.CLIENT], spans_by_kind[SpanKind.SERVER]
    trace_id = caller.get_span_context().trace_id
    assert client.context is not None and server.context is not None
    assert client.context.trace_id == server.context.trace_id == trace_id
    assert client.parent is not None and server.parent is not None
    assert client.parent.span_id == caller.get_span_context().span_id
    assert server.parent.span_id == client.context.span_id
    assert server.parent.is_remote
    for span in (client, server):
        assert span.attributes is not None
        assert span.attributes[names.RPC_SYSTEM] == "grpc"
        assert span.attributes[names.RPC_SERVICE] == HEALTH
        assert span.attributes[names.RPC_METHOD] == "Check"
        assert span.attributes[names.RPC_GRPC_STATUS_CODE] == grpc.StatusCode.OK.value[0]
        assert span.status.status_code is StatusCode.UNSET


def test_rpc_errors_are_recorded_on_both_ends(
    spans: tuple[TracerProvider, InMemorySpanExporter], served: tuple[Server, grpc.Channel]
) -> None:
    _, exporter = spans
    _, ch = served
    with pytest.raises(grpc.RpcError) as raised:
        _health(ch).Check(health_pb2.HealthCheckRequest(service="no.such.Service"), timeout=5)
    assert raised.value.code() is grpc.StatusCode.NOT_FOUND
    _wait_for(exporter, f"{HEALTH}/Check")
    by_kind = {s.kind: s for s in exporter.get_finished_spans()}
    client, server = by_kind[SpanKind.CLIENT], by_kind[SpanKind.SERVER]
    not_found = grpc.StatusCode.NOT_FOUND.value[0]
    assert client.attributes is not None and server.attributes is not None
    assert client.attributes[names.RPC_GRPC_STATUS_CODE] == not_found
    assert server.attributes[names.RPC_GRPC_STATUS_CODE] == not_found
    # Semantic conventions: any non-OK code fails a client span, only server faults a
    # server span.
    assert client.status.status_code is StatusCode.ERROR
    assert server.status.status_code is StatusCode.UNSET


def test_an_undecodable_request_still_gets_a_server_span(
    spans: tuple[TracerProvider, InMemorySpanExporter], served: tuple[Server, grpc.Channel]
) -> None:
    _, exporter = spans
    _, ch = served
    raw: Any = ch.unary_unary(f"/{HEALTH}/Check")  # no serializers: bytes as they are
    with pytest.raises(grpc.RpcError) as raised:
        raw(b"\xff\xff\xff", timeout=5)
    assert raised.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    _wait_for(exporter, f"{HEALTH}/Check")
    server = next(s for s in exporter.get_finished_spans() if s.kind is SpanKind.SERVER)
    assert server.attributes is not None
    code = grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert server.attributes[names.RPC_GRPC_STATUS_CODE] == code


def test_a_server_stream_span_ends_with_the_stream(
    spans: tuple[TracerProvider, InMemorySpanExporter], served: tuple[Server, grpc.Channel]
) -> None:
    _, exporter = spans
    _, ch = served
    stream = _health(ch).Watch(health_pb2.HealthCheckRequest(service=""))
    assert next(stream).status == health_pb2.HealthCheckResponse.SERVING
    stream.cancel()
    _wait_for(exporter, f"{HEALTH}/Watch")
    kinds = {s.kind for s in exporter.get_finished_spans() if s.name == f"{HEALTH}/Watch"}
    assert kinds == {SpanKind.CLIENT, SpanKind.SERVER}


# ---------------------------------------------------------------- hardware spans


def test_a_kernel_span_is_on_the_emulated_timeline(
    spans: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    provider, exporter = spans
    s = Socket("rdu-n0-s3", RACK, tracer_provider=provider)
    try:
        before = time.time_ns()
        s.reserve(JOB)
        after = time.time_ns()
        m = model("llama2-7b")
        with provider.get_tracer("t").start_as_current_span("agent") as agent:
            carrier = inject()
        # The socket's clock is not at 0: the anchor is the job's first operation.
        first = s.run_kernel(
            JOB, m, Phase.DECODE, FusionPlan.KERNEL_LOOPED, 1, 1024, 8, 20, 5_000, carrier
        )
        second = s.run_kernel(
            JOB, m, Phase.DECODE, FusionPlan.KERNEL_LOOPED, 1, 1024, 8, 4, None, carrier
        )
    finally:
        s.close()
    kernels = sorted(
        (x for x in exporter.get_finished_spans() if x.name == names.SPAN_KERNEL),
        key=lambda x: x.start_time or 0,
    )
    assert len(kernels) == 2
    k1, k2 = kernels
    assert k1.start_time is not None and k1.end_time is not None
    assert k2.start_time is not None and k2.end_time is not None
    anchor = k1.start_time
    assert before <= anchor <= after  # wall time of the reservation
    assert k1.end_time - k1.start_time == first.duration_ns
    assert k2.start_time == anchor + second.start_ns - first.start_ns
    assert k2.end_time == anchor + second.end_ns - first.start_ns
    for span, run, steps in ((k1, first, 20), (k2, second, 4)):
        assert span.parent is not None and span.context is not None
        assert span.parent.span_id == agent.get_span_context().span_id
        assert span.context.trace_id == agent.get_span_context().trace_id
        assert span.attributes is not None
        assert span.attributes[names.ATTR_SOCKET] == "rdu-n0-s3"
        assert span.attributes[names.ATTR_JOB_ID] == JOB
        assert span.attributes[names.ATTR_EMULATED_NS] == run.duration_ns
        assert span.attributes[names.ATTR_EMULATED_START_NS] == run.start_ns
        assert span.attributes[names.ATTR_KERNEL_CALLS] == run.kernel_calls
        assert span.attributes[names.ATTR_HBM_BYTES] == run.hbm_bytes
        assert span.attributes[names.ATTR_STEPS] == steps


def test_a_collective_span_carries_its_bytes(
    spans: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    provider, exporter = spans
    ids = ["rdu-n0-s0", "rdu-n0-s1"]
    pair = [Socket(sid, RACK, timeout_s=5.0, tracer_provider=provider) for sid in ids]
    try:
        peers = {s.name: s.address() for s in pair}
        for s in pair:
            s.connect(peers)
            s.reserve(JOB)
        with provider.get_tracer("t").start_as_current_span("agent"):
            carrier = inject()
        with ThreadPoolExecutor(2) as pool:
            futures = [
                pool.submit(
                    s.collective,
                    JOB,
                    "send",
                    "t",
                    ids,
                    nbytes=4096,
                    dtype="uint8",
                    carrier=carrier,
                )
                for s in pair
            ]
            runs = {r.socket_id: r for r in (f.result(timeout=30) for f in futures)}
    finally:
        for s in pair:
            s.close()
    done = {
        str((x.attributes or {})[names.ATTR_SOCKET]): x
        for x in exporter.get_finished_spans()
        if x.name == names.SPAN_COLLECTIVE
    }
    assert set(done) == set(ids)
    for sid, span in done.items():
        attrs = span.attributes
        assert attrs is not None and span.start_time is not None and span.end_time is not None
        assert attrs[names.ATTR_COLLECTIVE_OP] == "send"
        assert attrs[names.ATTR_BYTES] == 4096
        assert attrs[names.ATTR_BYTES_SENT] == runs[sid].bytes_sent
        assert attrs[names.ATTR_BYTES_RECEIVED] == runs[sid].bytes_received
        assert attrs[names.ATTR_EMULATED_NS] == runs[sid].duration_ns
        assert span.end_time - span.start_time == runs[sid].duration_ns
    assert done[ids[0]].attributes is not None
    assert (done[ids[0]].attributes or {})[names.ATTR_BYTES_SENT] == 4096
    assert (done[ids[1]].attributes or {})[names.ATTR_BYTES_RECEIVED] == 4096


# ---------------------------------------------------------------- orchestrator


def test_the_orchestrator_traces_scheduling_and_each_job(
    spans: tuple[TracerProvider, InMemorySpanExporter], tmp_path: Path
) -> None:
    provider, exporter = spans
    gateway = FakeGateway()
    o = Orchestrator(
        JobStore(tmp_path / "jobs.sqlite"), gateway, RACK, poll_s=0.05, tracer_provider=provider
    )
    o.start()
    try:
        job, _ = o.submit(spec(sockets=8, steps=4))
        deadline = time.monotonic() + 10
        while o.get(job.id).state is not JobState.SUCCEEDED:
            assert time.monotonic() < deadline, o.get(job.id)
            time.sleep(0.02)
        _wait_for(exporter, names.SPAN_JOB)
    finally:
        o.stop()
    schedule = _one(exporter, names.SPAN_SCHEDULE)
    run = _one(exporter, names.SPAN_JOB)
    assert schedule.attributes is not None and run.attributes is not None
    assert schedule.attributes[names.ATTR_JOBS_PLACED] == 1
    assert run.attributes[names.ATTR_JOB_ID] == job.id
    assert run.attributes[names.ATTR_JOB_MODEL] == "llama2-7b"
    assert run.attributes[names.ATTR_JOB_PHASE] == "decode"
    assert len(run.attributes[names.ATTR_JOB_SOCKETS]) == 8  # type: ignore[arg-type]
    assert schedule.context is not None
    assert [link.context.span_id for link in run.links] == [schedule.context.span_id]


# ---------------------------------------------------------------- set-up


def _python(code: str, **env: str) -> str:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env={**clean, **env}
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout.strip()


def test_configure_without_an_endpoint_installs_no_exporter_and_is_idempotent() -> None:
    code = (
        "from opentelemetry import trace\n"
        "from rdurack.telemetry import setup\n"
        "p = setup.configure('rdu-n0-s3')\n"
        "assert p is not None and trace.get_tracer_provider() is p\n"
        "assert setup.configure('other') is p\n"
        "assert setup.processors() == []\n"
        "assert p._active_span_processor._span_processors == ()\n"
        "print(p.resource.attributes['service.name'])\n"
        "setup.shutdown()\n"
    )
    assert _python(code) == "rdu-n0-s3"
    assert _python(code, OTEL_SERVICE_NAME="mine") == "mine"


def test_a_socket_keeps_its_own_name_and_an_endpoint_gets_a_large_batch_queue() -> None:
    code = (
        "from opentelemetry.sdk.trace.export import BatchSpanProcessor\n"
        "from rdurack.telemetry import setup\n"
        "p = setup.configure('rdu-n1-s7', env_name_wins=False)\n"
        "assert p is not None\n"
        "[bsp] = p._active_span_processor._span_processors\n"
        "assert isinstance(bsp, BatchSpanProcessor)\n"
        "assert bsp._batch_processor._max_queue_size == setup.MAX_QUEUE_SIZE == 65536\n"
        "print(type(bsp._batch_processor._exporter).__name__)\n"
        "print(p.resource.attributes['service.name'])\n"
        "setup.shutdown()\n"
    )
    out = _python(code, OTEL_SERVICE_NAME="mine", OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:9")
    assert out.split() == ["OTLPSpanExporter", "rdu-n1-s7"]


def test_a_disabled_sdk_installs_nothing() -> None:
    code = "from rdurack.telemetry import setup\nprint(setup.configure('x'))\n"
    assert _python(code, OTEL_SDK_DISABLED="true") == "None"


def test_progressive_training_traces_each_stage_and_each_block_freeze(
    spans: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    from rdurack.rack.spec import Tier
    from rdurack.workloads.training.job import TrainingWorkload

    provider, exporter = spans
    s = Socket("rdu-n0-s0", RACK, tracer_provider=provider)
    w = TrainingWorkload(
        strategy="progressive",
        blocks=3,
        hidden=32,
        world_size=1,
        global_batch=64,
        steps=6,
        dataset="synthetic",  # no scikit-learn import for six steps
    )
    try:
        s.reserve(JOB)
        report = s.train(JOB, w, [s.name])
        assert report.finished and len(report.result["stages"]) == 6
        assert report.peak_bytes["ddr"] > 0  # blocks waited in DDR ...
        s.release(JOB)
        assert s.memory.allocations() == []  # ... and nothing is left behind
    finally:
        s.close()
    done = exporter.get_finished_spans()
    stages = [x for x in done if x.name == names.SPAN_TRAIN_STAGE]
    freezes = sorted(
        (x for x in done if x.name == names.SPAN_TRAIN_FREEZE), key=lambda x: x.start_time or 0
    )
    got = [str((x.attributes or {})[names.ATTR_TRAIN_STAGE]) for x in stages]
    assert got == [f"shrink block {i}" for i in (2, 1, 0)] + [f"grow block {i}" for i in range(3)]
    for x, r in zip(stages, report.result["stages"], strict=True):
        a = x.attributes or {}
        assert a[names.ATTR_PEAK_BYTES.format(tier="hbm")] == r["peak_bytes"]["hbm"]
        assert a[names.ATTR_TRAIN_ACCURACY] == r["test_accuracy"]
        assert a[names.ATTR_STEPS] == r["steps"]
        assert a[names.ATTR_EMULATED_NS] == pytest.approx(r["emulated_s"] * 1e9, abs=1)
    assert [(x.attributes or {})[names.ATTR_TRAIN_BLOCK] for x in freezes] == [0, 1, 2]
    # Freezing block i brings block i+1 and its output module from DDR: a copy at the
    # socket's DDR->HBM bandwidth; nothing follows the last.
    split_bytes = {1: (32 * 32 + 32 + 10 * 32 + 10) * 4, 2: (32 * 32 + 32 + 10 * 32 + 10) * 4}
    copy = {i: s.memory.copy_time_s(n, Tier.DDR, Tier.HBM) for i, n in split_bytes.items()}
    durations = [(x.attributes or {})[names.ATTR_EMULATED_NS] for x in freezes]
    assert durations[0] == pytest.approx(copy[1] * 1e9, abs=2)
    assert durations[1] == pytest.approx(copy[2] * 1e9, abs=2)
    assert durations[2] == 0
