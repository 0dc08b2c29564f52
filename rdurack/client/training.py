"""The Python client's training entry point: run your own loop on the rack's sockets.

    from rdurack.client.training import run_training_loop

    def loop(ctx):                      # runs once per rank, in its socket actor
        dist = ctx.dist                 # torch.distributed's names, over the links
        dist.init_process_group("rdulink", world_size=ctx.world_size, rank=ctx.rank)
        x = numpy.full(4, ctx.rank, dtype=numpy.float32)
        dist.all_reduce(x)
        dist.destroy_process_group()
        return x.tolist()

    results = run_training_loop(loop, world_size=4)    # one return value per rank

Like Ray Train's `train_loop_per_worker`: the function travels pickled by value
(cloudpickle) inside the job spec, through the orchestrator, which gang-schedules its
ranks like any training job. The rack runs it: whoever may submit jobs may run code
there, so expose JobService only to people you would give a shell.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ray import cloudpickle

from rdurack.client.connection import DEFAULT_ADDRESS, Target
from rdurack.client.jobs import JobClient
from rdurack.errors import RdurackError
from rdurack.security.tls import TlsConfig
from rdurack.v1 import common_pb2, job_pb2
from rdurack.workloads.training.job import MAX_LOOP_BYTES


def run_training_loop(
    fn: Callable[[Any], Any],
    *,
    world_size: int,
    address: str = DEFAULT_ADDRESS,
    platform: str = "",
    wall_timeout_s: float = 60.0,
    timeout_s: float = 600.0,
    name: str = "client loop",
    token: str | None = None,
    tls: TlsConfig | None = None,
) -> list[Any]:
    """Run `fn(ctx)` on `world_size` ranks (one socket each) and return their return
    values by rank. Raises RdurackError with the job's error if it does not succeed.
    `token`, `tls`: a bearer token and the TLS settings (the CA) of a secured rack."""
    payload = bytes(cloudpickle.dumps(fn))  # type: ignore[no-untyped-call]
    if len(payload) > MAX_LOOP_BYTES:
        raise RdurackError(
            f"the pickled loop is {len(payload):,} bytes (limit {MAX_LOOP_BYTES:,}): load "
            "large data inside the loop instead of capturing it"
        )
    spec = job_pb2.JobSpec(
        name=name,
        platform=platform,
        payload_mode=common_pb2.PAYLOAD_MODE_FUNCTIONAL,
        training=job_pb2.TrainingJob(
            world_size=world_size, global_batch=world_size, loop=payload,
            wall_timeout_s=wall_timeout_s,
        ),
    )  # fmt: skip
    with Target(address, token, tls).channel() as ch:
        jobs = JobClient(ch)
        job = jobs.submit(spec).job
        for _ in jobs.watch(job.id, timeout_s):
            pass  # until the job ends
        job = jobs.get(job.id)
    if job.state != common_pb2.JOB_STATE_SUCCEEDED:
        state = common_pb2.JobState.Name(job.state).removeprefix("JOB_STATE_")
        raise RdurackError(f"job {job.id} {state}: {job.error_message or 'no reason given'}")
    return [cloudpickle.loads(r) for r in job.result.training.loop_results]
