"""The Python client's training entry points: your own script or function on the rack.

    from rdurack.client.training import run_script, run_training_loop

    job = run_script("train.py", world_size=16, script_args=["--epochs", "6"])

    def loop(ctx):                      # runs once per rank, in its socket actor
        import torch, torch.distributed as dist
        dist.init_process_group("rdu")  # torch's own, over the rack's links
        x = torch.full((4,), float(ctx.rank))
        dist.all_reduce(x)
        return x.tolist()

    results = run_training_loop(loop, world_size=4)    # one return value per rank

A script runs as torchrun runs it (docs/training.md, "Bring your own script"); a
function runs the same way, like Ray Train's `train_loop_per_worker`: it travels pickled
by value (cloudpickle) inside the job spec, through the orchestrator, which
gang-schedules its ranks like any training job. The rack runs them: whoever may submit
jobs may run code there, so expose JobService only to people you would give a shell.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
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
    job = _run(spec, Target(address, token, tls), timeout_s)
    return [cloudpickle.loads(r) for r in job.result.training.loop_results]


def run_script(
    path: str | Path,
    *,
    world_size: int,
    script_args: Sequence[str] = (),
    address: str = DEFAULT_ADDRESS,
    platform: str = "",
    wall_timeout_s: float = 60.0,
    timeout_s: float = 3600.0,
    name: str = "",
    token: str | None = None,
    tls: TlsConfig | None = None,
) -> job_pb2.Job:
    """Run the torchrun-style script at `path` on `world_size` ranks (one socket each)
    with `script_args`, as `rdu submit train --script` does; the finished job (its id,
    result; its ranks' output: `JobClient.logs`). Raises RdurackError with the job's
    error if it does not succeed."""
    path = Path(path)
    source = path.read_bytes()
    if len(source) > MAX_LOOP_BYTES:
        raise RdurackError(f"{path}: {len(source):,} bytes (limit {MAX_LOOP_BYTES:,})")
    spec = job_pb2.JobSpec(
        name=name or path.name,
        platform=platform,
        payload_mode=common_pb2.PAYLOAD_MODE_FUNCTIONAL,
        training=job_pb2.TrainingJob(
            world_size=world_size, script=source, script_name=path.name,
            script_args=list(script_args), wall_timeout_s=wall_timeout_s,
        ),
    )  # fmt: skip
    return _run(spec, Target(address, token, tls), timeout_s)


def _run(spec: job_pb2.JobSpec, target: Target, timeout_s: float) -> job_pb2.Job:
    """Submit `spec`, follow it to its end (at most `timeout_s`), and return it; raise
    RdurackError with its error unless it succeeded."""
    with target.channel() as ch:
        jobs = JobClient(ch)
        job = jobs.submit(spec).job
        for _ in jobs.watch(job.id, timeout_s):
            pass  # until the job ends
        job = jobs.get(job.id)
    if job.state != common_pb2.JOB_STATE_SUCCEEDED:
        state = common_pb2.JobState.Name(job.state).removeprefix("JOB_STATE_")
        raise RdurackError(f"job {job.id} {state}: {job.error_message or 'no reason given'}")
    return job
