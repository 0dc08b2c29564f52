"""Traces of a CoE job through a real OTLP gRPC receiver, and the same spans in the trace
files that `rdu trace` turns into Jaeger JSON.

The rack here is started the way a user starts it (`rdu up`, i.e. local_rack.up: a Ray
head, a node agent, the orchestrator, each its own process) with
OTEL_EXPORTER_OTLP_ENDPOINT pointing at a receiver in this process. Why not the session's
in-process `rack` fixture: a socket actor reads the OTLP endpoint from its environment,
and Ray's workers inherit the environment of the process that started Ray, when it
started it (a variable set later in the driver does not reach new actors; a per-actor
`runtime_env` would, but the agent creates its actors without one). The session's Ray
may already be up without the variable. A Ray head of our own, started with it, is how
a user's rack gets it too (README, "Traces in Jaeger"). `rdu down` flushes: each agent
flushes its actors' spans before killing them, and every process flushes at exit.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

from rdurack.services import local_rack
from rdurack.services.grpc_server import channel
from rdurack.services.trace_files import Span, SpanLink, read_trace_dir, select_job, to_jaeger
from rdurack.services.trace_files import validate_jaeger as validate
from rdurack.telemetry import names
from rdurack.v1 import common_pb2, job_pb2, job_pb2_grpc

pytestmark = pytest.mark.integration

SOCKETS = 4  # one node of 4 sockets: one TP4 replica serves the CoE job
EXPERTS = 20


# ------------------------------------------------------------------ an OTLP receiver


def _value(v: AnyValue) -> Any:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [_value(x) for x in v.array_value.values]
    return getattr(v, kind) if kind else None


class Receiver(trace_service_pb2_grpc.TraceServiceServicer):
    """OTLP/gRPC TraceService: keeps every span it is sent, as trace-file Spans."""

    def __init__(self) -> None:
        self.spans: list[Span] = []
        self.requests = 0
        self._lock = threading.Lock()

    def Export(  # noqa: N802  (the gRPC method's name)
        self, request: trace_service_pb2.ExportTraceServiceRequest, context: grpc.ServicerContext
    ) -> trace_service_pb2.ExportTraceServiceResponse:
        got = []
        for rs in request.resource_spans:
            resource = {a.key: _value(a.value) for a in rs.resource.attributes}
            for ss in rs.scope_spans:
                for s in ss.spans:
                    got.append(
                        Span(
                            trace_id=s.trace_id.hex(),
                            span_id=s.span_id.hex(),
                            parent_id=s.parent_span_id.hex() or None,
                            name=s.name,
                            service=str(resource.get(names.SERVICE_NAME, "")),
                            pid=0,
                            start_ns=s.start_time_unix_nano,
                            end_ns=s.end_time_unix_nano,
                            scope=ss.scope.name,
                            attributes={a.key: _value(a.value) for a in s.attributes},
                            links=tuple(
                                SpanLink(k.trace_id.hex(), k.span_id.hex()) for k in s.links
                            ),
                        )
                    )
        with self._lock:
            self.spans.extend(got)
            self.requests += 1
        return trace_service_pb2.ExportTraceServiceResponse()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.fixture(scope="module")
def receiver() -> Iterator[tuple[Receiver, str]]:
    servicer = Receiver()
    server = grpc.server(ThreadPoolExecutor(max_workers=4))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(servicer, server)  # type: ignore[no-untyped-call]
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield servicer, f"http://127.0.0.1:{port}"
    server.stop(0)


# ------------------------------------------------------------------ a traced run


@dataclass
class Run:
    job: job_pb2.Job  # the job the tests look at
    first: job_pb2.Job  # the job that ran before it
    otlp: list[Span]  # every span the receiver got
    trace_dir: Path


def _wait(stub: job_pb2_grpc.JobServiceStub, job_id: str, timeout_s: float = 60) -> job_pb2.Job:
    deadline = time.monotonic() + timeout_s
    terminal = {
        common_pb2.JOB_STATE_SUCCEEDED,
        common_pb2.JOB_STATE_FAILED,
        common_pb2.JOB_STATE_CANCELLED,
    }
    while True:
        job = stub.GetJob(job_pb2.GetJobRequest(job_id=job_id), timeout=30).job
        if job.state in terminal:
            return job
        assert time.monotonic() < deadline, f"job {job_id} still {job.state}"
        time.sleep(0.1)


@pytest.fixture(scope="module")
def run(
    receiver: tuple[Receiver, str],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Run]:
    """A rack up with the OTLP endpoint set, one CoE job, the rack down (flushed)."""
    servicer, endpoint = receiver
    state = tmp_path_factory.mktemp("traced-rack")
    mp = pytest.MonkeyPatch()
    # Before the rack starts: every process it starts (and Ray's workers) inherits it.
    mp.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
    mp.delenv("RDURACK_TRACE_DIR", raising=False)  # rdu up's default: STATE_DIR/traces
    mp.delenv("OTEL_SDK_DISABLED", raising=False)
    mp.delenv("OTEL_SERVICE_NAME", raising=False)
    try:
        rack = local_rack.up(state, nodes=1, sockets_per_node=SOCKETS, port=_free_port())
        try:
            ch = channel(rack.orchestrator)
            stub = job_pb2_grpc.JobServiceStub(ch)
            spec = job_pb2.JobSpec(
                name="traced-coe",
                coe_inference=job_pb2.CoeInferenceJob(
                    num_experts=EXPERTS, num_sockets=SOCKETS, tensor_parallel=SOCKETS
                ),
                payload_mode=common_pb2.PAYLOAD_MODE_TIMING,
            )
            # Two jobs, one after the other: the second starts where the sockets' clocks
            # stopped (not at 0), and the trace files hold another job to leave out.
            jobs = []
            for _ in range(2):
                submitted = stub.SubmitJob(job_pb2.SubmitJobRequest(spec=spec), timeout=30).job
                jobs.append(_wait(stub, submitted.id))
            ch.close()
        finally:
            local_rack.down(state)
    finally:
        mp.undo()
    first, job = jobs
    yield Run(job, first, list(servicer.spans), local_rack.trace_dir(state))


# ------------------------------------------------------------------ helpers


def _job_trace(spans: list[Span], job_id: str) -> list[Span]:
    """Every span of the job span's trace."""
    [job_span] = [s for s in spans if s.name == names.SPAN_JOB and s.job_id == job_id]
    return [s for s in spans if s.trace_id == job_span.trace_id]


def _ancestors(span: Span, by_id: dict[str, Span]) -> list[Span]:
    """Parent, grandparent, ... up to the root (or a parent that was never received)."""
    chain = []
    while span.parent_id is not None and span.parent_id in by_id:
        span = by_id[span.parent_id]
        chain.append(span)
    return chain


# ------------------------------------------------------------------ the tests


def test_the_job_ran_and_its_spans_reached_the_receiver(run: Run) -> None:
    for job in (run.first, run.job):
        assert job.state == common_pb2.JOB_STATE_SUCCEEDED, job.error_message
    assert run.job.emulated_start_ns >= run.first.emulated_end_ns > 0
    services = {s.service for s in run.otlp}
    assert {"rdurack-orchestrator", "rdurack-node-agent-0"} <= services
    assert [s for s in run.otlp if s.name == names.SPAN_JOB and s.job_id == run.job.id]


def test_one_service_per_socket_that_worked(run: Run) -> None:
    hardware = [s for s in _job_trace(run.otlp, run.job.id) if s.hardware]
    assert {s.name for s in hardware} >= {
        names.SPAN_DEPLOY,
        names.SPAN_EXPERT_SWITCH,
        names.SPAN_KERNEL,
    }
    sockets = {s.id for s in run.job.sockets}
    assert len(sockets) == SOCKETS
    assert {s.service for s in hardware} == sockets
    for s in hardware:  # each socket reports as itself, and only its own operations
        assert s.attributes[names.ATTR_SOCKET] == s.service
        assert s.job_id == run.job.id


def test_the_span_tree_is_job_then_node_agent_then_socket_operations(run: Run) -> None:
    spans = _job_trace(run.otlp, run.job.id)
    by_id = {s.span_id: s for s in spans}
    [job_span] = [s for s in spans if s.name == names.SPAN_JOB]
    hardware = [s for s in spans if s.hardware]
    assert hardware
    for op in hardware:
        chain = _ancestors(op, by_id)
        assert chain, f"{op.name} on {op.service} has no parent"
        # Socket operation -> the node agent's span driving its sockets (its parent) ...
        assert chain[0].name == names.SPAN_NODE_PROGRAM
        assert chain[0].service == "rdurack-node-agent-0"
        assert op.service in chain[0].attributes[names.ATTR_SOCKETS]
        # ... -> the agent's RPC server span -> the orchestrator's client span -> job.
        assert [s.name for s in chain[1:]] == [
            "rdurack.v1.NodeAgentService/RunProgram",
            "rdurack.v1.NodeAgentService/RunProgram",
            names.SPAN_JOB,
        ]
        assert [s.service for s in chain[1:]] == [
            "rdurack-node-agent-0",
            "rdurack-orchestrator",
            "rdurack-orchestrator",
        ]
        assert chain[-1] is job_span
    # Today the job span is the root of its trace and links to the scheduling round that
    # placed it (a round's own trace); /tmp/issue7-orchestrator.patch makes the round
    # its parent instead (then: job_span.parent_id == schedule.span_id).
    assert job_span.parent_id is None
    [link] = job_span.links
    [schedule] = [s for s in run.otlp if s.span_id == link.span_id]
    assert schedule.name == names.SPAN_SCHEDULE
    assert schedule.service == "rdurack-orchestrator"
    assert schedule.attributes[names.ATTR_JOBS_PLACED] >= 1
    assert schedule.start_ns <= job_span.start_ns


def test_emulated_timestamps_agree_with_the_jobs_emulated_time(run: Run) -> None:
    job = run.job
    hardware = [s for s in _job_trace(run.otlp, job.id) if s.hardware]
    # The job starts at its sockets' latest clock and its first operation starts there;
    # its last operation ends at the job's emulated end. The result's emulated_s is a
    # float of seconds, so the end agrees to within rounding (1 µs).
    assert min(s.emulated_start_ns for s in hardware) == job.emulated_start_ns
    assert abs(max(s.emulated_end_ns for s in hardware) - job.emulated_end_ns) <= 1000
    emulated_ns = job.emulated_end_ns - job.emulated_start_ns
    assert emulated_ns > 0
    assert abs(emulated_ns - job.result.coe_inference.emulated_s * 1e9) <= 1000
    # Each span's wall stamps are the emulated timeline shifted by one offset per
    # socket: durations are the emulated durations, and so are the gaps between ops.
    for sid in {s.service for s in hardware}:
        mine = sorted((s for s in hardware if s.service == sid), key=lambda s: s.start_ns)
        offset = mine[0].start_ns - mine[0].emulated_start_ns
        for s in mine:
            assert s.end_ns - s.start_ns == s.attributes[names.ATTR_EMULATED_NS]
            assert s.start_ns - s.emulated_start_ns == offset
        # On the wall clock the socket's spans span the job's emulated time.
        wall = max(s.end_ns for s in mine) - min(s.start_ns for s in mine)
        assert abs(wall - emulated_ns) <= 1000


def test_the_trace_files_hold_the_same_spans_and_make_valid_jaeger_json(run: Run) -> None:
    traces = read_trace_dir(run.trace_dir)
    assert traces.bad_lines == 0
    from_files = select_job(traces, run.job.id)
    received = _job_trace(run.otlp, run.job.id)
    assert all(s.job_id in (None, run.job.id) for s in from_files)  # not the first job's
    assert {(s.trace_id, s.span_id) for s in from_files} == {
        (s.trace_id, s.span_id) for s in received
    }
    by_id = {s.span_id: s for s in received}
    for s in from_files:  # the same span, the same stamps and attributes
        twin = by_id[s.span_id]
        assert (s.name, s.service, s.parent_id, s.start_ns, s.end_ns) == (
            twin.name,
            twin.service,
            twin.parent_id,
            twin.start_ns,
            twin.end_ns,
        )
        assert s.attributes == twin.attributes
    doc = json.loads(json.dumps(to_jaeger(from_files)))
    assert validate(doc) == []
    [trace] = doc["data"]
    services = {p["serviceName"] for p in trace["processes"].values()}
    assert {s.id for s in run.job.sockets} <= services
