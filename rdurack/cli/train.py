"""`rdu submit train`: DDP training on the rack, the built-in jobs or your own script."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Annotated

import typer

from rdurack.cli.jobs import JobIdArg, payload_mode, submit_and_follow
from rdurack.cli.options import WATCH_TIMEOUT_S, JsonOpt, NameOpt, TimeoutOpt, WaitOpt
from rdurack.client.connection import Target
from rdurack.client.jobs import JobClient
from rdurack.errors import InvalidRequest
from rdurack.v1 import job_pb2
from rdurack.workloads.training.job import BUILT_IN_MODELS, MAX_LOOP_BYTES


def submit_train_cmd(
    world_size: Annotated[
        int, typer.Option(min=1, help="ranks, one socket each (at most the rack's sockets)")
    ] = 4,
    model: Annotated[
        str, typer.Option(help="mlp or transformer (numpy, real data), or a preset (timed)")
    ] = "mlp",
    dataset: Annotated[str, typer.Option(help="digits or synthetic")] = "digits",
    epochs: Annotated[int | None, typer.Option(min=1)] = None,
    steps: Annotated[int | None, typer.Option(min=1)] = None,
    global_batch: Annotated[int, typer.Option(min=1, help="samples per step, all ranks")] = 64,
    optimizer: Annotated[str, typer.Option(help="sgd or adam")] = "sgd",
    lr: Annotated[float, typer.Option(min=0.0)] = 0.1,
    seed: Annotated[int, typer.Option(min=0)] = 0,
    checkpoint_every: Annotated[int, typer.Option(min=0, help="steps; 0: none")] = 0,
    timeout_s: Annotated[
        float | None, typer.Option(help="how late a rank may be at a collective, emulated s")
    ] = None,
    no_broadcast: Annotated[
        bool, typer.Option("--no-broadcast", help="the article's mistake: no broadcast")
    ] = False,
    no_sampler: Annotated[
        bool, typer.Option("--no-sampler", help="the article's mistake: no DistributedSampler")
    ] = False,
    hidden: Annotated[int, typer.Option(min=1, help="the built-in model's hidden width")] = 64,
    blocks: Annotated[
        int, typer.Option(min=1, help="the mlp's hidden layers (progressive: its blocks)")
    ] = 1,
    strategy: Annotated[
        str, typer.Option(help="full, or progressive (ProFL: block by block, mlp only)")
    ] = "full",
    hbm_cap_bytes: Annotated[
        int, typer.Option(min=0, help="the job's HBM per socket, bytes; 0: the socket's")
    ] = 0,
    freeze_window: Annotated[
        int | None, typer.Option(min=2, help="progressive: steps per movement window (25)")
    ] = None,
    freeze_threshold: Annotated[
        float | None,
        typer.Option(min=0.0, max=1.0, help="progressive: freeze below this movement (0.45)"),
    ] = None,
    platform: Annotated[str, typer.Option(help="the rack's own, or dgx-a100 / dgx-h100")] = "",
    script: Annotated[
        Path | None,
        typer.Option(
            help="a torchrun-style PyTorch script, run once per rank (docs/training.md); "
            "the model, data and batch options then do not apply"
        ),
    ] = None,
    script_args: Annotated[
        str, typer.Option(help='the script\'s arguments, as a shell would split them: "--lr 0.1"')
    ] = "",
    run_timeout_s: Annotated[
        float | None, typer.Option(min=1.0, help="wall seconds the script may run (3600)")
    ] = None,
    fusion_plan: Annotated[
        str,
        typer.Option(
            help="unfused, fused-so or fused-ho; default the platform's (SN40L: fused-ho)"
        ),
    ] = "",
    name: NameOpt = "",
    wait: WaitOpt = False,
    timeout: TimeoutOpt = WATCH_TIMEOUT_S,
    *,
    to: Target,
    as_json: JsonOpt = False,
) -> None:
    """Data-parallel training, torch DDP semantics: one rank per socket, gradients
    all-reduced over the links; with --wait a progress bar, then a summary."""
    training = job_pb2.TrainingJob(
        model=model,
        world_size=world_size,
        dataset=dataset,
        epochs=epochs or 0,
        steps=steps or 0,
        global_batch=global_batch,
        optimizer=optimizer,
        learning_rate=lr,
        seed=seed,
        checkpoint_every=checkpoint_every,
        timeout_s=timeout_s or 0.0,
        sampler="none" if no_sampler else "distributed",
        strategy=strategy,
        hidden=hidden,
        blocks=blocks,
        hbm_cap_bytes=hbm_cap_bytes,
        freeze_window=freeze_window or 0,
        freeze_threshold=freeze_threshold or 0.0,
        fusion_plan=fusion_plan,
    )
    if no_broadcast:
        training.broadcast_parameters = False
    functional = model in BUILT_IN_MODELS  # a built-in model trains on real data
    if script is not None:
        training = script_job(script, script_args, world_size, timeout_s, run_timeout_s)
        training.fusion_plan = fusion_plan
        functional = True  # the script computes
    spec = job_pb2.JobSpec(
        name=name, platform=platform, training=training, payload_mode=payload_mode(functional)
    )
    submit_and_follow(spec, to, wait=wait, timeout_s=timeout, as_json=as_json)


def script_job(
    path: Path,
    args: str,
    world_size: int,
    timeout_s: float | None,
    run_timeout_s: float | None,
) -> job_pb2.TrainingJob:
    """A script job of the file at `path` (its content travels with the job)."""
    try:
        source = path.read_bytes()
    except OSError as e:
        raise InvalidRequest(f"--script {path}: {e.strerror or e}") from None
    if len(source) > MAX_LOOP_BYTES:
        raise InvalidRequest(
            f"--script {path}: {len(source):,} bytes (limit {MAX_LOOP_BYTES:,}): keep data "
            "out of the script and read it from where the ranks can"
        )
    try:
        argv = shlex.split(args)
    except ValueError as e:
        raise InvalidRequest(f"--script-args: {e}") from None
    return job_pb2.TrainingJob(
        world_size=world_size, script=source, script_name=path.name, script_args=argv,
        timeout_s=timeout_s or 0.0, run_timeout_s=run_timeout_s or 0.0,
    )  # fmt: skip


def logs_cmd(
    job_id: JobIdArg,
    rank: Annotated[int | None, typer.Option(min=0, help="only this rank's log")] = None,
    *,
    to: Target,
    as_json: JsonOpt = False,
) -> None:
    """What a script job's ranks printed (stdout and stderr), rank by rank."""
    with to.channel() as ch:
        logs = JobClient(ch).logs(job_id, rank)
    if as_json:
        print(
            json.dumps([{"rank": g.rank, "text": g.text, "truncated": g.truncated} for g in logs])
        )
        return
    for g in logs:
        if rank is None:
            print(f"== rank {g.rank} ==")
        if g.truncated:
            print("(... only its last MiB)")
        print(g.text, end="" if g.text.endswith("\n") or not g.text else "\n")
