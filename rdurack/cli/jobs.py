"""The job commands of `rdu`: submit a kernel job (a step, or a batch served end to end;
and, for every `rdu submit`, send a spec and follow it with --wait), watch a job, show
one, cancel one, list them."""

from __future__ import annotations

import json
import sys
from enum import StrEnum
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from rdurack.cli.follow import show_ended, watch
from rdurack.cli.options import (
    DEFAULT_OUTPUT_TOKENS,
    DEFAULT_PROMPT_TOKENS,
    WATCH_TIMEOUT_S,
    BatchSizeOpt,
    ExpertMappingOpt,
    JsonOpt,
    ModelOpt,
    NameOpt,
    TimeoutOpt,
    WaitOpt,
)
from rdurack.cli.views import (
    format_seconds,
    format_tokens,
    job_dict,
    show_job,
    state_name,
    styled_state,
)
from rdurack.client.connection import Target
from rdurack.client.jobs import JobClient
from rdurack.errors import InvalidRequest
from rdurack.orchestrator.jobs import JobState
from rdurack.rack.kernels import FusionPlan
from rdurack.v1 import common_pb2, job_pb2
from rdurack.wire.jobs import speculative_to_proto
from rdurack.workloads.serving.speculative import SpeculativeSetting

JobIdArg = Annotated[str, typer.Argument(help="a job id")]


def payload_mode(functional: bool) -> common_pb2.PayloadMode.ValueType:
    """Functional (real arrays, real results) or timing (sized descriptors only)."""
    return common_pb2.PAYLOAD_MODE_FUNCTIONAL if functional else common_pb2.PAYLOAD_MODE_TIMING


def submit_and_follow(
    spec: job_pb2.JobSpec,
    to: Target,
    *,
    wait: bool,
    timeout_s: float,
    as_json: bool,
    show_deduplicated: bool = False,
) -> None:
    """Submit; print the job id (or the job, --json: with `show_deduplicated`, whether its
    request id made it a resubmission); with `wait` follow it to its end (progress bar on
    stderr) and print it, exiting 1 unless it SUCCEEDED."""
    with to.channel() as ch:
        jobs = JobClient(ch)
        reply = jobs.submit(spec)
        job = reply.job
        if not wait:
            if not as_json:
                print(job.id)
            elif show_deduplicated:
                print(json.dumps({**job_dict(job), "deduplicated": reply.deduplicated}))
            else:
                print(json.dumps(job_dict(job)))
            return
        if not as_json:
            print(job.id, file=sys.stderr)
        show_ended(watch(jobs, job.id, timeout_s, show=not as_json), as_json)


class KernelPhase(StrEnum):
    """What a kernel job runs: one step's phase, or a whole batch of requests."""

    PREFILL = "prefill"
    DECODE = "decode"
    TRAIN = "train"
    SERVE = "serve"


def submit_kernel_cmd(
    model: ModelOpt,
    phase: Annotated[
        KernelPhase,
        typer.Option(
            help="one prefill pass, decode tokens, one train step, or serve a batch of "
            "requests (the prefill, then the decode: the figures of rdu predict serve)"
        ),
    ],
    fusion_plan: Annotated[
        FusionPlan | None,
        typer.Option(
            "--fusion-plan",
            "--plan",
            help="default: the orchestrator's (fused-ho); serve: the decode plan, default "
            "the platform's (kernel-looped on SN40L; prefill fused-ho)",
        ),
    ] = None,
    seq: Annotated[
        int | None,
        typer.Option(min=1, help="prompt length, or the decode context (default 1024); not serve"),
    ] = None,
    prompt_tokens: Annotated[
        int | None, typer.Option(min=1, help="serve: prompt length of each request (default 1024)")
    ] = None,
    batch_size: BatchSizeOpt = 1,
    sockets: Annotated[int, typer.Option(min=1, help="sockets, gang-scheduled")] = 8,
    output_tokens: Annotated[
        int | None,
        typer.Option(min=1, help="decode, serve: tokens to generate (default 1; serve 1024)"),
    ] = None,
    speculative: SpeculativeSetting | None = None,
    expert_mapping: ExpertMappingOpt = None,
    priority: Annotated[int, typer.Option(help="higher runs first")] = 0,
    name: NameOpt = "",
    request_id: Annotated[
        str, typer.Option(help="idempotency key: resubmitting returns the first job")
    ] = "",
    wait: WaitOpt = False,
    timeout: TimeoutOpt = WATCH_TIMEOUT_S,
    *,
    to: Target,
    as_json: JsonOpt = False,
) -> None:
    """A kernel job: one model's prefill, decode or train step on N sockets, or a batch
    of requests served end to end (--phase serve, with the options of rdu predict
    serve; --json has its figures)."""
    serve = phase is KernelPhase.SERVE
    if serve and seq is not None:
        raise InvalidRequest(
            "--seq is a step's prompt or context: --phase serve takes --prompt-tokens"
        )
    if not serve and prompt_tokens is not None:
        raise InvalidRequest("--prompt-tokens is for --phase serve; a step takes --seq")
    if speculative is not None and not serve:
        raise InvalidRequest("--speculative runs with --phase serve (a whole batch)")
    kernel = job_pb2.KernelJob(
        model=model,
        phase=common_pb2.Phase.Value(f"PHASE_{phase.name}"),
        sequence_length=(prompt_tokens if serve else seq) or DEFAULT_PROMPT_TOKENS,
        batch_size=batch_size,
        num_sockets=sockets,
        output_tokens=0,
        speculative=speculative_to_proto(speculative),
    )
    if phase is KernelPhase.DECODE:
        kernel.output_tokens = output_tokens or 1
    elif serve:
        kernel.output_tokens = output_tokens or DEFAULT_OUTPUT_TOKENS
    if fusion_plan is not None:
        kernel.fusion_plan = common_pb2.FusionPlan.Value(f"FUSION_PLAN_{fusion_plan.name}")
    if expert_mapping is not None:
        kernel.expert_mapping = common_pb2.ExpertMapping.Value(
            f"EXPERT_MAPPING_{expert_mapping.name}"
        )
    spec = job_pb2.JobSpec(
        name=name, priority=priority, client_request_id=request_id, kernel=kernel
    )
    submit_and_follow(
        spec, to, wait=wait, timeout_s=timeout, as_json=as_json, show_deduplicated=True
    )


def watch_cmd(
    job_id: Annotated[str, typer.Argument(help="a job id, e.g. job-000001")],
    timeout: TimeoutOpt = WATCH_TIMEOUT_S,
    *,
    to: Target,
    as_json: JsonOpt = False,
) -> None:
    """A progress bar until the job ends; exit 1 if it FAILED or was CANCELLED."""
    with to.channel() as ch:
        show_ended(watch(JobClient(ch), job_id, timeout, show=not as_json), as_json)


def job_cmd(job_id: JobIdArg, *, to: Target, as_json: JsonOpt = False) -> None:
    """One job: its state, sockets and result."""
    with to.channel() as ch:
        show_job(JobClient(ch).get(job_id), as_json)


def cancel_cmd(
    job_id: JobIdArg,
    reason: Annotated[str, typer.Option(help="recorded as the job's error")] = "cancelled by rdu",
    *,
    to: Target,
    as_json: JsonOpt = False,
) -> None:
    """Cancel a job that has not ended; its sockets are released."""
    with to.channel() as ch:
        job = JobClient(ch).cancel(job_id, reason)
    if as_json:
        print(json.dumps(job_dict(job)))
    else:
        print(f"{job.id} {state_name(job.state)}")


def jobs_cmd(
    state: Annotated[
        list[JobState] | None,
        typer.Option("--state", case_sensitive=False, help="only jobs in this state (repeatable)"),
    ] = None,
    limit: Annotated[int, typer.Option(min=1, help="at most this many jobs")] = 1000,
    *,
    to: Target,
    as_json: JsonOpt = False,
) -> None:
    """Jobs, newest first."""
    states = [common_pb2.JobState.Value(f"JOB_STATE_{s.value}") for s in state or []]
    with to.channel() as ch:
        rows = [job_dict(j) for j in JobClient(ch).list(states, limit)]
    if as_json:
        print(json.dumps({"jobs": rows}))
        return
    table = Table(title=f"jobs at {to.address}")
    for col in ("job", "name", "state", "workload", "sockets", "emulated", "tokens/s"):
        table.add_column(col, no_wrap=col in ("job", "state"))
    table.add_column("error")
    for r in rows:
        table.add_row(
            r["job_id"],
            r["name"],
            styled_state(r["state"]),
            f"{r['model']} {r['phase']}",
            ",".join(s.removeprefix("rdu-") for s in r["sockets"]) or str(r["num_sockets"]),
            format_seconds(r["emulated_s"]),
            format_tokens(r),
            r["error"] or "",
        )
    Console().print(table)
