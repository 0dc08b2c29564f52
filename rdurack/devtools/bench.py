"""`make bench`: every benchmark figure, printed as a table and written to JSON.

Each benchmark returns figures (bench_figure.py): a value, its unit, its floor measured
in the same run where it has one (docs/benchmarks.md), the ratio value / floor, the
target, what it holds and which way is better. Where a figure has a floor its target
holds the ratio, unless it is an issue's absolute bound; else the value. build/bench.json
keeps, for each, `{"name", "value", "unit", "floor", "ratio", "target", "holds",
"better"}`. A figure that misses its target is reported, and the run
still succeeds; the run fails only when a benchmark cannot run at all. Later work adds
its benchmarks to BENCHMARKS.
"""

from __future__ import annotations

import argparse
import json
import sys
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path

from rich.console import Console
from rich.table import Table

from rdurack.devtools.bench_control import bench_control
from rdurack.devtools.bench_endpoint import bench_endpoint
from rdurack.devtools.bench_figure import BenchFigure
from rdurack.devtools.bench_predictor import bench_predictor_speed, bench_serving_engine
from rdurack.devtools.bench_rack import bench_rack
from rdurack.devtools.bench_racks import bench_racks
from rdurack.devtools.bench_serve import bench_serve
from rdurack.devtools.bench_submit import bench_submit
from rdurack.devtools.bench_torch import bench_torch
from rdurack.devtools.bench_training import bench_progressive
from rdurack.errors import RdurackError
from rdurack.workloads.paper.study import PaperStudy

Benchmark = Callable[[], list[BenchFigure]]


def bench_paper_fidelity() -> list[BenchFigure]:
    """How many published figures the one parameter set reproduces, and the largest
    error among value figures."""
    figures = PaperStudy().figures()
    errors = [abs(f.error) for f in figures if f.error is not None]
    return [
        BenchFigure(
            "paper figures reproduced",
            sum(f.ok for f in figures),
            "figures",
            float(len(figures)),
            "higher",
        ),
        BenchFigure("paper value figures, largest |error|", 100 * max(errors), "%", 15.0, "lower"),
    ]


BENCHMARKS: list[tuple[str, Benchmark]] = [
    ("predictor speed", bench_predictor_speed),
    ("rdu predict serve: one answer, in process and as a process", bench_serve),
    ("rdu serve: requests per second, and pacing under 32 streams", bench_endpoint),
    ("CoE serving engine on the predictor", bench_serving_engine),
    ("paper fidelity", bench_paper_fidelity),
    ("rack: 2 node agents x 8 socket actors", bench_rack),
    ("two racks (rdu up --racks 2): 4 node agents x 8 socket actors", bench_racks),
    ("a torch DDP script on 16 sockets, beside gloo on 16 local processes", bench_torch),
    ("control plane: SubmitJob and WatchJob beside their floors, both stores", bench_submit),
    ("control plane: rdu up, SubmitJob from 50 clients, scheduling", bench_control),
    ("progressive training (ProFL), default configuration", bench_progressive),
]


def table(figures: list[BenchFigure]) -> Table:
    """The figures as `make bench` prints them: each beside its floor and the ratio, and
    the target on what it holds (bench_figure.py)."""
    out = Table(title="rdurack benchmarks (floor: measured in the same run)")
    for col in ("figure", "value", "unit", "floor", "ratio", "target", ""):
        out.add_column(col)
    for f in figures:
        floor = "—" if f.floor is None else f"{f.floor:,.4g}"
        ratio = "" if f.ratio is None else f"{f.ratio:.2f}"
        sign = "≤" if f.better == "lower" else "≥"
        if f.target is None:
            target = "—"
        elif f.holds == "ratio":
            target = f"ratio {sign} {f.target:g}"
        else:
            target = f"{sign} {f.target:g} {f.unit}"
        verdict = {None: "", True: "[green]met[/]", False: "[red]missed[/]"}[f.met]
        out.add_row(f.name, f"{f.value:,.4g}", f.unit, floor, ratio, target, verdict)
    return out


def selected(only: Sequence[str]) -> list[tuple[str, Benchmark]]:
    """The benchmarks whose label contains any of `only` (case-insensitive); all when
    `only` is empty. Raises RdurackError, listing the labels, when none matches."""
    if not only:
        return BENCHMARKS
    chosen = [
        (label, b) for label, b in BENCHMARKS if any(o.lower() in label.lower() for o in only)
    ]
    if not chosen:
        labels = "; ".join(label for label, _ in BENCHMARKS)
        raise RdurackError(f"no benchmark's name contains {', '.join(only)!r}; they are: {labels}")
    return chosen


def run(out: Path, only: Sequence[str] = ()) -> int:
    """Run the benchmarks (those `selected(only)`), print the table, write `out`: 0, or
    1 when a benchmark could not run."""
    benchmarks = selected(only)
    console = Console()
    if not console.is_terminal:  # a log: wide enough for the figures' names, unwrapped
        console = Console(width=220)
    figures: list[BenchFigure] = []
    failed: list[str] = []
    for label, bench in benchmarks:
        console.print(f"[bold]bench:[/] {label} ...")
        try:
            figures += bench()
        except Exception:  # a benchmark that cannot run fails the run, after the others
            failed.append(label)
            console.print(f"[red]bench {label} could not run:[/]\n{traceback.format_exc()}")
    console.print(table(figures))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps([f.to_json() for f in figures], indent=2) + "\n")
    console.print(f"wrote {out}")
    if failed:
        console.print(f"[red]benchmarks that could not run: {', '.join(failed)}[/]")
        return 1
    return 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=Path("build/bench.json"))
    parser.add_argument(
        "--only",
        action="append",
        default=[],
        metavar="TEXT",
        help="run only the benchmarks whose name contains TEXT (repeatable)",
    )
    args = parser.parse_args()
    try:
        sys.exit(run(args.out, args.only))
    except RdurackError as e:
        parser.exit(2, f"bench: {e}\n")


if __name__ == "__main__":
    main()
