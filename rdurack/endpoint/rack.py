"""An endpoint on a running rack (`rdu serve --rack`): each model's sockets are held by
an endpoint job of the orchestrator, and its engine's iterations run on them as forward
passes (JobService.RunPasses), so the sockets' clocks, memory and trace lanes show the
serving, and a failed socket shows at the endpoint.

`RackModel` is one model's executor: it submits the job, waits until the job runs,
sends each iteration (its pass, and the KV cache its engine's requests hold), and takes
the pass's duration on the slowest socket as the iteration's. A pass the rack cannot
run (the job queued again after a socket failed, the orchestrator unreachable) raises
Unavailable, which the engine answers with 503; the next iteration tries again, and a
job that ended (cancelled by hand) is submitted anew.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence

import grpc
from opentelemetry import context as otel_context

from rdurack.endpoint.engine import Unavailable
from rdurack.telemetry.served import SERVED_KEY, PassesServed
from rdurack.v1 import common_pb2, job_pb2, job_pb2_grpc
from rdurack.wire.passes import pass_to_proto
from rdurack.wire.served import served_to_proto
from rdurack.workloads.serving.stream.pricing import Pass, Pricer
from rdurack.workloads.serving.stream.scheduler import Scheduler

# How long an endpoint job may wait for its sockets, wall s (other jobs may hold them).
HOLD_TIMEOUT_S = 60.0
# A pass's call, wall s: a pass is milliseconds to seconds of emulated time, and the
# sockets answer as soon as they priced it (unless the rack paces its own clocks).
PASS_TIMEOUT_S = 30.0
TERMINAL = {
    common_pb2.JOB_STATE_SUCCEEDED,
    common_pb2.JOB_STATE_FAILED,
    common_pb2.JOB_STATE_CANCELLED,
}


class RackModel:
    """One model of the endpoint on the rack's sockets: an executor of its engine."""

    def __init__(
        self,
        channel: grpc.Channel,
        platform: str,
        pricer: Pricer,
        scheduler: Scheduler,
        hold_timeout_s: float = HOLD_TIMEOUT_S,
    ) -> None:
        self.jobs = job_pb2_grpc.JobServiceStub(channel)
        self.platform = platform
        self.pricer = pricer
        self.scheduler = scheduler
        self.hold_timeout_s = hold_timeout_s
        self.job_id: str | None = None

    @property
    def model(self) -> str:
        return self.pricer.model.name

    def hold(self) -> str:
        """Submit the model's endpoint job and wait until it runs; its id."""
        spec = job_pb2.JobSpec(
            name=f"rdu serve {self.model}",
            platform=self.platform,
            endpoint=job_pb2.EndpointJob(model=self.model, num_sockets=self.pricer.sockets),
        )
        job = self.jobs.SubmitJob(job_pb2.SubmitJobRequest(spec=spec), timeout=PASS_TIMEOUT_S).job
        deadline = time.monotonic() + self.hold_timeout_s
        while job.state != common_pb2.JOB_STATE_RUNNING:
            if job.state in TERMINAL:
                why = job.error_message or common_pb2.JobState.Name(job.state)
                raise Unavailable(f"{self.model}: its endpoint job {job.id} ended: {why}")
            if time.monotonic() > deadline:
                self.release(job.id)
                raise Unavailable(
                    f"{self.model}: its endpoint job {job.id} waited {self.hold_timeout_s:g} s "
                    f"for {self.pricer.sockets} sockets; are other jobs holding them?"
                )
            job = self._next_state(job.id)
        self.job_id = job.id
        return job.id

    def _next_state(self, job_id: str) -> job_pb2.Job:
        """The job after its next event (WatchJob), or as it is after a short wait."""
        try:
            for _ in self.jobs.WatchJob(job_pb2.WatchJobRequest(job_id=job_id), timeout=1.0):
                break
        except grpc.RpcError as e:
            if e.code() != grpc.StatusCode.DEADLINE_EXCEEDED:
                raise
        return self.jobs.GetJob(job_pb2.GetJobRequest(job_id=job_id), timeout=PASS_TIMEOUT_S).job

    def release(self, job_id: str | None = None) -> None:
        """Cancel the endpoint job: its sockets are free again."""
        job_id = job_id or self.job_id
        if job_id is None:
            return
        # Already finished, or the rack is gone: nothing is held.
        with contextlib.suppress(grpc.RpcError):
            self.jobs.CancelJob(
                job_pb2.CancelJobRequest(job_id=job_id, reason="the endpoint stopped"),
                timeout=PASS_TIMEOUT_S,
            )
        if job_id == self.job_id:
            self.job_id = None

    async def __call__(self, passes: Sequence[Pass], start_s: float) -> list[float]:
        # The KV cache, read here, on the event loop that changes the scheduler.
        request = job_pb2.RunPassesRequest(
            offset_ns=round(start_s * 1e9),
            passes=[pass_to_proto(p) for p in passes],
            kv_tokens=self.scheduler.reserved_tokens,
        )
        # The requests each pass served, when the endpoint traces them (its tracing puts
        # them in the call's context, endpoint/tracing.py): the sockets' pass spans link
        # to theirs. The thread runs in a copy of this context: the RPC's span is a
        # child of the call's.
        served = otel_context.get_value(SERVED_KEY)
        if isinstance(served, PassesServed):
            request.served.CopyFrom(served_to_proto(served))
        return await asyncio.to_thread(self._run, request)

    def _run(self, request: job_pb2.RunPassesRequest) -> list[float]:
        try:
            request.job_id = self.job_id or self.hold()
            reply = self.jobs.RunPasses(request, timeout=PASS_TIMEOUT_S)
        except grpc.RpcError as e:
            self._forget_if_ended()
            raise Unavailable(
                f"{self.model}: the rack did not run its pass: {e.details()}"
            ) from None
        return [d / 1e9 for d in reply.duration_ns]

    def _forget_if_ended(self) -> None:
        """After a failed pass: a job that ended is replaced at the next iteration."""
        if self.job_id is None:
            return
        try:
            job = self.jobs.GetJob(job_pb2.GetJobRequest(job_id=self.job_id), timeout=5.0).job
        except grpc.RpcError:
            return  # the orchestrator is unreachable: keep the job, try it again
        if job.state in TERMINAL:
            self.job_id = None
