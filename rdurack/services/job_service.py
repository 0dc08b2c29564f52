"""rdurack.v1.JobService and rdurack.v1.RackService: the orchestrator on the wire."""

from __future__ import annotations

from collections.abc import Iterator

import grpc

from rdurack.orchestrator.orchestrator import Orchestrator
from rdurack.rack.errors import InvalidRequest
from rdurack.services import job_convert as jc
from rdurack.services.errors import rpc, rpc_stream
from rdurack.v1 import job_pb2, job_pb2_grpc, rack_pb2, rack_pb2_grpc

JOB_SERVICE = job_pb2.DESCRIPTOR.services_by_name["JobService"].full_name
RACK_SERVICE = rack_pb2.DESCRIPTOR.services_by_name["RackService"].full_name
MAX_PAGE = 1000
MAX_ID = 200  # bytes: ids and request ids longer than this are not ours


class JobService(job_pb2_grpc.JobServiceServicer):
    def __init__(self, orchestrator: Orchestrator) -> None:
        self.o = orchestrator

    def add_to(self, server: grpc.Server) -> None:
        job_pb2_grpc.add_JobServiceServicer_to_server(self, server)

    @rpc
    def SubmitJob(
        self, request: job_pb2.SubmitJobRequest, context: grpc.ServicerContext
    ) -> job_pb2.SubmitJobResponse:
        if not request.HasField("spec"):
            raise InvalidRequest("spec: required")
        request_id = _bounded(request.spec.client_request_id, "spec.client_request_id")
        spec = jc.spec_from_proto(request.spec, self.o.platform.name)
        job, created = self.o.submit(spec, request_id or None)
        return job_pb2.SubmitJobResponse(job=jc.job_to_proto(job), deduplicated=not created)

    @rpc
    def GetJob(
        self, request: job_pb2.GetJobRequest, context: grpc.ServicerContext
    ) -> job_pb2.GetJobResponse:
        return job_pb2.GetJobResponse(job=jc.job_to_proto(self.o.get(_job_id(request.job_id))))

    @rpc
    def ListJobs(
        self, request: job_pb2.ListJobsRequest, context: grpc.ServicerContext
    ) -> job_pb2.ListJobsResponse:
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
        jobs = [j for j in reversed(self.o.jobs(states)) if before is None or j.seq < before]
        page = jobs[:size]
        return job_pb2.ListJobsResponse(
            jobs=[jc.job_to_proto(j) for j in page],
            next_page_token=str(page[-1].seq) if len(jobs) > size else "",
        )

    @rpc
    def CancelJob(
        self, request: job_pb2.CancelJobRequest, context: grpc.ServicerContext
    ) -> job_pb2.CancelJobResponse:
        job = self.o.cancel(_job_id(request.job_id), _bounded(request.reason, "reason"))
        return job_pb2.CancelJobResponse(job=jc.job_to_proto(job))

    @rpc_stream
    def WatchJob(
        self, request: job_pb2.WatchJobRequest, context: grpc.ServicerContext
    ) -> Iterator[job_pb2.JobEvent]:
        events = self.o.watch(_job_id(request.job_id), request.after_sequence, context.is_active)
        for event in events:
            yield jc.event_to_proto(event)


class RackService(rack_pb2_grpc.RackServiceServicer):
    def __init__(self, orchestrator: Orchestrator) -> None:
        self.o = orchestrator

    def add_to(self, server: grpc.Server) -> None:
        rack_pb2_grpc.add_RackServiceServicer_to_server(self, server)

    @rpc
    def GetRack(
        self, request: rack_pb2.GetRackRequest, context: grpc.ServicerContext
    ) -> rack_pb2.GetRackResponse:
        nodes = [jc.node_to_proto(n) for n in self.o.rack()]
        return rack_pb2.GetRackResponse(
            rack=rack_pb2.RackStatus(platform=self.o.platform.name, nodes=nodes)
        )

    @rpc
    def ListNodes(
        self, request: rack_pb2.ListNodesRequest, context: grpc.ServicerContext
    ) -> rack_pb2.ListNodesResponse:
        return rack_pb2.ListNodesResponse(nodes=[jc.node_to_proto(n) for n in self.o.rack()])


def _bounded(value: str, field: str) -> str:
    if len(value) > MAX_ID:
        raise InvalidRequest(f"{field}: longer than {MAX_ID} characters")
    return value


def _job_id(value: str) -> str:
    if not value:
        raise InvalidRequest("job_id: required")
    return _bounded(value, "job_id")
