"""rdurack.v1.JobService, the orchestrator on the wire; `serve_api` serves it with
RackService (rack_service.py) and AdminService.

Who calls comes from the Authenticator (bearer tokens; open without a tokens file):
a tenant submits jobs as its own and sees, watches and cancels only those (another
tenant's job id is PERMISSION_DENIED, the same answer as an id that does not exist);
an admin sees every job. Field bounds are JOB_BOUNDS, checked by the server's request
guard before any method runs; JOB_MAX_REQUEST_BYTES bounds a whole request.
"""

from __future__ import annotations

from collections.abc import Iterator

import grpc

from rdurack.api.admin_service import SERVICE as ADMIN_SERVICE
from rdurack.api.admin_service import AdminService
from rdurack.api.forward import Forwarder
from rdurack.api.rack_service import SERVICE as RACK_SERVICE
from rdurack.api.rack_service import Joining, RackService
from rdurack.api.server import Server
from rdurack.api.status import rpc, rpc_stream
from rdurack.errors import InvalidRequest, NotLeader
from rdurack.orchestrator.fault_injector import FaultInjector
from rdurack.orchestrator.logs import read_logs
from rdurack.orchestrator.orchestrator import Orchestrator
from rdurack.security.auth import Authenticator
from rdurack.security.guard import Bounds
from rdurack.security.tls import TlsConfig
from rdurack.v1 import job_pb2, job_pb2_grpc
from rdurack.wire import jobs as jc
from rdurack.wire.passes import passes_from_proto
from rdurack.wire.served import served_from_proto
from rdurack.workloads.coe.spec import MAX_PROMPT_CHARS, MAX_REQUESTS
from rdurack.workloads.training.job import MAX_LOOP_BYTES

JOB_SERVICE = job_pb2.DESCRIPTOR.services_by_name["JobService"].full_name
# Answered from the store at once (never waiting on a stream, the rack or the leader):
# they run on a small pool of their own (api/quick_calls.py).
QUICK_METHODS = frozenset(
    f"/{JOB_SERVICE}/{m}" for m in ("SubmitJob", "GetJob", "ListJobs", "CancelJob")
)
MAX_PAGE = 1000
MAX_ID = 200  # characters: ids, request ids, names, cancel reasons

# Every field of every JobService/RackService request: strings up to MAX_ID characters
# and 1024 entries per repeated field, except the fields a CoE or training job needs
# larger (the workload models' own limits: prompts, traces, the pickled loop).
_V1 = "rdurack.v1"
JOB_BOUNDS = Bounds(
    max_chars=MAX_ID,
    max_items=1024,
    chars={
        f"{_V1}.CoeInferenceJob.prompts": MAX_PROMPT_CHARS,
        f"{_V1}.CoeTraceRequest.prompt": MAX_PROMPT_CHARS,
    },
    items={
        f"{_V1}.CoeInferenceJob.prompts": MAX_REQUESTS,
        f"{_V1}.CoeInferenceJob.expert_hints": MAX_REQUESTS,
        f"{_V1}.CoeInferenceJob.trace": MAX_REQUESTS,
        f"{_V1}.CoeInferenceJob.pinned_experts": 10_000,
    },
    bytes_={f"{_V1}.TrainingJob.loop": MAX_LOOP_BYTES, f"{_V1}.TrainingJob.script": MAX_LOOP_BYTES},
)
# The largest JobService request (4 MiB, gRPC's own default): a pickled loop
# (MAX_LOOP_BYTES, 1 MiB) or a trace of MAX_REQUESTS short requests fits; gRPC answers
# RESOURCE_EXHAUSTED above it, before decoding anything.
JOB_MAX_REQUEST_BYTES = 4 << 20


class JobService(job_pb2_grpc.JobServiceServicer):
    """`tls`: the server's own files; a follower forwards an endpoint's passes to the
    leader over an in-rack channel made of them (api/forward.py)."""

    def __init__(
        self,
        orchestrator: Orchestrator,
        auth: Authenticator | None = None,
        tls: TlsConfig | None = None,
    ) -> None:
        self.o = orchestrator
        self.auth = auth or Authenticator.open()
        self.forwarder = Forwarder(tls)

    def add_to(self, server: grpc.Server) -> None:
        job_pb2_grpc.add_JobServiceServicer_to_server(self, server)

    @rpc
    def SubmitJob(
        self, request: job_pb2.SubmitJobRequest, context: grpc.ServicerContext
    ) -> job_pb2.SubmitJobResponse:
        caller = self.auth.principal(context)
        if not request.HasField("spec"):
            raise InvalidRequest("spec: required")
        request_id = request.spec.client_request_id
        spec = jc.spec_from_proto(request.spec, self.o.platform.name)
        job, created = self.o.submit(spec, request_id or None, caller.owner)
        return job_pb2.SubmitJobResponse(job=jc.job_to_proto(job), deduplicated=not created)

    @rpc
    def GetJob(
        self, request: job_pb2.GetJobRequest, context: grpc.ServicerContext
    ) -> job_pb2.GetJobResponse:
        scope = self.auth.principal(context).scope
        job = self.o.get(_job_id(request.job_id), scope)
        return job_pb2.GetJobResponse(job=jc.job_to_proto(job))

    @rpc
    def GetJobLogs(
        self, request: job_pb2.GetJobLogsRequest, context: grpc.ServicerContext
    ) -> job_pb2.GetJobLogsResponse:
        scope = self.auth.principal(context).scope
        job = self.o.get(_job_id(request.job_id), scope)
        root = self.o.checkpoint_dir
        if job.spec.workload.kind != "training" or root is None:
            return job_pb2.GetJobLogsResponse()
        rank = request.rank if request.HasField("rank") else None
        logs = read_logs(root / job.id, job.spec.sockets, rank)
        return job_pb2.GetJobLogsResponse(
            logs=[job_pb2.RankLog(rank=g.rank, text=g.text, truncated=g.truncated) for g in logs]
        )

    @rpc
    def ListJobs(
        self, request: job_pb2.ListJobsRequest, context: grpc.ServicerContext
    ) -> job_pb2.ListJobsResponse:
        scope = self.auth.principal(context).scope
        states = []
        for s in request.states:
            if s not in jc.STATE_FROM_PROTO:
                raise InvalidRequest(f"states: {s} is not a job state")
            states.append(jc.STATE_FROM_PROTO[s])
        size = min(request.page_size or MAX_PAGE, MAX_PAGE)
        # Newest first. The token is the submission number of the last job sent, so a
        # page never repeats or skips jobs while new ones arrive.
        before = None
        if request.page_token:
            try:
                before = int(request.page_token)
            except ValueError:
                raise InvalidRequest(
                    f"page_token: {request.page_token[:40]!r} is not ours"
                ) from None
        jobs = [j for j in reversed(self.o.jobs(states, scope)) if before is None or j.seq < before]
        page = jobs[:size]
        return job_pb2.ListJobsResponse(
            jobs=[jc.job_to_proto(j) for j in page],
            next_page_token=str(page[-1].seq) if len(jobs) > size else "",
        )

    @rpc
    def CancelJob(
        self, request: job_pb2.CancelJobRequest, context: grpc.ServicerContext
    ) -> job_pb2.CancelJobResponse:
        scope = self.auth.principal(context).scope
        job = self.o.cancel(_job_id(request.job_id), request.reason, scope)
        return job_pb2.CancelJobResponse(job=jc.job_to_proto(job))

    @rpc
    def RunPasses(
        self, request: job_pb2.RunPassesRequest, context: grpc.ServicerContext
    ) -> job_pb2.RunPassesResponse:
        scope = self.auth.principal(context).scope
        passes = passes_from_proto(request.passes)
        try:
            durations, start_ns = self.o.run_passes(
                _job_id(request.job_id),
                request.offset_ns,
                passes,
                request.kv_tokens,
                scope,
                served_from_proto(request.served, len(passes)),
            )
        except NotLeader as refused:  # the leader runs the job: ask it
            return self.forwarder.run_passes(refused, request, context)
        return job_pb2.RunPassesResponse(duration_ns=durations, job_start_ns=start_ns)

    @rpc_stream
    def WatchJob(
        self, request: job_pb2.WatchJobRequest, context: grpc.ServicerContext
    ) -> Iterator[job_pb2.JobEvent]:
        scope = self.auth.principal(context).scope
        events = self.o.watch(
            _job_id(request.job_id), request.after_sequence, context.add_callback, scope
        )
        for event in events:
            yield jc.event_to_proto(event)


def _job_id(value: str) -> str:
    """A job id the request must set (its length is bounded by JOB_BOUNDS)."""
    if not value:
        raise InvalidRequest("job_id: required")
    return value


def serve_api(
    orchestrator: Orchestrator,
    auth: Authenticator | None = None,
    *,
    faults: FaultInjector | None = None,
    host: str = "127.0.0.1",
    port: int = 0,
    tls: TlsConfig | None = None,
    health_port: int | None = None,
    workers: int = 16,
    joining: Joining | None = None,
) -> Server:
    """The orchestrator's public server: JobService and RackService with their bounds,
    request size limit, tokens (`auth`) and TLS, as orchestrator_main runs it; with
    `faults`, AdminService too (admins only); with `joining`, agents on other hosts may
    join the rack (rack_service.py)."""
    auth = auth or Authenticator.open()
    services = [
        (JOB_SERVICE, JobService(orchestrator, auth, tls).add_to),
        (RACK_SERVICE, RackService(orchestrator, auth, joining).add_to),
    ]
    if faults is not None:
        services.append((ADMIN_SERVICE, AdminService(faults, auth).add_to))
    return Server(
        services,
        host=host,
        port=port,
        tls=tls,
        auth=auth,
        bounds=JOB_BOUNDS,
        max_receive_bytes=JOB_MAX_REQUEST_BYTES,
        health_port=health_port,
        workers=workers,
        quick=QUICK_METHODS,
    )
