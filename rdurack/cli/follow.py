"""Following jobs as they run: progress bars fed by WatchJob streams, one job until it
ends (`rdu watch`, `--wait`) or many at once (`rdu demo`), and how an ended job is said."""

from __future__ import annotations

import sys
import threading
from typing import NoReturn

import grpc
import typer
from rich.console import Console
from rich.progress import (
    BarColumn,
    Progress,
    SpinnerColumn,
    TaskID,
    TaskProgressColumn,
    TextColumn,
    TimeElapsedColumn,
)

from rdurack.cli.views import show_job, state_name
from rdurack.client.connection import details
from rdurack.client.jobs import JobClient, ended
from rdurack.v1 import job_pb2


def progress(console: Console, show: bool = True) -> Progress:
    return Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        TaskProgressColumn(),
        TimeElapsedColumn(),
        console=console,
        disable=not show,
    )


def follow(jobs: JobClient, job_id: str, timeout_s: float, bars: Progress, task: TaskID) -> bool:
    """Feed one job's events into its progress bar until the job ends; False if
    `timeout_s` passed first."""

    def show(event: job_pb2.JobEvent) -> None:
        kind = event.WhichOneof("event")
        if kind == "state_change":
            state = state_name(event.state_change.to_state)
            bars.update(task, description=f"{job_id} {state}")
            if state == "SUCCEEDED":
                bars.update(task, completed=1.0)
        elif kind == "progress":
            message = event.progress.message
            bars.update(
                task,
                completed=event.progress.fraction,
                description=f"{job_id} {message}" if message else None,
            )

    return jobs.follow(job_id, timeout_s, show)


def watch(jobs: JobClient, job_id: str, timeout_s: float, show: bool) -> job_pb2.Job:
    """Follow a job until it ends (a progress bar on stderr when `show`); the job. Exit 1
    if it has not ended after `timeout_s`."""
    with progress(Console(stderr=True), show) as bars:
        done = follow(jobs, job_id, timeout_s, bars, bars.add_task(job_id, total=1.0))
    job = jobs.get(job_id)
    if not done and not ended(job):
        fail(
            f"job {job_id} is still {state_name(job.state)} after {timeout_s:g} s; "
            f"rdu watch {job_id} follows it further",
            1,
        )
    return job


def follow_all(jobs: JobClient, ids: list[str], timeout_s: float, console: Console) -> None:
    """One progress bar per job, each fed by its own WatchJob stream in a thread."""
    errors: list[str] = []
    with progress(console) as bars:

        def one(job_id: str, task: TaskID) -> None:
            try:
                if not follow(jobs, job_id, timeout_s, bars, task):
                    errors.append(f"{job_id} did not end within {timeout_s:g} s")
            except grpc.RpcError as e:
                errors.append(f"watching {job_id}: {details(e)}")

        threads = [
            threading.Thread(target=one, args=(i, bars.add_task(i, total=1.0)), daemon=True)
            for i in ids
        ]
        for t in threads:
            t.start()
        for t in threads:
            while t.is_alive():  # joined in slices: Ctrl-C still reaches this thread
                t.join(0.2)
    for e in errors:
        console.print(f"[yellow]{e}[/]")


def show_ended(job: job_pb2.Job, as_json: bool) -> None:
    """Print a finished job; exit 1 (saying why) unless it SUCCEEDED."""
    show_job(job, as_json)
    state = state_name(job.state)
    if state != "SUCCEEDED":
        fail(f"job {job.id} {state}: {job.error_message or 'no reason given'}", 1)


def fail(message: str, code: int) -> NoReturn:
    print(f"rdu: {message}", file=sys.stderr)
    raise typer.Exit(code)
