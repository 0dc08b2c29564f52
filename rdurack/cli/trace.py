"""`rdu trace` and `rdu plot`: one job's trace and pictures, from the trace files.

They need no running rack: the processes of a rack that `rdu up` started write their
spans to `STATE_DIR/traces` (RDURACK_TRACE_DIR), and these commands read them, during
the run or after `rdu down`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from rdurack.cli.options import JsonOpt, StateDirOpt
from rdurack.errors import RdurackError
from rdurack.processes import local_rack

TraceDirOpt = Annotated[
    Path | None,
    typer.Option(
        "--trace-dir",
        envvar="RDURACK_TRACE_DIR",
        help="the trace files' directory (default: STATE_DIR/traces, where rdu up puts them)",
    ),
]
OutOpt = Annotated[Path, typer.Option("--out", help="directory to write into (created)")]


def _trace_dir(trace_dir: Path | None, state_dir: Path) -> Path:
    return trace_dir if trace_dir is not None else local_rack.trace_dir(state_dir)


def trace_cmd(
    job_id: Annotated[str, typer.Argument(help="the job's id (rdu jobs lists them)")],
    out: OutOpt,
    trace_dir: TraceDirOpt = None,
    state_dir: StateDirOpt = Path(".state"),
    as_json: JsonOpt = False,
) -> None:
    """Write a job's trace as Jaeger trace JSON (for the Jaeger UI's JSON-file upload)
    and as a Chrome/Perfetto trace (ui.perfetto.dev)."""
    from rdurack.traces.export import write_trace

    written = write_trace(job_id, _trace_dir(trace_dir, state_dir), out)
    summary: dict[str, Any] = {
        "job_id": job_id,
        "jaeger": str(written.jaeger),
        "chrome": str(written.chrome),
        "spans": written.spans,
        "services": written.services,
        "sockets": written.sockets,
        "missing_parents": written.missing_parents,
        "unreadable_lines": written.bad_lines,
    }
    if as_json:
        print(json.dumps(summary))
        return
    print(f"{written.jaeger}  (Jaeger UI: Search, 'Upload' JSON File)")
    print(f"{written.chrome}  (ui.perfetto.dev or chrome://tracing: open the file)")
    print(
        f"job {job_id}: {written.spans} spans from {written.services} services "
        f"({written.sockets} sockets)"
    )
    if written.missing_parents:
        print(
            f"warning: {written.missing_parents} spans' parents are not in the files "
            "(a process ended without flushing); Jaeger shows them under the trace root"
        )
    if written.bad_lines:
        print(f"warning: {written.bad_lines} unreadable lines skipped (a torn last line)")


def plot_cmd(
    job_id: Annotated[str, typer.Argument(help="the job's id (rdu jobs lists them)")],
    out: OutOpt,
    trace_dir: TraceDirOpt = None,
    state_dir: StateDirOpt = Path(".state"),
    result: Annotated[
        Path | None,
        typer.Option(
            "--result",
            help=(
                "the job as `rdu job ID --json` printed it: a training job's losses and "
                "stages, when its trace has none"
            ),
        ),
    ] = None,
) -> None:
    """PNGs of a job: its sockets' emulated timeline (a Gantt chart), memory used per
    tier over emulated time, and for training the loss curve and the peak memory and
    accuracy of each stage, all from its trace."""
    from rdurack.traces.plotdata.training import (
        loss_points,
        result_stage_points,
        span_loss_points,
        stage_points,
    )
    from rdurack.traces.plots.memory import plot_memory
    from rdurack.traces.plots.timeline import plot_timeline
    from rdurack.traces.plots.training import plot_loss, plot_stages
    from rdurack.traces.spans import job_spans

    spans, _ = job_spans(job_id, _trace_dir(trace_dir, state_dir))
    out.mkdir(parents=True, exist_ok=True)
    print(plot_timeline(spans, job_id, out / f"{job_id}-timeline.png"))
    memory = plot_memory(spans, job_id, out / f"{job_id}-memory.png")
    print(
        memory
        if memory is not None
        else f"no memory plot: the spans of job {job_id} carry no tier use (CoE deploys "
        "and expert switches, and training steps, do)"
    )
    job_result = _read_result(result)
    points, what = span_loss_points(spans), "loss (mean of the ranks' local batch losses)"
    if not points:
        points, what = loss_points(job_result), "loss (rank 0's local batch)"
    loss = plot_loss(points, job_id, out / f"{job_id}-loss.png", what)
    if loss is not None:
        print(loss)
    elif result is not None:
        print(f"no loss plot: {result} has no losses")
    stages = stage_points(spans) or result_stage_points(job_result)
    cap = int((job_result or {}).get("hbm_cap_bytes") or 0)
    figure = plot_stages(stages, job_id, out / f"{job_id}-stages.png", hbm_cap_bytes=cap)
    if figure is not None:
        print(figure)


def _read_result(path: Path | None) -> dict[str, Any] | None:
    if path is None:
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise RdurackError(f"--result {path}: cannot read it as JSON ({e})") from None
    if not isinstance(data, dict):
        raise RdurackError(f"--result {path}: not a JSON object (rdu job ID --json prints one)")
    # `rdu job --json` prints the result's fields beside the job's; a bare result works too.
    inner = data.get("result")
    return inner if isinstance(inner, dict) else data
