"""A client of rdurack.v1.JobService: submit, get, list (page by page), watch, cancel,
each with a deadline, over a channel that carries the caller's credentials
(`Target.channel`). Failed calls raise grpc.RpcError; `connection.RackCallFailed` says
them to a user."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

import grpc

from rdurack.client.connection import RPC_TIMEOUT_S, deadline_passed
from rdurack.v1 import common_pb2, job_pb2, job_pb2_grpc

TERMINAL = frozenset(
    {
        common_pb2.JOB_STATE_SUCCEEDED,
        common_pb2.JOB_STATE_FAILED,
        common_pb2.JOB_STATE_CANCELLED,
    }
)
PAGE_SIZE = 500  # jobs per ListJobs call


def ended(job: job_pb2.Job) -> bool:
    """Has the job reached a state it never leaves?"""
    return job.state in TERMINAL


class JobClient:
    def __init__(self, channel: grpc.Channel, timeout_s: float = RPC_TIMEOUT_S) -> None:
        """`timeout_s`: the deadline of each unary call (a watch takes its own)."""
        self._jobs = job_pb2_grpc.JobServiceStub(channel)
        self.timeout_s = timeout_s

    def submit(self, spec: job_pb2.JobSpec) -> job_pb2.SubmitJobResponse:
        """The job as the orchestrator stored it, and whether its client request id made
        this a resubmission (`deduplicated`)."""
        reply: job_pb2.SubmitJobResponse = self._jobs.SubmitJob(
            job_pb2.SubmitJobRequest(spec=spec), timeout=self.timeout_s
        )
        return reply

    def get(self, job_id: str) -> job_pb2.Job:
        reply = self._jobs.GetJob(job_pb2.GetJobRequest(job_id=job_id), timeout=self.timeout_s)
        return reply.job

    def logs(self, job_id: str, rank: int | None = None) -> list[job_pb2.RankLog]:
        """What a script job's ranks printed (or rank `rank`), by rank."""
        request = job_pb2.GetJobLogsRequest(job_id=job_id, rank=rank)
        return list(self._jobs.GetJobLogs(request, timeout=self.timeout_s).logs)

    def cancel(self, job_id: str, reason: str) -> job_pb2.Job:
        request = job_pb2.CancelJobRequest(job_id=job_id, reason=reason)
        return self._jobs.CancelJob(request, timeout=self.timeout_s).job

    def list(
        self, states: Sequence[common_pb2.JobState.ValueType] = (), limit: int = 1000
    ) -> list[job_pb2.Job]:
        """Up to `limit` jobs, newest first (only those in `states` if any), page by page."""
        jobs: list[job_pb2.Job] = []
        page_token = ""
        while len(jobs) < limit:
            request = job_pb2.ListJobsRequest(
                states=states, page_size=min(PAGE_SIZE, limit - len(jobs)), page_token=page_token
            )
            page = self._jobs.ListJobs(request, timeout=self.timeout_s)
            jobs += page.jobs
            page_token = page.next_page_token
            if not page_token or not page.jobs:
                break
        return jobs[:limit]

    def watch(self, job_id: str, timeout_s: float) -> Iterator[job_pb2.JobEvent]:
        """The job's events (state changes, progress) until it ends; grpc.RpcError with
        DEADLINE_EXCEEDED if it has not ended after `timeout_s` wall seconds."""
        request = job_pb2.WatchJobRequest(job_id=job_id)
        yield from self._jobs.WatchJob(request, timeout=timeout_s)

    def follow(
        self,
        job_id: str,
        timeout_s: float,
        on_event: Callable[[job_pb2.JobEvent], None],
    ) -> bool:
        """Hand each of the job's events to `on_event` until the job ends (True), or
        until `timeout_s` wall seconds have passed (False)."""
        try:
            for event in self.watch(job_id, timeout_s):
                on_event(event)
        except grpc.RpcError as e:
            if deadline_passed(e):
                return False
            raise
        return True
