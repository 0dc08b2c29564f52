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

`reach` is the endpoint's first call: the rack as its orchestrator sees it, asked again
for a bounded time while the orchestrator does not answer, so that an endpoint started
before its rack (a Kubernetes pod, which starts in no order) waits for it rather than
exiting.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
import uuid
from collections.abc import Callable, Sequence
from typing import TypeVar

import grpc
from opentelemetry import context as otel_context

from rdurack.endpoint.engine import Unavailable
from rdurack.errors import RdurackError
from rdurack.telemetry.served import SERVED_KEY, PassesServed
from rdurack.v1 import common_pb2, job_pb2, job_pb2_grpc, rack_pb2, rack_pb2_grpc
from rdurack.wire.passes import bundle_to_proto, pass_to_proto
from rdurack.wire.served import served_to_proto
from rdurack.workloads.serving.stream.pricing import Pass, Pricer
from rdurack.workloads.serving.stream.scheduler import Scheduler

# How long an endpoint job may wait for its sockets, wall s (other jobs may hold them).
HOLD_TIMEOUT_S = 60.0
# A patient hold asks the orchestrator again this long after it did not answer, wall s.
HOLD_RETRY_S = 0.5
# A hold asks for its job's state this often, wall s. A poll of unary calls rather than
# a WatchJob stream: a stream whose in-process server stopped mid-call was seen to wait
# past its deadline and past a cancel from this side (grpc 1.x, twice in full test
# runs), while a unary call in flight on a stopping server ends (CANCELLED).
HOLD_POLL_S = 0.25
# A job not running after this long is waiting for its sockets: worth a line, wall s.
SAY_AFTER_S = 1.0
# A pass's call, wall s: a pass is milliseconds to seconds of emulated time, and the
# sockets answer as soon as they priced it (unless the rack paces its own clocks).
PASS_TIMEOUT_S = 30.0
# While waiting for the orchestrator: each try's bound, and the pause after a failed one,
# doubling from the first to the last, wall s. A try that fails fast (connection refused)
# is asked again soon; the last pause bounds how late an orchestrator that came up is seen.
REACH_TRY_S = 5.0
# The shortest try, near the end of the wait (which it may overrun by as much): long
# enough for a refused connection to say so, rather than its deadline, wall s.
REACH_LAST_TRY_S = 1.0
REACH_PAUSES_S = (0.25, 2.0)
# The orchestrator is not (yet) there, too busy to answer in time, or stopping (a server
# that stops cancels the calls it has in flight: CANCELLED, which these calls never get
# from this side): worth asking again. Anything else (a bad token, a refused argument)
# would answer the same way again.
NOT_YET = frozenset(
    {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED}
)
T = TypeVar("T")
TERMINAL = {
    common_pb2.JOB_STATE_SUCCEEDED,
    common_pb2.JOB_STATE_FAILED,
    common_pb2.JOB_STATE_CANCELLED,
}


class RackNotReached(RdurackError):
    """The orchestrator did not answer within the wait given (exit code 1: the rack
    failed, not the command line)."""

    exit_code = 1


def reach(
    connect: Callable[[], grpc.Channel],
    address: str,
    wait_s: float,
    say: Callable[[str], None],
    clock: Callable[[], float] = time.monotonic,
    pause: Callable[[float], None] = time.sleep,
) -> rack_pb2.RackStatus:
    """The rack as its orchestrator at `address` sees it. While it answers UNAVAILABLE
    or not in time, ask again until `wait_s` (wall s) have passed, saying once that it
    waits and once that it got an answer; then RackNotReached with the last error.
    Other errors are raised at once; with `wait_s` 0 there is a single try.

    Each try opens a channel of its own (`connect`): a channel whose connection failed
    waits out gRPC's reconnect backoff (up to 2 minutes) before trying again, which
    would hide an orchestrator that has come up."""
    start = clock()
    deadline = start + wait_s
    pause_s = REACH_PAUSES_S[0]
    waited = False
    while True:
        try_s = min(REACH_TRY_S, max(REACH_LAST_TRY_S, deadline - clock()))
        try_s = try_s if wait_s else PASS_TIMEOUT_S
        try:
            with connect() as channel:
                stub = rack_pb2_grpc.RackServiceStub(channel)
                rack = stub.GetRack(rack_pb2.GetRackRequest(), timeout=try_s).rack
        except grpc.RpcError as e:
            code = e.code() if isinstance(e, grpc.Call) else None
            if not wait_s or code not in NOT_YET:
                raise
            said = " ".join(((e.details() if isinstance(e, grpc.Call) else None) or "").split())
            why = f"{code.name if code else 'error'}: {said}"
            left = deadline - clock()
            if left <= 0:
                raise RackNotReached(
                    f"the orchestrator at {address} did not answer in {wait_s:g} s "
                    f"(--wait-rack); last: {why}"
                ) from None
            if not waited:
                say(f"waiting up to {wait_s:g} s for the orchestrator at {address} ({why})")
                waited = True
            pause(min(pause_s, left))
            pause_s = min(pause_s * 2, REACH_PAUSES_S[1])
            continue
        if waited:
            say(f"the orchestrator at {address} answered after {clock() - start:.1f} s")
        return rack


def _quiet(line: str) -> None:
    """Say nothing (a RackModel's default: its caller may tell it whom to tell)."""


class RackModel:
    """One model of the endpoint on the rack's sockets: an executor of its engine.
    `hold_timeout_s`, `say` (a line when its job waits) and `patient` (`hold`) may be
    set after it is built: `rdu serve --wait-rack` gives its hold the rest of its wait."""

    def __init__(
        self,
        channel: grpc.Channel,
        platform: str,
        pricer: Pricer,
        scheduler: Scheduler,
        hold_timeout_s: float = HOLD_TIMEOUT_S,
        say: Callable[[str], None] = _quiet,
    ) -> None:
        self.jobs = job_pb2_grpc.JobServiceStub(channel)
        self.platform = platform
        self.pricer = pricer
        self.scheduler = scheduler
        self.hold_timeout_s = hold_timeout_s
        self.say = say
        self.patient = False
        self.job_id: str | None = None

    @property
    def model(self) -> str:
        return self.pricer.model.name

    def hold(self) -> str:
        """Submit the model's endpoint job and wait until it runs; its id. `patient`:
        while the orchestrator does not answer (restarting), ask again until the hold's
        bound (the endpoint's start, `rdu serve --wait-rack`)."""
        return self._hold(self.patient)

    def _hold(self, patient: bool) -> str:
        # An idempotency key: a submission sent again after its answer was lost is the
        # same job, not a second one holding sockets no one releases.
        bundle = self.pricer.bundle
        spec = job_pb2.JobSpec(
            name=f"rdu serve {self.model}",
            platform=self.platform,
            endpoint=job_pb2.EndpointJob(
                model=self.model,
                num_sockets=self.pricer.sockets,
                bundle=bundle_to_proto(None if bundle is None else bundle.layout),
            ),
            client_request_id=uuid.uuid4().hex,
        )
        submitted = time.monotonic()
        deadline = submitted + self.hold_timeout_s
        ask = functools.partial(self._answered, deadline if patient else submitted)
        submit = functools.partial(
            self.jobs.SubmitJob, job_pb2.SubmitJobRequest(spec=spec), timeout=PASS_TIMEOUT_S
        )
        job = ask(submit).job
        said = False
        while job.state != common_pb2.JOB_STATE_RUNNING:
            if not said and time.monotonic() - submitted > SAY_AFTER_S:
                # A rack whose nodes are still starting, or other jobs on the sockets.
                self.say(
                    f"{self.model}: endpoint job {job.id} is "
                    f"{common_pb2.JobState.Name(job.state).removeprefix('JOB_STATE_').lower()}; "
                    "waiting up to "
                    f"{self.hold_timeout_s:.0f} s for its {self.pricer.sockets} socket(s)"
                )
                said = True
            if job.state in TERMINAL:
                why = job.error_message or common_pb2.JobState.Name(job.state)
                raise Unavailable(f"{self.model}: its endpoint job {job.id} ended: {why}")
            if time.monotonic() > deadline:
                self.release(job.id)
                raise Unavailable(
                    f"{self.model}: its endpoint job {job.id} waited {self.hold_timeout_s:.0f} s "
                    f"for {self.pricer.sockets} sockets; are other jobs holding them?"
                )
            job = ask(functools.partial(self._next_state, job.id))
        self.job_id = job.id
        return job.id

    def _answered(self, deadline: float, call: Callable[[], T]) -> T:
        """`call()`, asked again while the orchestrator does not answer, until `deadline`
        (monotonic s); saying so once."""
        said = False
        while True:
            try:
                return call()
            except grpc.RpcError as e:
                code = e.code() if isinstance(e, grpc.Call) else None
                if code not in NOT_YET or time.monotonic() + HOLD_RETRY_S > deadline:
                    raise
                if not said:
                    left = deadline - time.monotonic()
                    name = code.name if code else "error"
                    self.say(
                        f"{self.model}: the orchestrator did not answer ({name}); asking "
                        f"again for up to {left:.0f} s"
                    )
                    said = True
            time.sleep(HOLD_RETRY_S)

    def _next_state(self, job_id: str) -> job_pb2.Job:
        """The job as it is a short wait from now."""
        time.sleep(HOLD_POLL_S)
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
            # Impatient: a rack that does not answer is a 503 at once, not a wait.
            request.job_id = self.job_id or self._hold(False)
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
