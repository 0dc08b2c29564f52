"""gRPC's own retries on rdurack's channels: a read that meets UNAVAILABLE is sent
again; a call that changes something is not, unless the caller says it may be."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from google.protobuf import descriptor_pool

from rdurack.api.job_service import JOB_SERVICE
from rdurack.api.retry import IDEMPOTENT, SUBMIT_JOB
from rdurack.api.server import Server, channel
from rdurack.v1 import (
    admin_pb2,  # noqa: F401  (registers AdminService in the descriptor pool)
    job_pb2,
    job_pb2_grpc,
    node_agent_pb2,  # noqa: F401  (registers NodeAgentService)
    rack_pb2,  # noqa: F401  (registers RackService)
)


class FailsFirst:
    """JobService's GetJob and SubmitJob: each answers UNAVAILABLE to its first call,
    then serves; counts calls."""

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()
        self._lock = threading.Lock()

    def _count(self, method: str, context: grpc.ServicerContext) -> None:
        with self._lock:
            self.calls[method] += 1
            first = self.calls[method] == 1
        if first:
            context.abort(grpc.StatusCode.UNAVAILABLE, "restarting")

    def get_job(
        self, request: job_pb2.GetJobRequest, context: grpc.ServicerContext
    ) -> job_pb2.GetJobResponse:
        self._count("GetJob", context)
        return job_pb2.GetJobResponse(job=job_pb2.Job(id=request.job_id))

    def submit_job(
        self, request: job_pb2.SubmitJobRequest, context: grpc.ServicerContext
    ) -> job_pb2.SubmitJobResponse:
        self._count("SubmitJob", context)
        return job_pb2.SubmitJobResponse(job=job_pb2.Job(id="j-1"))

    def add_to(self, server: grpc.Server) -> None:
        handlers: dict[str, grpc.RpcMethodHandler[Any, Any]] = {
            "GetJob": grpc.unary_unary_rpc_method_handler(
                self.get_job,
                request_deserializer=job_pb2.GetJobRequest.FromString,
                response_serializer=job_pb2.GetJobResponse.SerializeToString,
            ),
            "SubmitJob": grpc.unary_unary_rpc_method_handler(
                self.submit_job,
                request_deserializer=job_pb2.SubmitJobRequest.FromString,
                response_serializer=job_pb2.SubmitJobResponse.SerializeToString,
            ),
        }
        server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(JOB_SERVICE, handlers),)
        )


@pytest.fixture
def served() -> Iterator[tuple[FailsFirst, str]]:
    jobs = FailsFirst()
    server = Server([(JOB_SERVICE, jobs.add_to)])
    yield jobs, server.address
    server.stop(0)


def test_a_read_is_sent_again_after_unavailable(served: tuple[FailsFirst, str]) -> None:
    jobs, address = served
    with channel(address) as ch:
        reply = job_pb2_grpc.JobServiceStub(ch).GetJob(
            job_pb2.GetJobRequest(job_id="j-7"), timeout=10
        )
    assert reply.job.id == "j-7"
    assert jobs.calls["GetJob"] == 2


def test_a_submission_is_not_sent_again(served: tuple[FailsFirst, str]) -> None:
    jobs, address = served
    with channel(address) as ch, pytest.raises(grpc.RpcError) as raised:
        job_pb2_grpc.JobServiceStub(ch).SubmitJob(job_pb2.SubmitJobRequest(), timeout=10)
    assert isinstance(raised.value, grpc.Call)
    assert raised.value.code() is grpc.StatusCode.UNAVAILABLE
    assert jobs.calls["SubmitJob"] == 1


def test_a_caller_that_sets_request_ids_may_retry_submissions(
    served: tuple[FailsFirst, str],
) -> None:
    jobs, address = served
    with channel(address, retried={*IDEMPOTENT, SUBMIT_JOB}) as ch:
        request = job_pb2.SubmitJobRequest(spec=job_pb2.JobSpec(client_request_id="once"))
        assert job_pb2_grpc.JobServiceStub(ch).SubmitJob(request, timeout=10).job.id == "j-1"
    assert jobs.calls["SubmitJob"] == 2


@pytest.mark.parametrize("method", sorted({*IDEMPOTENT, SUBMIT_JOB}))
def test_every_retried_method_exists(method: str) -> None:
    service, _, name = method.partition("/")
    found = descriptor_pool.Default().FindServiceByName(service).FindMethodByName(name)
    assert found is not None
