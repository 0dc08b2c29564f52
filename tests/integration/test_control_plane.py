"""The control plane: JobService and RackService over gRPC, on the two node agents of the
`rack` fixture. The orchestrator runs in this process for most tests (fast), and as its
own process (`rdurack.processes.orchestrator_main`) for the kill-and-restart test.

Every job a test submits finishes or is cancelled before the test ends: the node agents
are shared with the other integration tests, so no socket may stay reserved.
"""

from __future__ import annotations

import re
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from rdurack.api.job_service import JOB_SERVICE
from rdurack.api.rack_service import SERVICE as RACK_SERVICE
from rdurack.rack.presets import platform
from rdurack.v1 import common_pb2, job_pb2, rack_pb2
from tests.support.agents import ServedAgent
from tests.support.control import (
    CANCELLED,
    FAILED,
    PENDING,
    PLATFORM,
    RUNNING,
    SCHEDULED,
    SUCCEEDED,
    Control,
    event_time,
    held_sockets,
    kernel,
    kinds,
    list_all,
    nodes_of,
    prefill,
    rpc_error,
    state_changes,
    submit,
    wait_terminal,
    watch,
)

pytestmark = pytest.mark.integration

# ------------------------------------------------------------------ end to end


def test_a_job_is_submitted_watched_and_has_its_result(control: Control) -> None:
    stub = control.jobs
    submitted = submit(stub, kernel(sockets=8, tokens=20, name="e2e"))
    assert submitted.id and submitted.state == PENDING and not submitted.sockets
    assert submitted.spec.kernel.model == "llama2-7b"

    events = watch(stub, submitted.id)  # ends once the job is terminal
    assert [e.sequence for e in events] == list(range(1, len(events) + 1))
    assert {e.job_id for e in events} == {submitted.id}
    changes = state_changes(events)
    assert [c.to_state for c in changes] == [PENDING, SCHEDULED, RUNNING, SUCCEEDED]
    assert [c.from_state for c in changes[1:]] == [c.to_state for c in changes[:-1]]

    k = kinds(events)
    running = next(i for i, e in enumerate(events) if e.state_change.to_state == RUNNING)
    done = next(i for i, e in enumerate(events) if e.state_change.to_state == SUCCEEDED)
    progress = [e.progress for e in events[running + 1 : done] if e.HasField("progress")]
    assert len(progress) >= 2
    # Between RUNNING and SUCCEEDED only progress events, then the result (which may come
    # just before or just after the final state change).
    assert set(k[running + 1 : done]) <= {"progress", "result"}, k
    assert k.index("result") > max(i for i, kind in enumerate(k) if kind == "progress"), k
    fractions = [p.fraction for p in progress]
    assert fractions == sorted(set(fractions)), fractions  # strictly increasing
    assert fractions[0] > 0 and fractions[-1] == pytest.approx(1.0)
    results = [e.result for e in events if e.HasField("result")]
    assert len(results) == 1, k
    assert results[0].kernel.emulated_s > 0

    job = stub.GetJob(job_pb2.GetJobRequest(job_id=submitted.id), timeout=30).job
    assert job.state == SUCCEEDED and job.error_message == ""
    assert len(job.sockets) == 8
    placement = nodes_of(job)
    assert len(placement) == 1 and sorted(next(iter(placement.values()))) == list(range(8))
    assert job.emulated_end_ns > job.emulated_start_ns
    kernel_result = job.result.kernel
    assert job.result.WhichOneof("result") == "kernel"
    assert kernel_result.emulated_s == pytest.approx(
        (job.emulated_end_ns - job.emulated_start_ns) / 1e9, abs=1e-6
    )
    assert kernel_result.tokens_per_s > 0
    assert kernel_result.kernel_calls > 0
    assert 0 < kernel_result.hbm_bandwidth_utilization <= 1
    assert 0 < kernel_result.compute_utilization <= 1  # from the sockets' FLOPs
    assert results[0] == job.result
    created, started, ended = (
        job.create_time.ToNanoseconds(),
        job.start_time.ToNanoseconds(),
        job.end_time.ToNanoseconds(),
    )
    assert 0 < created <= started <= ended, (created, started, ended)

    # A watcher resumes where it left off: only the later events, unchanged.
    assert watch(stub, submitted.id, after=3) == events[3:]
    assert watch(stub, submitted.id, after=events[-1].sequence) == []


def test_a_16_socket_job_spans_both_nodes_rail_aligned(control: Control) -> None:
    job_id = submit(control.jobs, kernel(sockets=16, tokens=20, name="wide")).id
    job = wait_terminal(control.jobs, [job_id])[job_id]
    assert job.state == SUCCEEDED, job.error_message
    placement = nodes_of(job)
    assert sorted(placement) == [0, 1]
    assert sorted(placement[0]) == sorted(placement[1]) == list(range(8))
    assert job.result.kernel.emulated_s > 0 and job.result.kernel.tokens_per_s > 0


def test_submit_is_idempotent_on_client_request_id(control: Control) -> None:
    stub = control.jobs
    request_id = f"idem-{uuid.uuid4().hex}"
    spec = prefill(1, name="idempotent")
    spec.client_request_id = request_id
    first = stub.SubmitJob(job_pb2.SubmitJobRequest(spec=spec), timeout=30)
    second = stub.SubmitJob(job_pb2.SubmitJobRequest(spec=spec), timeout=30)
    assert not first.deduplicated and second.deduplicated
    assert second.job.id == first.job.id
    assert second.job.spec.client_request_id == request_id
    assert [j.id for j in list_all(stub) if j.spec.client_request_id == request_id] == [
        first.job.id
    ]
    done = wait_terminal(stub, [first.job.id])[first.job.id]
    assert done.state == SUCCEEDED
    # Still deduplicated once the job has finished: a late retry does not run it again.
    third = stub.SubmitJob(job_pb2.SubmitJobRequest(spec=spec), timeout=30)
    assert third.deduplicated and third.job.id == first.job.id and third.job.state == SUCCEEDED
    # The same request id for another spec is a client bug, refused by name.
    other = prefill(2, name="idempotent")
    other.client_request_id = request_id
    err = rpc_error(lambda: stub.SubmitJob(job_pb2.SubmitJobRequest(spec=other), timeout=30))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "client_request_id" in (err.details() or "")


# ------------------------------------------------------------------ bad input


def _no_workload() -> job_pb2.JobSpec:
    return job_pb2.JobSpec(name="no-workload", platform=PLATFORM)


def _with(**kernel_fields: Any) -> Callable[[], job_pb2.JobSpec]:
    def make() -> job_pb2.JobSpec:
        spec = kernel(sockets=8)
        for name, value in kernel_fields.items():
            setattr(spec.kernel, name, value)
        return spec

    return make


BAD_SPECS: list[tuple[str, Callable[[], job_pb2.JobSpec], list[str]]] = [
    ("no-workload", _no_workload, ["spec.", "workload"]),
    ("phase-unspecified", _with(phase=common_pb2.PHASE_UNSPECIFIED), ["spec.kernel.phase"]),
    ("sequence-length-0", _with(sequence_length=0), ["spec.kernel.sequence_length"]),
    ("17-sockets", _with(num_sockets=17), ["spec.kernel.num_sockets", "17"]),
    ("11-sockets-not-rail-aligned", _with(num_sockets=11), ["spec.kernel.num_sockets", "11"]),
    ("unknown-model", _with(model="llama9-1t"), ["spec.kernel.model", "llama9-1t"]),
    (
        "platform-mismatch",
        lambda: kernel(sockets=8, platform_name="sn40l-node"),
        ["spec.platform", "sn40l-node"],
    ),
]


@pytest.mark.parametrize(("make", "named"), [pytest.param(m, n, id=i) for i, m, n in BAD_SPECS])
def test_a_bad_spec_is_invalid_argument_naming_the_field(
    control: Control, make: Callable[[], job_pb2.JobSpec], named: list[str]
) -> None:
    before = len(list_all(control.jobs))
    err = rpc_error(
        lambda: control.jobs.SubmitJob(job_pb2.SubmitJobRequest(spec=make()), timeout=30)
    )
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, err.details()
    for word in named:
        assert word in (err.details() or ""), (word, err.details())
    assert len(list_all(control.jobs)) == before  # refused before it was stored


def test_a_request_without_spec_is_invalid_argument(control: Control) -> None:
    err = rpc_error(lambda: control.jobs.SubmitJob(job_pb2.SubmitJobRequest(), timeout=30))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "spec" in (err.details() or "")


def test_an_unknown_job_id_is_not_found(control: Control) -> None:
    stub = control.jobs
    missing = "no-such-job-0042"
    calls: dict[str, Callable[[], object]] = {
        "GetJob": lambda: stub.GetJob(job_pb2.GetJobRequest(job_id=missing), timeout=30),
        "CancelJob": lambda: stub.CancelJob(job_pb2.CancelJobRequest(job_id=missing), timeout=30),
        "WatchJob": lambda: watch(stub, missing, timeout_s=30),
    }
    for name, call in calls.items():
        err = rpc_error(call)
        assert err.code() == grpc.StatusCode.NOT_FOUND, (name, err.code(), err.details())
        assert missing in (err.details() or ""), (name, err.details())


def test_a_model_that_does_not_fit_is_resource_exhausted(control: Control) -> None:
    spec = kernel(model="llama3.1-405b", sockets=4, tokens=16)
    err = rpc_error(lambda: control.jobs.SubmitJob(job_pb2.SubmitJobRequest(spec=spec)))
    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, err.details()
    message = err.details() or ""
    asked = re.search(r"HBM cannot hold ([\d,]+) bytes", message)
    free = re.search(r"([\d,]+) bytes free", message)
    assert asked and free, message
    hbm = platform(PLATFORM).socket.hbm.capacity_bytes
    assert int(asked[1].replace(",", "")) > hbm >= int(free[1].replace(",", ""))


def test_cancelling_a_finished_job_is_failed_precondition(control: Control) -> None:
    stub = control.jobs
    job_id = submit(stub, prefill(1, name="finished")).id
    assert wait_terminal(stub, [job_id])[job_id].state == SUCCEEDED
    err = rpc_error(lambda: stub.CancelJob(job_pb2.CancelJobRequest(job_id=job_id), timeout=30))
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "SUCCEEDED" in (err.details() or ""), err.details()
    job = stub.GetJob(job_pb2.GetJobRequest(job_id=job_id), timeout=30).job
    assert job.state == SUCCEEDED and job.result.kernel.emulated_s > 0


# ------------------------------------------------------------------ listing and cancelling


def test_cancel_pending_and_running_jobs_and_list_by_state(
    control: Control, rack: list[ServedAgent]
) -> None:
    stub = control.jobs
    reason = "test: no longer needed"

    # PENDING: the rack is held by a 16-socket job, so an 8-socket job must wait.
    blocker = submit(stub, kernel(sockets=16, tokens=20, name="blocker"))
    waiting = submit(stub, prefill(8, name="waiting"))
    cancelled = stub.CancelJob(
        job_pb2.CancelJobRequest(job_id=waiting.id, reason=reason), timeout=30
    ).job
    assert cancelled.state == CANCELLED and not cancelled.sockets
    assert cancelled.error_message == reason
    changes = state_changes(watch(stub, waiting.id))
    assert [c.to_state for c in changes] == [PENDING, CANCELLED]
    assert changes[-1].reason == reason
    assert wait_terminal(stub, [blocker.id])[blocker.id].state == SUCCEEDED

    # RUNNING: cancel as soon as the watcher sees RUNNING (retry if it finished first).
    running: job_pb2.Job | None = None
    tried: list[str] = []
    for _ in range(8):
        job_id = submit(stub, kernel(sockets=16, tokens=2000, name="to-cancel")).id
        tried.append(job_id)
        stream = stub.WatchJob(job_pb2.WatchJobRequest(job_id=job_id), timeout=60)
        seen: list[job_pb2.JobEvent] = []
        for event in stream:
            seen.append(event)
            if event.state_change.to_state == RUNNING:
                break
        try:
            running = stub.CancelJob(
                job_pb2.CancelJobRequest(job_id=job_id, reason=reason), timeout=30
            ).job
        except grpc.RpcError as e:
            assert e.code() == grpc.StatusCode.FAILED_PRECONDITION, e.details()
            stream.cancel()
            continue
        rest = list(stream)  # the stream ends now that the job is terminal
        changes = state_changes(seen + rest)
        assert [c.to_state for c in changes] == [PENDING, SCHEDULED, RUNNING, CANCELLED]
        break
    assert running is not None, f"every job finished before it could be cancelled: {tried}"
    assert running.state == CANCELLED and running.error_message == reason
    assert len(running.sockets) == 16
    final = wait_terminal(stub, tried)
    assert final[running.id].state == CANCELLED  # a late worker did not overwrite it
    assert not final[running.id].HasField("result")

    # Its sockets are free again: the agents and the orchestrator's rack view agree.
    ids = {ref.id for ref in running.sockets}
    deadline = time.monotonic() + 30
    while True:
        rack_view = control.racks.GetRack(rack_pb2.GetRackRequest(), timeout=30).rack
        holders = {
            s.ref.id: s.current_job_id
            for n in rack_view.nodes
            for s in n.sockets
            if s.ref.id in ids
        }
        if len(holders) == 16 and not any(holders.values()):
            break
        assert time.monotonic() < deadline, f"sockets still held: {holders}"
        time.sleep(0.05)
    assert not set(held_sockets(rack).values()) & set(tried)

    # ListJobs filtered by state, newest first, and paged.
    done = list_all(stub, [SUCCEEDED])
    gone = list_all(stub, [CANCELLED])
    assert done and all(j.state == SUCCEEDED for j in done)
    assert all(j.state == CANCELLED for j in gone)
    assert {waiting.id, running.id} <= {j.id for j in gone}
    assert blocker.id in {j.id for j in done} and blocker.id not in {j.id for j in gone}
    both = list_all(stub, [SUCCEEDED, CANCELLED])
    assert {j.id for j in both} == {j.id for j in done} | {j.id for j in gone}
    assert not list_all(stub, [FAILED])
    everything = list_all(stub)
    assert {j.id for j in both} <= {j.id for j in everything}
    created = [j.create_time.ToNanoseconds() for j in everything]
    assert created == sorted(created, reverse=True), "ListJobs is not newest first"
    order = [j.id for j in everything]
    assert order.index(waiting.id) < order.index(blocker.id)
    assert [j.id for j in list_all(stub, page_size=2)] == order
    assert [j.id for j in list_all(stub, [CANCELLED], page_size=1)] == [j.id for j in gone]


def test_rack_service_shows_both_nodes(control: Control, rack: list[ServedAgent]) -> None:
    status = control.racks.GetRack(rack_pb2.GetRackRequest(), timeout=30).rack
    assert status.platform == PLATFORM
    assert [n.index for n in status.nodes] == [0, 1]
    assert [n.agent_address for n in status.nodes] == [a.server.address for a in rack]
    for n in status.nodes:
        assert n.healthy
        assert [s.ref.id for s in n.sockets] == [f"rdu-n{n.index}-s{i}" for i in range(8)]
        for s in n.sockets:
            assert s.health == rack_pb2.SOCKET_HEALTH_HEALTHY
            assert s.link_address.startswith("127.0.0.1:")
            assert {t.tier for t in s.tiers} == {
                common_pb2.TIER_SRAM,
                common_pb2.TIER_HBM,
                common_pb2.TIER_DDR,
            }
    nodes = control.racks.ListNodes(rack_pb2.ListNodesRequest(), timeout=30).nodes
    assert [n.index for n in nodes] == [0, 1]
    assert [[s.ref.id for s in n.sockets] for n in nodes] == [
        [s.ref.id for s in n.sockets] for n in status.nodes
    ]


# ------------------------------------------------------------------ gang scheduling and queueing


def test_three_8_socket_jobs_share_the_rack_two_at_a_time(control: Control) -> None:
    stub = control.jobs
    specs = [kernel(sockets=8, tokens=20, name=f"gang-{i}") for i in range(3)]
    with ThreadPoolExecutor(max_workers=3) as pool:
        ids = [j.id for j in pool.map(lambda s: submit(stub, s), specs)]

    most = 0
    stop = threading.Event()

    def poll() -> None:
        nonlocal most
        while not stop.is_set():
            active = [j for j in list_all(stub, [SCHEDULED, RUNNING]) if j.id in ids]
            most = max(most, len(active))
            time.sleep(0.002)

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    try:
        jobs = wait_terminal(stub, ids)
    finally:
        stop.set()
        poller.join(timeout=10)
    assert all(j.state == SUCCEEDED for j in jobs.values()), {
        i: (j.state, j.error_message) for i, j in jobs.items()
    }
    assert most <= 2, f"{most} 8-socket jobs active at once on 16 sockets"

    # The event history says the same: at any instant at most two jobs held sockets, and
    # jobs that overlapped in time held disjoint sockets.
    events = {i: watch(stub, i) for i in ids}
    spans = {i: (event_time(e, SCHEDULED), event_time(e, SUCCEEDED)) for i, e in events.items()}
    for i in ids:
        start = spans[i][0]
        overlapping = [j for j in ids if spans[j][0] <= start < spans[j][1]]
        assert len(overlapping) <= 2, spans
        for j in overlapping:
            if j != i:
                assert not {r.id for r in jobs[i].sockets} & {r.id for r in jobs[j].sockets}
    for i in ids:
        assert len(nodes_of(jobs[i])) == 1 and len(jobs[i].sockets) == 8
        assert sum(e.HasField("result") for e in events[i]) == 1
    # Three 8-socket jobs on two nodes: at least two ran on the same sockets (whether they
    # queued or arrived after one another). Those ran one after the other, and the later
    # started at the earlier's emulated end or later (clocks meet at a job's start).
    sockets = {i: {r.id for r in jobs[i].sockets} for i in ids}
    shared = [
        (a, b) for a in ids for b in ids if spans[a][0] < spans[b][0] and sockets[a] == sockets[b]
    ]
    assert shared, "three 8-socket jobs on 16 sockets, yet no two shared a node"
    for a, b in shared:
        assert spans[a][1] <= spans[b][0], (a, b, spans)
        assert jobs[b].emulated_start_ns >= jobs[a].emulated_end_ns


# ------------------------------------------------------------------ health and reflection


def test_orchestrator_serves_health_and_reflection(control: Control) -> None:
    checker: Any = health_pb2_grpc.HealthStub(control.channel)  # its stubs lack Check
    for service in ("", JOB_SERVICE, RACK_SERVICE):
        reply = checker.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING, service
    assert JOB_SERVICE == "rdurack.v1.JobService"
    assert RACK_SERVICE == "rdurack.v1.RackService"

    reflector: Any = reflection_pb2_grpc.ServerReflectionStub(control.channel)
    requests = [
        reflection_pb2.ServerReflectionRequest(list_services=""),
        reflection_pb2.ServerReflectionRequest(file_containing_symbol="rdurack.v1.JobService"),
    ]
    replies = list(reflector.ServerReflectionInfo(iter(requests), timeout=10))
    assert len(replies) == 2
    names = {s.name for s in replies[0].list_services_response.service}
    assert {"rdurack.v1.JobService", "rdurack.v1.RackService"} <= names
    assert "grpc.health.v1.Health" in names
    files = replies[1].file_descriptor_response.file_descriptor_proto
    assert files and any(b"JobService" in f for f in files)
