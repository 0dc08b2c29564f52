"""The control plane over gRPC in tests: job specs, calls that follow page tokens, waits
with deadlines, and clean-up of what a test left on the shared node agents."""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import grpc
import pytest

from rdurack.api.server import Server
from rdurack.orchestrator.orchestrator import Orchestrator
from rdurack.v1 import common_pb2, job_pb2, job_pb2_grpc, node_agent_pb2, rack_pb2_grpc
from tests.support.agents import ServedAgent

PLATFORM = "sn40l-rack16"
PENDING = common_pb2.JOB_STATE_PENDING
SCHEDULED = common_pb2.JOB_STATE_SCHEDULED
RUNNING = common_pb2.JOB_STATE_RUNNING
SUCCEEDED = common_pb2.JOB_STATE_SUCCEEDED
FAILED = common_pb2.JOB_STATE_FAILED
CANCELLED = common_pb2.JOB_STATE_CANCELLED
TERMINAL = frozenset({SUCCEEDED, FAILED, CANCELLED})
LIVE = [PENDING, SCHEDULED, RUNNING]
SOCKET_ID = re.compile(r"^rdu-n(\d+)-s(\d+)$")
# Status codes a well-behaved server may answer anything with; UNKNOWN and INTERNAL mean
# an exception escaped the service.
IMPROPER = frozenset({grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL})


# ------------------------------------------------------------------ helpers


def kernel(
    *,
    phase: common_pb2.Phase.ValueType = common_pb2.PHASE_DECODE,
    sockets: int = 8,
    tokens: int = 20,
    sequence_length: int = 1024,
    model: str = "llama2-7b",
    plan: common_pb2.FusionPlan.ValueType = common_pb2.FUSION_PLAN_KERNEL_LOOPED,
    name: str = "",
    client_request_id: str = "",
    platform_name: str = PLATFORM,
) -> job_pb2.JobSpec:
    """A kernel job spec; prefill jobs get output_tokens 0, as the proto asks."""
    return job_pb2.JobSpec(
        name=name,
        platform=platform_name,
        client_request_id=client_request_id,
        payload_mode=common_pb2.PAYLOAD_MODE_TIMING,
        kernel=job_pb2.KernelJob(
            model=model,
            phase=phase,
            fusion_plan=plan,
            sequence_length=sequence_length,
            batch_size=1,
            num_sockets=sockets,
            output_tokens=tokens if phase == common_pb2.PHASE_DECODE else 0,
        ),
    )


def prefill(sockets: int, name: str = "") -> job_pb2.JobSpec:
    return kernel(
        phase=common_pb2.PHASE_PREFILL,
        sockets=sockets,
        sequence_length=128,
        plan=common_pb2.FUSION_PLAN_FUSED_HO,
        name=name,
    )


def submit(stub: job_pb2_grpc.JobServiceStub, spec: job_pb2.JobSpec) -> job_pb2.Job:
    return stub.SubmitJob(job_pb2.SubmitJobRequest(spec=spec), timeout=30).job


def list_all(
    stub: job_pb2_grpc.JobServiceStub,
    states: Iterable[common_pb2.JobState.ValueType] = (),
    page_size: int = 0,
) -> list[job_pb2.Job]:
    """Every job (in `states`), following page tokens."""
    jobs: list[job_pb2.Job] = []
    token = ""
    for _ in range(10_000):
        reply = stub.ListJobs(
            job_pb2.ListJobsRequest(
                states=list(states),
                page_size=page_size,
                page_token=token,
            ),
            timeout=30,
        )
        jobs.extend(reply.jobs)
        token = reply.next_page_token
        if not token:
            return jobs
    raise AssertionError("ListJobs never stopped returning page tokens")


def wait_terminal(
    stub: job_pb2_grpc.JobServiceStub, ids: Iterable[str], timeout_s: float = 60.0
) -> dict[str, job_pb2.Job]:
    """The jobs once all of them are in a terminal state."""
    wanted = set(ids)
    deadline = time.monotonic() + timeout_s
    while True:
        jobs = {j.id: j for j in list_all(stub) if j.id in wanted}
        if len(jobs) == len(wanted) and all(j.state in TERMINAL for j in jobs.values()):
            return jobs
        if time.monotonic() > deadline:
            states = {i: common_pb2.JobState.Name(j.state) for i, j in jobs.items()}
            missing = sorted(wanted - set(jobs))
            raise AssertionError(
                f"not all terminal after {timeout_s} s: {states}; not listed: {missing}"
            )
        time.sleep(0.05)


def drain(stub: job_pb2_grpc.JobServiceStub, timeout_s: float = 60.0) -> None:
    """Wait until no job is live; cancel whatever still is at the deadline, then fail."""
    deadline = time.monotonic() + timeout_s
    while True:
        live = list_all(stub, LIVE)
        if not live:
            return
        if time.monotonic() > deadline:
            for j in live:
                with contextlib.suppress(grpc.RpcError):
                    stub.CancelJob(job_pb2.CancelJobRequest(job_id=j.id, reason="drain"))
            raise AssertionError(f"jobs still live after {timeout_s} s: {[j.id for j in live]}")
        time.sleep(0.05)


def watch(
    stub: job_pb2_grpc.JobServiceStub, job_id: str, after: int = 0, timeout_s: float = 60.0
) -> list[job_pb2.JobEvent]:
    stream = stub.WatchJob(
        job_pb2.WatchJobRequest(job_id=job_id, after_sequence=after), timeout=timeout_s
    )
    return list(stream)


def kinds(events: list[job_pb2.JobEvent]) -> list[str]:
    return [e.WhichOneof("event") or "" for e in events]


def state_changes(events: list[job_pb2.JobEvent]) -> list[job_pb2.JobStateChange]:
    return [e.state_change for e in events if e.WhichOneof("event") == "state_change"]


def event_time(events: list[job_pb2.JobEvent], state: common_pb2.JobState.ValueType) -> int:
    """Wall-clock ns of the event that moved the job to `state`."""
    for e in events:
        if e.WhichOneof("event") == "state_change" and e.state_change.to_state == state:
            return e.time.ToNanoseconds()
    raise AssertionError(f"no event to {common_pb2.JobState.Name(state)}")


def nodes_of(job: job_pb2.Job) -> dict[int, list[int]]:
    """node index -> socket indices of a job, checking each SocketRef is consistent."""
    out: dict[int, list[int]] = {}
    for ref in job.sockets:
        match = SOCKET_ID.match(ref.id)
        assert match, ref.id
        assert (int(match[1]), int(match[2])) == (ref.node_index, ref.socket_index), ref
        out.setdefault(ref.node_index, []).append(ref.socket_index)
    return out


def rpc_error(call: Callable[[], object]) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as err:
        call()
    return err.value


def held_sockets(agents: list[ServedAgent]) -> dict[str, str]:
    """socket id -> job id, for every socket an agent reports reserved."""
    return {
        s.ref.id: s.current_job_id
        for a in agents
        for s in a.stub.GetNode(node_agent_pb2.GetNodeRequest(), timeout=30).node.sockets
        if s.current_job_id
    }


def release_held(agents: list[ServedAgent], job_ids: Iterable[str]) -> dict[str, str]:
    """Release sockets still reserved for `job_ids` on the agents (clean-up); returns
    what was released."""
    ids = set(job_ids)
    stale = {s: j for s, j in held_sockets(agents).items() if j in ids}
    for a in agents:
        for sid, job_id in stale.items():
            if sid in a.agent.socket_ids:
                a.stub.ReleaseSockets(
                    node_agent_pb2.ReleaseSocketsRequest(job_id=job_id, socket_ids=[sid]),
                    timeout=30,
                )
    return stale


# ------------------------------------------------------------------ the in-process orchestrator


@dataclass
class Control:
    orchestrator: Orchestrator
    server: Server
    channel: grpc.Channel
    jobs: job_pb2_grpc.JobServiceStub
    racks: rack_pb2_grpc.RackServiceStub
