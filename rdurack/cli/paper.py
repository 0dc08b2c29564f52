"""`rdu bench paper` and `rdu calibrate`: the published figures beside the predicted
ones (in sample and left out of the fit), each figure's sensitivity to each assumption,
and the joint calibration that chooses the unpublished assumptions.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from rdurack.cli.options import JsonOpt, MarkdownOpt
from rdurack.errors import InvalidRequest
from rdurack.rack.calibration import ASSUMPTIONS, CALIBRATION_FILE, fitted_values
from rdurack.rack.kernels import FusionPlan
from rdurack.workloads.calibration import record
from rdurack.workloads.calibration.fit import (
    Movement,
    Objective,
    Prediction,
    fit,
    leave_one_out,
    sensitivity,
    starts,
    to_unit,
)
from rdurack.workloads.paper.figure import Figure, cell, percent, to_markdown
from rdurack.workloads.paper.study import PaperStudy
from rdurack.workloads.paper.table_v import TABLE_V_DECODE_PLAN

# A figure moves "noticeably" with an assumption when it changes by more than this
# across the assumption's range (the tables list only those).
MOVES = 0.02


def _figures() -> list[Figure]:
    return record.with_left_out(PaperStudy().figures(), record.read())


def bench_paper_cmd(
    as_json: JsonOpt = False,
    markdown: MarkdownOpt = False,
    plot: Annotated[
        Path | None,
        typer.Option("--plot", help="also draw published against predicted: DIR/paper-figures.png"),
    ] = None,
    show_sensitivity: Annotated[
        bool,
        typer.Option(
            "--sensitivity",
            help="instead: how each fitted figure moves when each assumption moves across "
            "its range",
        ),
    ] = False,
) -> None:
    """Each published figure beside the predicted one and its error, in sample and left
    out of the fit."""
    if show_sensitivity:
        _sensitivity(as_json)
        return
    figures = _figures()
    if plot is not None:
        from rdurack.traces.plots.paper import plot_paper

        drawn = plot_paper(figures, plot / "paper-figures.png")
        # stderr: --json and --markdown keep stdout to the table alone.
        print(f"wrote {drawn}", file=sys.stderr)
    if as_json:
        print(json.dumps([f.to_dict() for f in figures]))
        return
    if markdown:
        print(to_markdown(figures), end="")
        return
    table = Table(title="Published figures, predicted from one parameter set")
    for col in ("figure", "source", "published", "predicted", "error", ""):
        table.add_column(col)
    for col in ("left out", "error", ""):
        table.add_column(col)
    for f in figures:
        table.add_row(
            f.what + (f" ({f.unit})" if f.unit else ""),
            f.source,
            cell(f.published),
            cell(f.predicted),
            percent(f.error),
            _verdict(f.ok),
            cell(f.left_out),
            percent(f.left_out_error),
            "" if f.left_out_ok is None else _verdict(f.left_out_ok),
        )
    console = Console()
    console.print(table)
    ok = sum(f.ok for f in figures)
    left = [f for f in figures if f.left_out_ok is not None]
    console.print(
        f"{ok} of {len(figures)} figures reproduced in sample (values within ±10%, ranges "
        f"inside the published range); {sum(bool(f.left_out_ok) for f in left)} of "
        f"{len(left)} fitted figures left out of the fit (values within ±20%). 'left "
        "out': predicted by the joint fit done without that figure (rdu calibrate)."
    )


def _verdict(ok: bool) -> str:
    return "[green]ok[/]" if ok else "[red]MISS[/]"


def _sensitivity(as_json: bool) -> None:
    values = fitted_values()
    moves = sensitivity(values)
    now = {f.key: f.predicted for f in Objective().figures(values)}
    if as_json:
        print(json.dumps({a: {k: list(m) for k, m in f.items()} for a, f in moves.items()}))
        return
    console = Console()
    for a in ASSUMPTIONS:
        rows = [(k, m) for k, m in moves[a.name].items() if _moved(now[k], m) > MOVES]
        table = Table(title=f"{a.name} from {a.low:.4g} to {a.high:.4g} {a.unit}".rstrip())
        for col in ("figure", "at low", "now", "at high"):
            table.add_column(col)
        for key, (low, high) in sorted(rows, key=lambda r: -_moved(now[r[0]], r[1])):
            table.add_row(key, cell(low), cell(now[key]), cell(high))
        if not rows:
            table.add_row(f"(no fitted figure moves by more than {MOVES:.0%})", "", "", "")
        console.print(table)


def _moved(now: object, movement: Movement) -> float:
    """The largest relative change of a figure (either end of a range) across one
    assumption's range."""
    points = [p if isinstance(p, tuple) else (p,) for p in (now, *movement)]
    base, *ends = points
    return float(max(abs(e / b - 1) for end in ends for e, b in zip(end, base, strict=True)))


def calibrate_cmd(
    write: Annotated[
        bool, typer.Option("--write", help=f"write the result to {CALIBRATION_FILE.name}")
    ] = False,
    random_starts: Annotated[
        int, typer.Option(min=0, max=100, help="random starts besides two fixed ones")
    ] = 6,
    seed: Annotated[int, typer.Option(min=0, help="the random starts' seed")] = 0,
    table_v_plan: Annotated[
        FusionPlan,
        typer.Option(
            "--table-v-decode-plan",
            help="what-if: the SN40L's decode in PAPER Table V (never written)",
        ),
    ] = TABLE_V_DECODE_PLAN,
    left_out: Annotated[
        bool,
        typer.Option(
            "--leave-one-out/--no-leave-one-out",
            help="also fit without each figure in turn (most of the time; --write needs it)",
        ),
    ] = True,
    as_json: JsonOpt = False,
) -> None:
    """Fit every unpublished assumption jointly against the fitted published figures,
    then predict each of those figures with the fit done without it (leave-one-out).
    Minutes of work: progress goes to stderr."""
    if write and (table_v_plan != TABLE_V_DECODE_PLAN or not left_out):
        raise InvalidRequest(
            f"--write records the calibration the presets use: Table V decoded "
            f"{TABLE_V_DECODE_PLAN.value}, with its leave-one-out predictions; "
            "drop --table-v-decode-plan and --no-leave-one-out, or --write"
        )
    err = Console(stderr=True)
    err.print(f"fitting {len(ASSUMPTIONS)} assumptions from {random_starts + 2} starts")
    objective = Objective(table_v_plan)
    full = fit(objective, starts(fitted_values(), random_starts, seed), progress=err.print)
    left: dict[str, Prediction] = {}
    if left_out:
        err.print("leaving each fitted figure out in turn")
        left = leave_one_out(objective, full, progress=err.print)
    figures = objective.study(full.values).figures()
    result = record.Calibration(
        seed=seed,
        random_starts=random_starts,
        cost=full.cost,
        values=full.values,
        in_sample={
            f.key: f.predicted for f in figures if f.fitted and not isinstance(f.predicted, bool)
        },
        leave_one_out=left,
    )
    if write:
        err.print(f"wrote {record.write(result)}")
    if as_json:
        print(result.model_dump_json())
        return
    table = Table(title=f"Fitted assumptions (cost {full.cost:.4g})")
    for col in ("assumption", "low", "value", "high", ""):
        table.add_column(col)
    for a in ASSUMPTIONS:
        u = to_unit(a, full.values[a.name])
        edge = "at its bound" if min(u, 1 - u) < 1e-3 else ""
        table.add_row(a.name, f"{a.low:.4g}", f"{full.values[a.name]:.4g}", f"{a.high:.4g}", edge)
    Console().print(table)


def bench_assumptions_cmd(as_json: JsonOpt = False, markdown: MarkdownOpt = False) -> None:
    """Every unpublished assumption: where it goes, its allowed range and why, and the
    value the joint calibration chose."""
    values = fitted_values()
    rows = [
        {
            "assumption": a.name,
            "sets": f"{a.field} of {', '.join(a.platforms)}" if a.platforms else "a study",
            "low": a.low,
            "value": values[a.name],
            "high": a.high,
            "unit": a.unit,
            "reason": a.reason,
        }
        for a in ASSUMPTIONS
    ]
    if as_json:
        print(json.dumps(rows))
        return
    if markdown:
        print("| assumption | sets | range | fitted | why this range |\n|---|---|---|---|---|")
        for r in rows:
            unit = f" {r['unit']}" if r["unit"] else ""
            print(
                f"| `{r['assumption']}` | {r['sets']} | {r['low']:.4g} – {r['high']:.4g}{unit} "
                f"| {r['value']:.4g} | {r['reason']} |"
            )
        return
    table = Table(title="Unpublished assumptions, their ranges and fitted values")
    for col in ("assumption", "low", "fitted", "high", "unit", "why this range"):
        table.add_column(col)
    for r in rows:
        table.add_row(
            str(r["assumption"]),
            f"{r['low']:.4g}",
            f"{r['value']:.4g}",
            f"{r['high']:.4g}",
            str(r["unit"]),
            str(r["reason"]),
        )
    Console().print(table)
